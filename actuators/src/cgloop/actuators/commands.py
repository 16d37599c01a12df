"""`cgloop actuators …` commands."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    sub = typer.Typer(
        help="Actuators: the ONOS driver and node-agent clients", no_args_is_help=True
    )
    app.add_typer(sub, name="actuators")
