"""Logging set-up shared by every Python daemon: one line per record on stderr, as text (the
default) or as one JSON object per line for a log collector.

CGLOOP_LOG_FORMAT=text|json chooses; any other value stops the daemon naming the variable and
the accepted values. The JSON form comes from python-json-logger (keys: time, level, logger,
message, plus exc_info when an exception is logged and any `extra=` fields).
"""

from __future__ import annotations

import logging
import os
import sys
from typing import TextIO

from pythonjsonlogger.json import JsonFormatter

FORMAT_ENV = "CGLOOP_LOG_FORMAT"
FORMATS = ("text", "json")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def log_format() -> str:
    """The chosen format; ValueError naming CGLOOP_LOG_FORMAT for an unknown one."""
    value = os.environ.get(FORMAT_ENV, "").strip().lower() or "text"
    if value not in FORMATS:
        raise ValueError(
            f"{FORMAT_ENV}={os.environ[FORMAT_ENV]!r} is not one of {', '.join(FORMATS)}"
        )
    return value


def formatter(kind: str) -> logging.Formatter:
    if kind == "json":
        return JsonFormatter(
            "%(asctime)s %(levelname)s %(name)s %(message)s",
            rename_fields={"asctime": "time", "levelname": "level", "name": "logger"},
            timestamp=False,
        )
    return logging.Formatter(TEXT_FORMAT)


def setup(level: int = logging.INFO, stream: TextIO | None = None) -> None:
    """Configure the root logger once per process (replacing earlier handlers, as a daemon's
    start must win over whatever an import set up)."""
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(formatter(log_format()))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)
