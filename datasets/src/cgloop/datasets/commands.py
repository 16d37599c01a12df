"""`cgloop store …` and `cgloop query`: the trace store's command line."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from cgloop import metrics
from cgloop.config import settings
from cgloop.contracts.ops import Daemon
from rich.console import Console
from rich.markup import escape
from rich.table import Table

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

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
    sink: Annotated[
        bool, typer.Option("--sink", help="also run the Kafka sink inside this process")
    ] = False,
    bootstrap: Annotated[
        str | None, typer.Option(help="Kafka bootstrap servers for --sink")
    ] = None,
    group: Annotated[str, typer.Option(help="consumer group of --sink")] = "cgloop-sink",
    metrics_port: Annotated[
        int | None,
        typer.Option(hidden=True, help="deprecated: --metrics-addr 127.0.0.1:PORT"),
    ] = None,
    close_minutes_every: Annotated[
        float, typer.Option(min=0, help="seconds between closing flow minutes (0: never)")
    ] = 10.0,
    metrics_addr: Annotated[
        str | None, metrics.option(Daemon.DAEMON_STORE, "; with --sink, the sink's series too")
    ] = None,
) -> None:
    """Own the store: apply migrations, then answer read-only SQL over HTTP until stopped.

    With --sink it also consumes every cgloop topic into the store (the embedded default:
    chDB lets only this process write the data folder)."""
    from cgloop import logs
    from cgloop.datasets.store.migrations import MigrationError
    from cgloop.datasets.store.server import SinkFailed, StoreMetrics, serve

    logs.setup()
    store_metrics = StoreMetrics()
    server = metrics.start(
        store_metrics.registry, _addr(metrics_addr, metrics_port), Daemon.DAEMON_STORE
    )
    run_sink = None
    if sink:
        run_sink = _embedded_sink(
            bootstrap or settings().bootstrap_servers,
            group,
            store_metrics.registry,
            close_minutes_every,
        )
    try:
        serve(
            path or _default_path(),
            host,
            port or settings().store_port,
            migrations,
            sink=run_sink,
            metrics=store_metrics,
        )
    except SinkFailed as exc:
        _err.print(f"[red]store: {escape(str(exc))}[/]", highlight=False, soft_wrap=True)
        raise typer.Exit(1) from None
    except MigrationError as exc:
        _err.print(f"[red]store: {escape(str(exc))}[/]", highlight=False, soft_wrap=True)
        raise typer.Exit(2) from None
    except OSError as exc:
        _err.print(
            f"[red]store: cannot serve on {host}:{port}: {escape(str(exc))}[/]", highlight=False
        )
        raise typer.Exit(1) from None
    finally:
        if server is not None:
            server.close()


def schema_diff(client) -> list[str]:  # client: clickhouse-connect Client
    """ALTER statements a new migration needs so every protobuf field reaches its ingest table."""
    from cgloop.datasets.records import DATABASE, KINDS, ingest_columns

    out = []
    for kind in KINDS.values():
        have = dict(
            client.query(
                "SELECT name, type FROM system.columns WHERE database = {d:String}"
                " AND table = {t:String}",
                parameters={"d": DATABASE, "t": kind.ingest_table},
            ).result_rows
        )
        for name, ch_type in ingest_columns(kind.row_descriptor):
            if name not in have:
                out.append(
                    f"ALTER TABLE {DATABASE}.{kind.ingest_table} ADD COLUMN IF NOT EXISTS "
                    f"{name} {ch_type};"
                )
            elif have[name] != ch_type:
                out.append(
                    f"-- {kind.ingest_table}.{name}: store has {have[name]}, proto {ch_type}"
                )
    return out


@store_app.command("schema-diff")
def schema_diff_cmd(
    path: Annotated[Path | None, typer.Option(help="chDB data folder")] = None,
    url: Annotated[str | None, typer.Option(help="store or ClickHouse URL instead")] = None,
) -> None:
    """Print what a new migration must add for proto fields the store does not map yet (exit 1
    if anything); then add the column to the table and its view in that migration too."""
    import clickhouse_connect

    client = clickhouse_connect.get_client(
        dsn=url or f"chdb://{(path or _default_path()).resolve()}"
    )
    lines = schema_diff(client)
    print("\n".join(lines) if lines else "every protobuf field has its ingest column")
    raise typer.Exit(1 if lines else 0)


@store_app.command("ttl")
def ttl_cmd(
    table: Annotated[str, typer.Argument(help="table in the cgloop database")],
    days: Annotated[int, typer.Argument(min=1, help="keep rows this many days after ingest")],
    path: Annotated[Path | None, typer.Option(help="chDB data folder")] = None,
    url: Annotated[str | None, typer.Option(help="ClickHouse server URL instead")] = None,
    cluster: Annotated[
        str | None,
        typer.Option(help="the cluster --url belongs to (default: CGLOOP_STORE_CLUSTER)"),
    ] = None,
) -> None:
    """Change a table's retention (counted from ingested_at)."""
    import re

    import clickhouse_connect
    from cgloop.datasets.store.cluster import ClusterRenderError, ttl_statement

    if not re.fullmatch(r"[a-z0-9_]+", table):
        _err.print(f"[red]not a table name: {escape(table)!r}[/]")
        raise typer.Exit(2)
    client = clickhouse_connect.get_client(
        dsn=url or f"chdb://{(path or _default_path()).resolve()}"
    )
    try:
        # on a cluster: the local tables, on every node (a Distributed table keeps no rows)
        on = (cluster or settings().store_cluster or None) if url else None
        client.command(ttl_statement(table, days, on))
    except ClusterRenderError as exc:
        _err.print(f"[red]ttl: {escape(str(exc))}[/]", highlight=False)
        raise typer.Exit(2) from None
    except Exception as exc:
        _err.print(f"[red]ttl: {escape(str(exc))}[/]", highlight=False, soft_wrap=True)
        raise typer.Exit(1) from None
    print(f"cgloop.{table}: rows kept {days} days after ingest")


# Friendly output names -> ClickHouse formats (any other ClickHouse format name passes through).
_FORMATS = {"csv": "CSVWithNames", "json": "JSONEachRow", "tsv": "TSVWithNames"}


def query_cmd(
    sql: Annotated[str, typer.Argument(help="SQL to run; '-' reads it from stdin")],
    url: Annotated[str | None, typer.Option(help="store or ClickHouse server URL")] = None,
    fmt: Annotated[
        str,
        typer.Option(
            "--format",
            "-f",
            help="table (default), csv, json (one object per line), tsv, "
            "or any ClickHouse output format name, e.g. Parquet, JSON, Pretty",
        ),
    ] = "table",
    param: Annotated[
        list[str] | None,
        typer.Option("--param", "-p", help="query parameter NAME=VALUE for {NAME:Type}"),
    ] = None,
) -> None:
    """Run SQL against the trace store (the embedded store server or a ClickHouse server)."""
    import clickhouse_connect
    from clickhouse_connect.driver.exceptions import ClickHouseError

    if sql == "-":
        sql = sys.stdin.read()
    target = url or settings().store_http_url
    params: dict[str, str] = {}
    for item in param or []:
        name, sep, value = item.partition("=")
        if not sep or not name:
            _err.print(f"[red]--param {escape(item)!r}: expected NAME=VALUE[/]", highlight=False)
            raise typer.Exit(2)
        params[name] = value
    try:
        client = clickhouse_connect.get_client(dsn=target)
        if fmt.lower() != "table":
            out = client.raw_query(sql, parameters=params, fmt=_FORMATS.get(fmt.lower(), fmt))
            sys.stdout.buffer.write(out)
            sys.stdout.buffer.flush()
            return
        result = client.query(sql, parameters=params)
    except (ClickHouseError, OSError) as exc:
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


def _addr(metrics_addr: str | None, metrics_port: int | None) -> str | None:
    """--metrics-addr, or the deprecated --metrics-port as 127.0.0.1:PORT."""
    if metrics_addr is None and metrics_port is not None:
        return f"127.0.0.1:{metrics_port}"
    return metrics_addr


def _embedded_sink(
    bootstrap: str, group: str, registry: CollectorRegistry, close_minutes_every: float = 10.0
):
    """The sink as run inside the process that owns the chDB folder (its series are served
    with the store's, from `registry`)."""

    def run(store, should_stop) -> None:
        from cgloop.datasets.sink.consumer import Sink, SinkConfig
        from cgloop.datasets.sink.metrics import SinkMetrics
        from cgloop.datasets.sink.writer import store_writers

        metrics = SinkMetrics(registry)
        config = SinkConfig(group_id=group, close_minutes_every_s=close_minutes_every)
        writers = store_writers(f"chdb://{store.path}", config.writers, first=store.client)
        Sink(writers, bootstrap, config, metrics).run(should_stop)

    return run


def sink_cmd(
    url: Annotated[
        str | None,
        typer.Option(help="ClickHouse server URL (http://user:pass@host:8123); default: embedded"),
    ] = None,
    path: Annotated[
        Path | None, typer.Option(help="chDB data folder, when no store server owns it")
    ] = None,
    bootstrap: Annotated[str | None, typer.Option(help="Kafka bootstrap servers")] = None,
    group: Annotated[str, typer.Option(help="Kafka consumer group")] = "cgloop-sink",
    topic: Annotated[
        list[str] | None, typer.Option("--topic", "-t", help="kind or topic (default: all)")
    ] = None,
    max_chunk_messages: Annotated[int, typer.Option(min=1)] = 20_000,
    max_chunk_age_s: Annotated[float, typer.Option(min=0.01)] = 1.0,
    close_minutes_every: Annotated[
        float, typer.Option(min=0, help="seconds between closing flow minutes (0: never)")
    ] = 10.0,
    metrics_port: Annotated[
        int | None,
        typer.Option(hidden=True, help="deprecated: --metrics-addr 127.0.0.1:PORT"),
    ] = None,
    metrics_addr: Annotated[str | None, metrics.option(Daemon.DAEMON_SINK)] = None,
    migrate: Annotated[bool, typer.Option(help="apply schema migrations first")] = True,
    cluster: Annotated[
        str | None,
        typer.Option(
            help="the ClickHouse cluster --url belongs to (default: CGLOOP_STORE_CLUSTER): "
            "cluster-mode migrations and chunk plans"
        ),
    ] = None,
    crash_after_inserts: Annotated[
        int | None, typer.Option(hidden=True, help="testing: exit hard after N inserts")
    ] = None,
) -> None:
    """Consume cgloop topics into the trace store until Ctrl-C.

    Against a ClickHouse server: `--url`. Embedded (chDB): only one process may own the data
    folder, so when `cgloop up` runs, the sink runs inside the store (`cgloop store serve
    --sink`); `--path` runs a standalone embedded sink on a folder no server owns.
    """
    import os
    import signal
    import threading

    import clickhouse_connect
    from cgloop import logs
    from cgloop.datasets.sink.consumer import Sink, SinkConfig, topics_of
    from cgloop.datasets.sink.metrics import SinkMetrics
    from cgloop.datasets.sink.writer import store_writers
    from cgloop.datasets.store.migrations import MigrationError
    from cgloop.datasets.store.migrations import migrate as apply_migrations

    logs.setup()
    addr = metrics.parse_addr(_addr(metrics_addr, metrics_port), Daemon.DAEMON_SINK)
    url = url or settings().store_url
    if url and path:
        _err.print("[red]sink: give --url (ClickHouse server) or --path (chDB), not both[/]")
        raise typer.Exit(2)
    folder = path or _default_path()
    cluster = cluster or settings().store_cluster or None
    if cluster and not url:
        _err.print("[red]sink: --cluster (CGLOOP_STORE_CLUSTER) needs a server --url[/]")
        raise typer.Exit(2)
    try:
        client = clickhouse_connect.get_client(dsn=url or f"chdb://{folder.resolve()}")
        if migrate:
            apply_migrations(client, cluster=cluster)
    except MigrationError as exc:
        _err.print(f"[red]sink: {escape(str(exc))}[/]", highlight=False, soft_wrap=True)
        raise typer.Exit(2) from None
    except Exception as exc:
        where = url or folder
        hint = (
            ""
            if url
            else " (is `cgloop store serve` running on it? then start that with --sink instead)"
        )
        _err.print(
            f"[red]sink: cannot open the store {where}: {escape(str(exc))}{hint}[/]",
            highlight=False,
            soft_wrap=True,
        )
        raise typer.Exit(1) from None
    try:
        config = SinkConfig(
            group_id=group,
            max_chunk_messages=max_chunk_messages,
            max_chunk_age_s=max_chunk_age_s,
            close_minutes_every_s=close_minutes_every,
            cluster=cluster,
            **({"topics": topics_of(topic)} if topic else {}),
        )
    except ValueError as exc:
        _err.print(f"[red]sink: {escape(str(exc))}[/]", highlight=False)
        raise typer.Exit(2) from None
    sink_metrics = SinkMetrics()
    metrics.daemon_info(sink_metrics.registry, Daemon.DAEMON_SINK)
    metrics.serve(sink_metrics.registry, addr, Daemon.DAEMON_SINK)
    inserts = [0]

    def after_insert(_chunk: object) -> None:
        inserts[0] += 1
        if crash_after_inserts is not None and inserts[0] >= crash_after_inserts:
            os._exit(17)  # as a crash would: inserted, offset not committed

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    writers = store_writers(url or f"chdb://{folder.resolve()}", config.writers, first=client)
    sink = Sink(
        writers,
        bootstrap or settings().bootstrap_servers,
        config,
        sink_metrics,
        after_insert=after_insert,
    )
    print(f"sink: group {group} -> {url or folder}", flush=True)
    sink.run(stop.is_set)


def register(app: typer.Typer) -> None:
    app.add_typer(store_app, name="store")
    app.command("query")(query_cmd)
    app.command("sink")(sink_cmd)
    app.add_typer(dataset_app, name="dataset")


dataset_app = typer.Typer(
    help="Dataset bundles: tables as Parquet + manifest.json (export, import, describe).",
    no_args_is_help=True,
)


def _client(url: str | None, path: Path | None, default_url: bool):
    """A store client: a server URL, an embedded folder, or (reads) the running store."""
    import clickhouse_connect

    if url and path:
        _err.print("[red]give --url or --path, not both[/]")
        raise typer.Exit(2)
    if path or not (url or default_url):
        folder = (path or _default_path()).resolve()
        try:
            return clickhouse_connect.get_client(dsn=f"chdb://{folder}")
        except Exception as exc:
            _err.print(
                f"[red]cannot open the store folder {folder}: {escape(str(exc))} (a running "
                "`cgloop store serve` owns it: stop it with `cgloop down`, or use --url)[/]",
                highlight=False,
                soft_wrap=True,
            )
            raise typer.Exit(1) from None
    return clickhouse_connect.get_client(dsn=url or settings().store_http_url)


def _fail(exc: Exception) -> None:
    _err.print(f"[red]dataset: {escape(str(exc))}[/]", highlight=False, soft_wrap=True)
    raise typer.Exit(2) from None


@dataset_app.command("export")
def export_cmd(
    out: Annotated[Path, typer.Argument(help="bundle folder to write")],
    scenario: Annotated[
        Path, typer.Option(help="JSON file: how the data was recorded (see docs/queries.md)")
    ],
    table: Annotated[list[str], typer.Option("--table", "-t", help="table to include")],
    name: Annotated[str | None, typer.Option(help="bundle name (default: folder name)")] = None,
    start: Annotated[str | None, typer.Option("--from", help="UTC start, ISO 8601")] = None,
    end: Annotated[str | None, typer.Option("--to", help="UTC end (exclusive), ISO 8601")] = None,
    description: Annotated[str, typer.Option()] = "",
    url: Annotated[str | None, typer.Option(help="store or ClickHouse URL")] = None,
    path: Annotated[Path | None, typer.Option(help="chDB folder no server owns")] = None,
) -> None:
    """Export a time range of tables as Parquet files plus manifest.json."""
    from datetime import UTC, datetime

    from cgloop.datasets.bundles import BundleError, Scenario, export
    from pydantic import ValidationError

    try:
        scen = Scenario.model_validate_json(scenario.read_text())
        times = [datetime.fromisoformat(t).replace(tzinfo=UTC) if t else None for t in (start, end)]
    except (OSError, ValidationError, ValueError) as exc:
        _fail(exc)
    client = _client(url, path, default_url=True)
    try:
        manifest = export(
            client, out, name or out.name, table, scen, times[0], times[1], description
        )
    except BundleError as exc:
        _fail(exc)
    rows = ", ".join(f"{t} {f.rows}" for t, f in manifest.tables.items())
    print(f"exported {out}: {rows}")


@dataset_app.command("import")
def import_cmd(
    bundles: Annotated[list[Path], typer.Argument(help="bundle folder(s), imported in order")],
    url: Annotated[str | None, typer.Option(help="ClickHouse server URL")] = None,
    path: Annotated[Path | None, typer.Option(help="chDB folder no server owns")] = None,
) -> None:
    """Validate each bundle against the store, then insert it (importing twice counts once).
    Stops at the first bundle refused; the ones before it stay imported."""
    from cgloop.datasets.bundles import BundleError, import_bundle
    from cgloop.datasets.store.migrations import migrate

    client = _client(url, path, default_url=False)
    try:
        # a server may be one node of a cluster (CGLOOP_STORE_CLUSTER): its schema's form
        migrate(client, cluster=(settings().store_cluster or None) if url else None)
        for bundle in bundles:
            written = import_bundle(client, bundle)
            print(f"imported {bundle}: " + ", ".join(f"{t} {n}" for t, n in written.items()))
    except BundleError as exc:
        _fail(exc)


@dataset_app.command("describe")
def describe_cmd(bundle: Annotated[Path, typer.Argument(help="bundle folder")]) -> None:
    """Print a bundle's manifest: scenario, time range, tables and rows."""
    from cgloop.datasets.bundles import BundleError, read_manifest

    try:
        m = read_manifest(bundle)
    except BundleError as exc:
        _fail(exc)
    console = Console()
    console.print(f"[bold]{m.name}[/] — {m.description or 'no description'}")
    console.print(
        f"schema version {m.schema_version}; recorded {m.time_start or '…'} to {m.time_end or '…'}"
    )
    s = m.scenario
    console.print(
        f"{'synthetic' if s.synthetic else 'real'} data from {s.source}; licence {s.licence}"
    )
    console.print(
        f"timestamps: {s.timestamp_source}, {s.timestamp_resolution_ns} ns; clocks: {s.clock_sync}"
    )
    for label, value in [
        ("topology", s.topology),
        ("hardware", s.hardware),
        ("traffic", s.traffic_pattern),
        ("faults", "; ".join(s.fault_schedule)),
        ("software", ", ".join(f"{k} {v}" for k, v in s.software_versions.items())),
        ("notes", s.notes),
    ]:
        if value:
            console.print(f"{label}: {value}", highlight=False)
    table = Table("table", "rows", "columns", "file")
    for name, f in m.tables.items():
        table.add_row(name, str(f.rows), str(len(f.columns)), f.file)
    console.print(table)


_SCENARIOS = {
    "xbox": dict(
        synthetic=False,
        source="dcomp-leris/VR-AR-CG-network-telemetry @ 84f3628, 'CG dataset/Wired connection'",
        licence="BSD-3-Clause",
        topology="client on a wired access network behind a BMv2 switch; Xbox Cloud Gaming "
        "servers in 13.104.0.0/16",
        traffic_pattern="Fortnite, Forza Horizon 5, Mortal Kombat 11; 1-2 players; background "
        "traffic of the capture host",
        timestamp_source="capture host (features) and BMv2 switch (INT, per-second samples)",
        timestamp_resolution_ns=1000,
        clock_sync="unknown (as published)",
        notes="flow_features labelled game_stream by the README rule (UDP, server 13.104.0.0/16,"
        " port 1000-1110); int_queue_records: egress_port 1 downlink, 2 uplink, occupancy in "
        "packets, latency = deq_timedelta (us) * 1000",
    ),
    "pcaps": dict(
        synthetic=False,
        source="heistp/l4s-tests @ e21cd91 (BSD-2-Clause) and ntop/nDPI @ 3b1286a "
        "tests/cfgs/default/pcap (LGPL-3.0)",
        licence="BSD-2-Clause AND LGPL-3.0-only",
        topology="as captured upstream (DualPI2 bottleneck for the L4S captures)",
        traffic_pattern="Skype in the L4S queue, TCP Prague, TCP Cubic; nDPI session captures",
        timestamp_source="pcap packet timestamps",
        timestamp_resolution_ns=1000,
        clock_sync="none (single capture clock per file)",
        notes="flow records from the probe's Rust pcap twin (cgloop.pcaprecords), 100 ms intervals",
    ),
    "loop-demo": dict(
        synthetic=True,
        source="cgloop synthetic loop episode (cgloop.datasets.importers.loop_demo, seed 7)",
        licence="Apache-2.0",
        topology="one node, one INT path of two switches",
        traffic_pattern="two gaming flows (xcloud, GFN) and one background flow, 10 minutes",
        fault_schedule=["04:00-06:10 flow B latency 30-45 ms, jitter 6-12 ms, RTP loss"],
        timestamp_source="generator",
        timestamp_resolution_ns=1,
        clock_sync="none (single generator clock)",
    ),
}
_TABLES = {
    "xbox": ["flow_features", "int_queue_records"],
    "pcaps": ["flow_records"],
    "loop-demo": [
        "flow_records", "int_flow_records", "detections", "actions", "action_results",
    ],
}  # fmt: skip


@dataset_app.command("make")
def make_cmd(
    source: Annotated[str, typer.Argument(help="xbox, pcaps or loop-demo")],
    out: Annotated[Path, typer.Argument(help="bundle folder to write")],
    data: Annotated[Path, typer.Option(help="third-party data folder (xbox, pcaps)")] = Path(
        "../shared/data"
    ),
    pcap: Annotated[list[str] | None, typer.Option(help="pcaps under --data to include")] = None,
) -> None:
    """Build a bundle from third-party data or the synthetic loop episode (own temporary store)."""
    import tempfile

    import clickhouse_connect
    from cgloop.datasets import importers
    from cgloop.datasets.bundles import Scenario, export
    from cgloop.datasets.store.migrations import migrate

    if source not in _SCENARIOS:
        _err.print(f"[red]unknown source {source!r}: xbox, pcaps or loop-demo[/]")
        raise typer.Exit(2)
    with tempfile.TemporaryDirectory() as tmp:
        client = clickhouse_connect.get_client(dsn=f"chdb://{tmp}")
        migrate(client)
        try:
            if source == "xbox":
                rows = importers.import_xbox(
                    client, data / "xbox-cloud-gaming" / "Wired connection"
                )
            elif source == "pcaps":
                rows = importers.import_pcaps(client, [data / p for p in pcap or []])
            else:
                rows = importers.loop_demo(client)
        except (importers.ImportError_, OSError) as exc:
            _fail(exc)
        print(f"imported: {rows}")
        export(client, out, out.name, _TABLES[source], Scenario(**_SCENARIOS[source]))
    print(f"bundle written to {out}")
