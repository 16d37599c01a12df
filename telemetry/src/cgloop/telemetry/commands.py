"""`cgloop telemetry …`: one sub-app; each telemetry part adds its commands to it.

A part is a module of this package with `register(telemetry_app)`. Parts not yet built are
absent from `PARTS`'s modules and simply skipped; a part that exists but fails to import is an
error (reported by the CLI loader).
"""

from __future__ import annotations

import importlib
import importlib.util

import typer

PARTS = (
    "cgloop.telemetry.probe_cli",  # XDP flow probe, pcap twin (issue: XDP probe)
    "cgloop.telemetry.int_cli",  # INT collector and report generator (issue: INT collector)
)


def register(app: typer.Typer) -> None:
    telemetry_app = typer.Typer(help="Flow probe and INT collector.", no_args_is_help=True)
    for name in PARTS:
        if importlib.util.find_spec(name) is None:
            continue
        importlib.import_module(name).register(telemetry_app)
    app.add_typer(telemetry_app, name="telemetry")
