"""`cgloop store …` and `cgloop query`: the trace store's command line."""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Annotated

import typer
from cgloop.config import settings
from rich.console import Console
from rich.markup import escape
from rich.table import Table

store_app = typer.Typer(
    help="The trace store (chDB embedded, or a ClickHouse server).", no_args_is_help=True
)
_err = Console(stderr=True)


def _default_path() -> Path:
    return settings().state_dir / "store"


@store_app.command("migrate")
def migrate_cmd(
    path: Annotated[Path | None, typer.Option(help="chDB data folder")] = None,
    migrations: Annotated[Path | None, typer.Option(help="folder of NNNN_name.sql files")] = None,
) -> None:
    """Apply pending schema migrations to the embedded store, then exit."""
    from cgloop.datasets.store.migrations import MigrationError
    from cgloop.datasets.store.server import Store

    store = Store(path or _default_path())
    try:
        applied = store.migrate(migrations)
    except MigrationError as exc:
        _err.print(f"[red]store: {escape(str(exc))}[/]", highlight=False, soft_wrap=True)
        raise typer.Exit(2) from None
    finally:
        store.close()
    print(f"applied {len(applied)} migration(s){': ' + ', '.join(applied) if applied else ''}")


@store_app.command("serve")
def serve_cmd(
    path: Annotated[Path | None, typer.Option(help="chDB data folder")] = None,
    host: Annotated[str, typer.Option()] = "127.0.0.1",
    port: Annotated[int | None, typer.Option(help="HTTP port (ClickHouse HTTP interface)")] = None,
    migrations: Annotated[Path | None, typer.Option(help="folder of NNNN_name.sql files")] = None,
) -> None:
    """Own the store: apply migrations, then answer read-only SQL over HTTP until stopped."""
    from cgloop.datasets.store.migrations import MigrationError
    from cgloop.datasets.store.server import serve

    logging.basicConfig(
        level=logging.INFO,
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        serve(path or _default_path(), host, port or settings().store_port, migrations)
    except MigrationError as exc:
        _err.print(f"[red]store: {escape(str(exc))}[/]", highlight=False, soft_wrap=True)
        raise typer.Exit(2) from None
    except OSError as exc:
        _err.print(
            f"[red]store: cannot serve on {host}:{port}: {escape(str(exc))}[/]", highlight=False
        )
        raise typer.Exit(1) from None


def query_cmd(
    sql: Annotated[str, typer.Argument(help="SQL to run; '-' reads it from stdin")],
    url: Annotated[str | None, typer.Option(help="store or ClickHouse server URL")] = None,
    fmt: Annotated[
        str | None,
        typer.Option("--format", "-f", help="ClickHouse output format, e.g. CSV, JSONEachRow"),
    ] = None,
) -> None:
    """Run SQL against the trace store (the embedded store server or a ClickHouse server)."""
    import clickhouse_connect
    from clickhouse_connect.driver.exceptions import ClickHouseError

    if sql == "-":
        sql = sys.stdin.read()
    target = url or settings().store_http_url
    try:
        client = clickhouse_connect.get_client(dsn=target)
        if fmt:
            sys.stdout.buffer.write(client.raw_query(sql, fmt=fmt))
            return
        result = client.query(sql)
    except ClickHouseError as exc:
        _err.print(
            f"[red]query failed against {target}: {escape(str(exc))}[/]",
            highlight=False,
            soft_wrap=True,
        )
        raise typer.Exit(1) from None
    table = Table(*result.column_names)
    for row in result.result_rows:
        table.add_row(*(str(v) for v in row))
    Console().print(table)


def register(app: typer.Typer) -> None:
    app.add_typer(store_app, name="store")
    app.command("query")(query_cmd)
