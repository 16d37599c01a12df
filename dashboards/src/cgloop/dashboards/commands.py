"""`cgloop dashboards build|check`: the NOC dashboards' JSON and the check of their queries."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import typer
from rich.console import Console

console = Console()

OutOpt = typer.Option(None, "--out", help="folder (default: dashboards/provisioned)")
CheckOnlyOpt = typer.Option(
    False, "--check", help="write nothing; exit 1 if the folder differs from the build"
)
FromOpt = typer.Option(..., "--from", help="ISO 8601 (UTC) or epoch ns")
ToOpt = typer.Option(..., "--to", help="ISO 8601 (UTC) or epoch ns")
UrlOpt = typer.Option(
    None, "--url", help="the store's ClickHouse HTTP URL [default: the running stack's store]"
)
DirOpt = typer.Option(None, "--dir", help="dashboards JSON folder")


def _ns(text: str) -> int:
    """An ISO 8601 time (UTC unless it says otherwise) or integer epoch nanoseconds."""
    if text.lstrip("-").isdigit():
        return int(text)
    try:
        t = datetime.fromisoformat(text)
    except ValueError as exc:
        raise typer.BadParameter(f"{text!r} is neither ISO 8601 nor epoch nanoseconds") from exc
    if t.tzinfo is None:
        t = t.replace(tzinfo=UTC)
    return int(t.timestamp()) * 1_000_000_000 + t.microsecond * 1_000


def register(app: typer.Typer) -> None:
    sub = typer.Typer(
        help="NOC dashboards as code: build their JSON, check their queries", no_args_is_help=True
    )
    app.add_typer(sub, name="dashboards")

    @sub.command()
    def build(out: Path | None = OutOpt, check_only: bool = CheckOnlyOpt) -> None:
        """Write the four dashboards' JSON and the alert rules for Grafana's file provisioning."""
        from cgloop.dashboards.build import PROVISIONED, render_all, write

        folder = out or PROVISIONED
        if check_only:
            stale = [
                name
                for name, text in render_all().items()
                if not (folder / name).exists() or (folder / name).read_text() != text
            ]
            for name in stale:
                console.print(f"[red]{folder / name} differs from the build[/]")
            raise typer.Exit(1 if stale else 0)
        for path in write(folder):
            console.print(f"wrote {path}")

    @sub.command()
    def check(
        time_from: str = FromOpt,
        time_to: str = ToOpt,
        url: str | None = UrlOpt,
        folder: Path | None = DirOpt,
    ) -> None:
        """Expand every panel's and alert rule's macros and variables as Grafana would and run
        them on the store (alert rules as if evaluated at --to)."""
        from cgloop.config import Settings
        from cgloop.dashboards.check import check_dashboards, check_rules

        url = url or Settings().store_http_url
        start, end = _ns(time_from), _ns(time_to)
        if end <= start:
            console.print("[red]--to must be after --from[/]")
            raise typer.Exit(2)
        try:
            problems = check_dashboards(url, start, end, folder)
            problems += check_rules(url, end, folder)
        except OSError as exc:
            console.print(f"[red]cannot reach the store at {url}: {exc}[/]")
            raise typer.Exit(2) from exc
        for p in problems:
            console.print(f"[red]{p}[/]", soft_wrap=True)
            if p.sql:
                console.print(f"  {p.sql}", soft_wrap=True, markup=False)
        if problems:
            raise typer.Exit(1)
        console.print("every panel ran and returned rows; every alert rule ran")
