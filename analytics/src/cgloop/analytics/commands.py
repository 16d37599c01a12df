"""`cgloop analytics …` commands."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    sub = typer.Typer(
        help="Features, cloud-gaming flow classifier, SLO and abuse detectors, streaming worker",
        no_args_is_help=True,
    )
    app.add_typer(sub, name="analytics")
