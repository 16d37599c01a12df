"""`cgloop up | down | status`: the embedded stack from the command line."""

from __future__ import annotations

import json
import signal
import threading
from typing import Annotated

import typer
from cgloop.config import settings
from cgloop.stack.preflight import PreflightError
from cgloop.stack.stack import Stack, StackError, StackStatus
from rich.console import Console
from rich.markup import escape
from rich.table import Table

_out = Console()
_err = Console(stderr=True)


def _print_status(status: StackStatus) -> None:
    table = Table("component", "state", "pid", "endpoint", "detail", title="cgloop stack")
    for c in status.components:
        state = (
            "[green]healthy[/]"
            if c.healthy
            else ("[yellow]unhealthy[/]" if c.running else "[dim]stopped[/]")
        )
        table.add_row(c.name, state, str(c.pid or "-"), c.endpoint, c.detail)
    _out.print(table)


def _how_to_query() -> None:
    s = settings()
    _out.print(
        "\n[bold]Query it[/]\n"
        f'  uv run cgloop query "SELECT name FROM system.databases"\n'
        f"  curl '{s.store_http_url}/?query=SELECT+version()'\n"
        f"  python: clickhouse_connect.get_client(dsn='{s.store_http_url}')\n"
        f"  Kafka bootstrap: {s.bootstrap_servers}  (topics: cgloop.*.v1)\n"
        f"  state and logs: {s.state_dir}\n",
        highlight=False,
    )
    if env := {k: v for k, v in s.kafka_security().env().items() if v}:
        # Names and file paths only: the password stays in its 0600 file.
        _out.print(
            "[bold]Kafka requires a login[/] (cgloop's own commands find it; for other "
            "clients):\n" + "".join(f"  export {k}={escape(v)}\n" for k, v in env.items()),
            highlight=False,
        )


def up(
    attach: Annotated[
        bool, typer.Option(help="stay in the foreground; Ctrl-C stops the stack")
    ] = False,
) -> None:
    """Start the embedded stack (Kafka broker + trace store); report it if it already runs."""
    stack = Stack(settings())
    before = stack.status()
    if before.healthy:
        _out.print("[bold]cgloop is already running[/]")
    try:
        status = stack.up(progress=lambda msg: _out.print(f"[dim]·[/] {msg}"))
    except (PreflightError, StackError, RuntimeError) as exc:
        _err.print(f"[red]cgloop up failed:[/] {escape(str(exc))}", highlight=False, soft_wrap=True)
        raise typer.Exit(1) from None
    _print_status(status)
    _how_to_query()
    if not attach:
        return
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    _out.print("[bold]running[/] - press Ctrl-C to stop")
    failed = None
    while not stop.wait(2.0):
        dead = [c.name for c in stack.status().components if not c.running]
        if dead:
            failed = dead
            break
    if failed:
        _err.print(f"[red]stopped unexpectedly: {', '.join(failed)}[/]; stopping the rest")
    stopped = stack.down()
    _out.print(f"stopped: {', '.join(stopped) or 'nothing'}")
    if failed:
        raise typer.Exit(1)


def down() -> None:
    """Stop the embedded stack (store first, then Kafka); data stays in the state folder."""
    stopped = Stack(settings()).down()
    _out.print(f"stopped: {', '.join(stopped)}" if stopped else "nothing was running")


def status(
    as_json: Annotated[bool, typer.Option("--json", help="machine-readable output")] = False,
) -> None:
    """Show each component of the stack and whether it is healthy (exit 1 if not)."""
    result = Stack(settings()).status()
    if as_json:
        print(json.dumps(result.as_dict(), indent=2))
    else:
        _print_status(result)
    if not result.healthy:
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    app.command()(up)
    app.command()(down)
    app.command()(status)
