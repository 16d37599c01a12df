"""Cluster-mode migrations (issue 23), tested without a ClickHouse server (none runs here).

* every statement rendered for a cluster is parsed and formatted by ClickHouse's own parser
  (`formatQuery` in chDB, the engine of the server), and its shape checked: replicated local
  tables with the {shard}/{replica} macros, a Distributed table over each, views and roll-ups
  on the local tables, ON CLUSTER everywhere;
* the local half is executed in chDB: the same rendering with the single-node engines and
  without ON CLUSTER (chDB has neither Keeper nor a cluster), the Distributed tables stood in
  for by one shard (ingest: a Null table forwarding to its local table, as a Distributed insert
  reaches a shard; the others: a Merge table over the local one), so the plain views run over
  them. The sink's writer then stores flow and INT batches through it, a replay with the same
  token is dropped in the records and the roll-ups, and the sharding keys of an ingest row and
  of its record agree, both directions of a conversation alike.
"""

from __future__ import annotations

import re

import pytest
from cgloop.datasets.store.cluster import (
    SHARDING,
    ClusterRenderer,
    ClusterRenderError,
    render_migrations,
    ttl_statement,
)
from cgloop.datasets.store.migrations import default_migrations_dir, discover

from .conftest import in_own_process

_FORMAT = r"""
import json, sys, tempfile
import clickhouse_connect
from cgloop.datasets.store.cluster import render_migrations
from cgloop.datasets.store.migrations import default_migrations_dir, discover

client = clickhouse_connect.get_client(dsn=f"chdb://{tempfile.mkdtemp()}")
rendered = render_migrations(
    [(m.name, m.sql) for m in discover(default_migrations_dir())], sys.argv[1]
)
out = []
for name, statements in rendered.items():
    for r in statements:
        text = client.query("SELECT formatQuery({q:String})", parameters={"q": r.sql})
        out.append([name, r.part, text.result_rows[0][0]])
print(json.dumps(out))
"""


def _migrations() -> list[tuple[str, str]]:
    return [(m.name, m.sql) for m in discover(default_migrations_dir())]


def test_every_cluster_statement_is_parsed_and_formatted_by_clickhouse() -> None:
    formatted: list[list[str]] = in_own_process(_FORMAT, "cgloop_cluster")
    rendered = render_migrations(_migrations(), "cgloop_cluster")
    assert len(formatted) == sum(len(v) for v in rendered.values()) > 300
    tables: dict[str, str] = {}
    for name, part, sql in formatted:
        assert "ON CLUSTER cgloop_cluster" in sql, (name, sql[:200])
        one_line = " ".join(sql.split())
        if m := re.match(r"CREATE TABLE IF NOT EXISTS cgloop\.(\w+) ON CLUSTER", one_line):
            tables[m.group(1)] = one_line
        if one_line.startswith("CREATE MATERIALIZED VIEW"):
            # a view fires on its own node's inserts: it reads and writes local tables only
            target = re.search(r" TO cgloop\.(\w+)", one_line)
            assert target and target.group(1).endswith("_local"), one_line[:200]
            read = re.findall(r"(?:FROM|JOIN) cgloop\.(\w+)", one_line)
            assert read and all(t.endswith("_local") for t in read), (name, read)
        if part == "distributed" and one_line.startswith("ALTER"):
            assert "CODEC" not in one_line and "INDEX" not in one_line, one_line[:200]
    distributed = {t for t, sql in tables.items() if "ENGINE = Distributed(" in sql}
    assert distributed == set(SHARDING), set(SHARDING) ^ distributed
    for table in distributed:
        local = tables[f"{table}_local"]
        assert f"Distributed(cgloop_cluster, cgloop, {table}_local, " in tables[table]
        engine = re.search(r"ENGINE = (\w+)\((.*?)\)", local + " ")
        if table.endswith("_ingest"):
            assert "ENGINE = `Null`" in local, local[-200:]
            continue
        assert engine and engine.group(1).startswith("Replicated"), local[-300:]
        assert engine.group(2).startswith(
            f"'/clickhouse/tables/{{shard}}/cgloop/{table}_local', '{{replica}}'"
        ), engine.group(2)
        # tables that kept 1000 insert tokens keep them in Keeper, for every replica
        assert "non_replicated_deduplication_window" not in local
        if table != "flow_minutes_closed":  # versioned by finalised_at, never replayed
            assert "replicated_deduplication_window = 1000" in local, local[-200:]
    # the roll-ups are filled on each shard from its local records
    assert "ReplicatedAggregatingMergeTree" in tables["flow_stats_1m_local"]
    closed = "'/clickhouse/tables/{shard}/cgloop/flow_minutes_closed_local', '{replica}'"
    assert (
        f"ReplicatedReplacingMergeTree({closed}, finalised_at)"
        in tables["flow_minutes_closed_local"]
    )


def test_the_single_node_migrations_are_untouched_by_cluster_rendering() -> None:
    """Cluster mode renders from the one set of files: single-node mode reads them as they
    are, and rendering twice gives the same statements."""
    before = [(m.name, m.checksum) for m in discover(default_migrations_dir())]
    first = render_migrations(_migrations(), "c")
    assert render_migrations(_migrations(), "c") == first
    assert [(m.name, m.checksum) for m in discover(default_migrations_dir())] == before


def test_statements_the_renderer_does_not_know_are_refused_by_name() -> None:
    renderer = ClusterRenderer("c")
    with pytest.raises(ClusterRenderError, match=r"no cluster form.*TRUNCATE TABLE cgloop\.x"):
        renderer.render("TRUNCATE TABLE cgloop.x")
    with pytest.raises(ClusterRenderError, match=r"cgloop\.brand_new has no sharding key"):
        renderer.render("CREATE TABLE IF NOT EXISTS cgloop.brand_new (a UInt8) ENGINE = Null")
    with pytest.raises(ClusterRenderError, match=r"cgloop\.flow_records is not a table created"):
        renderer.render("ALTER TABLE cgloop.flow_records ADD COLUMN IF NOT EXISTS x UInt8")
    with pytest.raises(ClusterRenderError, match="CGLOOP_STORE_CLUSTER='a b'"):
        ClusterRenderer("a b")
    # where: the migration and the statement
    with pytest.raises(ClusterRenderError, match=r"9999_x\.sql statement 2: no cluster form"):
        renderer.render_script(
            "CREATE DATABASE IF NOT EXISTS cgloop; OPTIMIZE TABLE t", "9999_x.sql"
        )


_LOCAL_HALF = r"""
import json, re, sys
import clickhouse_connect
from cgloop.bus.topics import FLOWS, INT
from cgloop.contracts.samples import sample_flow_record_batch, sample_int_record_batch
from cgloop.datasets.records import KINDS
from cgloop.datasets.sink.writer import StoreWriter
from cgloop.datasets.store.cluster import SHARDING, render_migrations
from cgloop.datasets.store.migrations import default_migrations_dir, discover

client = clickhouse_connect.get_client(dsn=f"chdb://{sys.argv[1]}")
rendered = render_migrations(
    [(m.name, m.sql) for m in discover(default_migrations_dir())], "c", replicated=False
)
DIST = re.compile(
    r"^CREATE TABLE IF NOT EXISTS cgloop\.(\w+) AS (cgloop\.\w+) ENGINE = Distributed"
)
ingest = []
counts = {"local": 0, "distributed": 0}
for statements in rendered.values():
    for r in statements:
        counts[r.part] += 1
        m = DIST.match(r.sql)
        if m is None:
            client.command(r.sql)
        elif m.group(1).endswith("_ingest"):  # one shard's share arrives in its local table
            client.command(f"CREATE TABLE cgloop.{m.group(1)} AS {m.group(2)} ENGINE = Null")
            ingest.append(m.group(1))
        else:
            client.command(
                f"CREATE TABLE cgloop.{m.group(1)} AS {m.group(2)}"
                f" ENGINE = Merge(cgloop, '^{m.group(1)}_local$')"
            )
for t in ingest:
    client.command(
        f"CREATE MATERIALIZED VIEW cgloop.{t}_to_shard TO cgloop.{t}_local"
        f" AS SELECT * FROM cgloop.{t}"
    )
# what arrived in the flow ingest table, kept to evaluate its sharding key
client.command("CREATE TABLE cgloop.flow_ingest_seen AS cgloop.flow_ingest_local ENGINE = Memory")
client.command(
    "CREATE MATERIALIZED VIEW cgloop.flow_ingest_seen_mv TO cgloop.flow_ingest_seen"
    " AS SELECT * FROM cgloop.flow_ingest_local"
)

def flows(sequence, reverse=False):
    batch = sample_flow_record_batch()
    for r in batch.records:
        r.header.source_id = "edge1/flow-probe"
        r.header.sequence = sequence
        if reverse:
            ft = r.five_tuple
            ft.src_addr, ft.dst_addr = ft.dst_addr, ft.src_addr
            ft.src_port, ft.dst_port = ft.dst_port, ft.src_port
    return batch

writer = StoreWriter(client)
inserted = [
    writer.insert(KINDS[FLOWS.name], [flows(1).SerializeToString()], "g/flow/0/0-0"),
    writer.insert(KINDS[FLOWS.name], [flows(2, reverse=True).SerializeToString()], "g/flow/0/1-1"),
    writer.insert(KINDS[INT.name], [sample_int_record_batch().SerializeToString()], "g/int/0/0-0"),
]
def snapshot():
    return client.query(
        "SELECT (SELECT count() FROM cgloop.flow_records), (SELECT count() FROM"
        " cgloop.flow_records_local), (SELECT sum(records) FROM cgloop.flow_stats_1s_local),"
        " (SELECT sum(records) FROM cgloop.flow_stats_1m), (SELECT count() FROM"
        " cgloop.int_flow_records), (SELECT count() FROM cgloop.int_hop_records),"
        " (SELECT count() FROM cgloop.flow_minutes)"
    ).result_rows[0]
first = snapshot()
writer.insert(KINDS[FLOWS.name], [flows(1).SerializeToString()], "g/flow/0/0-0")  # a replay
replayed = snapshot()
record_keys = client.query(
    f"SELECT sequence, {SHARDING['flow_records']} FROM cgloop.flow_records ORDER BY sequence"
).result_rows
ingest_keys = client.query(
    f"SELECT header_sequence, {SHARDING['flow_ingest']} FROM cgloop.flow_ingest_seen"
    " ORDER BY header_sequence"
).result_rows
int_keys = client.query(
    f"SELECT 'flow', {SHARDING['int_flow_records']} FROM cgloop.int_flow_records UNION ALL"
    f" SELECT 'hop', {SHARDING['int_hop_records']} FROM cgloop.int_hop_records"
).result_rows
print(json.dumps({
    "counts": counts, "inserted": inserted, "first": first, "replayed": replayed,
    "record_keys": record_keys, "ingest_keys": ingest_keys, "int_keys": int_keys,
}, default=str))
"""


def test_the_local_half_runs_in_chdb_and_keeps_a_conversation_on_one_shard(tmp_path) -> None:
    out = in_own_process(_LOCAL_HALF, str(tmp_path / "store"))
    assert out["counts"]["local"] > 200 and out["counts"]["distributed"] > 40, out["counts"]
    assert all(n > 0 for n in out["inserted"]), out["inserted"]
    records, local, per_second, per_minute, int_flows, int_hops, minutes = out["first"]
    assert records == local > 0 and per_second == per_minute == records, out["first"]
    assert int_flows > 0 and int_hops > 0 and minutes > 0, out["first"]
    assert out["replayed"] == out["first"], "a replay with the same token must be dropped"
    # The record's key (record table) equals its ingest row's key, and the reversed direction
    # of the conversation (sequence 2) gets the same key as the forward one (sequence 1).
    keys = {int(seq): key for seq, key in out["record_keys"]}
    assert {int(s): k for s, k in out["ingest_keys"]} == keys
    assert set(keys) == {1, 2} and keys[1] == keys[2], keys
    # the sample INT records are of the same gaming conversation: the same shard as its flow
    assert {key for _, key in out["int_keys"]} == {keys[1]}, out["int_keys"]


class _RecordingClient:
    """What cluster-mode `migrate` sends to the node it talks to (no server here): DDL in
    order, the record's reads and inserts with their settings."""

    def __init__(self) -> None:
        self.commands: list[str] = []
        self.records: list[list[object]] = []
        self.insert_settings: list[dict[str, str]] = []

    def command(self, sql: str) -> None:
        self.commands.append(sql)

    def query(self, sql: str):
        self.commands.append(sql)
        return type("Result", (), {"result_rows": self.records})()

    def insert(self, table, rows, column_names, settings=None) -> None:
        assert table == "cgloop_meta.schema_migrations" and column_names[0] == "version"
        self.records.extend(rows)
        self.insert_settings.append(settings)


def test_cluster_migrate_records_each_migration_once_for_every_replica() -> None:
    from cgloop.datasets.store.migrations import migrate

    client = _RecordingClient()
    names = migrate(client, cluster="c")  # type: ignore[arg-type]
    assert names == [name for name, _ in _migrations()]
    # the record: one replication group across the cluster, synced before it is read
    create = next(c for c in client.commands if "TABLE IF NOT EXISTS cgloop_meta" in c)
    assert "ON CLUSTER c" in create
    assert (
        "ReplicatedReplacingMergeTree('/clickhouse/tables/c/cgloop_meta/schema_migrations'"
        in create
    )
    sync = client.commands.index("SYSTEM SYNC REPLICA cgloop_meta.schema_migrations")
    assert client.commands[sync + 1].endswith("FROM cgloop_meta.schema_migrations FINAL")
    tokens = [s["insert_deduplication_token"] for s in client.insert_settings]
    assert len(set(tokens)) == len(names) and tokens[0].startswith("migration/1/")
    ddl = [c for c in client.commands if c.startswith(("CREATE", "ALTER", "DROP"))]
    assert ddl and all(" ON CLUSTER c" in c for c in ddl)
    # a second run (another node, the record replicated) applies nothing
    again = _RecordingClient()
    again.records = list(client.records)
    assert migrate(again, cluster="c") == []  # type: ignore[arg-type]
    assert not [c for c in again.commands if c.startswith("CREATE TABLE IF NOT EXISTS cgloop.")]


def test_retention_changes_the_local_tables_on_a_cluster() -> None:
    single = ttl_statement("flow_records", 7)
    assert single == "ALTER TABLE cgloop.flow_records MODIFY TTL ingested_at + INTERVAL 7 DAY"
    assert ttl_statement("flow_records", 7, "c") == (
        "ALTER TABLE cgloop.flow_records_local ON CLUSTER c MODIFY TTL ingested_at + INTERVAL 7 DAY"
    )
