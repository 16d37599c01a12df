"""`cgloop policy …` commands."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    sub = typer.Typer(
        help="Policy engine: policies, guards, verification, rollback, planners",
        no_args_is_help=True,
    )
    app.add_typer(sub, name="policy")
