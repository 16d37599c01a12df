"""cgloop.logs: CGLOOP_LOG_FORMAT=json gives one parseable JSON object per line, text (the
default) the usual line; anything else is refused naming the variable — also by a daemon's
command, before it starts."""

from __future__ import annotations

import io
import json
import logging

import pytest
from cgloop import logs
from cgloop.bus.topics import FLOWS


@pytest.fixture(autouse=True)
def _restore_root_logger():
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


def test_json_lines_parse(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(logs.FORMAT_ENV, "json")
    out = io.StringIO()
    logs.setup(stream=out)
    log = logging.getLogger("cgloop.test")
    log.warning("lag %d on %s", 5, FLOWS.name, extra={"partition": 2})
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        log.exception("failed")
    first, second = (json.loads(line) for line in out.getvalue().splitlines())
    assert first["level"] == "WARNING" and first["logger"] == "cgloop.test"
    assert first["message"] == f"lag 5 on {FLOWS.name}" and first["partition"] == 2
    assert first["time"]
    assert second["level"] == "ERROR" and "RuntimeError: boom" in second["exc_info"]


def test_text_is_the_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(logs.FORMAT_ENV, raising=False)
    out = io.StringIO()
    logs.setup(stream=out)
    logging.getLogger("cgloop.test").info("hello")
    line = out.getvalue().strip()
    assert line.endswith("INFO cgloop.test: hello")
    with pytest.raises(json.JSONDecodeError):
        json.loads(line)


def test_an_unknown_format_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(logs.FORMAT_ENV, "yaml")
    with pytest.raises(ValueError, match="CGLOOP_LOG_FORMAT='yaml' is not one of text, json"):
        logs.setup(stream=io.StringIO())


@pytest.mark.parametrize(
    ("command", "env", "words", "code"),
    [
        (("analytics", "run"), {"CGLOOP_LOG_FORMAT": "xml"}, "CGLOOP_LOG_FORMAT", 1),
        # a bad metrics address is a usage error (2), found as the options are parsed
        (
            ("policy", "run"),
            {"CGLOOP_POLICY_ENGINE_METRICS_ADDR": "nowhere"},
            "CGLOOP_POLICY_ENGINE_METRICS_ADDR",
            2,
        ),
        (("sink", "--metrics-addr", "1.2.3.4"), {}, "--metrics-addr", 2),
        (("--check-config", "store", "serve"), {"CGLOOP_STORE_METRICS_ADDR": "x"}, "STORE", 2),
    ],
)
def test_daemons_stop_at_start_naming_the_setting(run_cgloop, command, env, words, code) -> None:
    result = run_cgloop(*command, env=env, timeout=60)
    assert result.returncode == code, result.stdout + result.stderr
    assert words in result.stderr and "Traceback" not in result.stderr
