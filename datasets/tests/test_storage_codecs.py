"""Migration 0014: column codecs and skip indexes, on a fresh store and on one at 0013 with rows.

A store migrated to 0013 gets rows of every record kind through the sink's writer; then 0014
runs: every row is kept, the dashboards' kinds of queries (time ranges, a node, a flow's
server, a severity, a level) answer the same before, after, and after every part was merged
again (rewritten with the new codecs), and the indexes were built for the parts stored before
the migration.
"""

from __future__ import annotations

from pathlib import Path

from .conftest import in_own_process

# The tables 0014 gives codecs, and the skip indexes it adds to each.
TABLES = {
    "flow_records": {"idx_interval_start": "minmax", "idx_dst_addr": "bloom_filter(0.01)"},
    "int_hop_records": {"idx_time": "minmax", "idx_dst_addr": "bloom_filter(0.01)"},
    "int_flow_records": {"idx_time": "minmax", "idx_dst_addr": "bloom_filter(0.01)"},
    "int_queue_records": {"idx_time": "minmax"},
    "int_drop_records": {"idx_time": "minmax"},
    "probe_records": {"idx_sent": "minmax"},
    "node_samples": {"idx_time": "minmax"},
    "detections": {
        "idx_window_end": "minmax",
        "idx_severity": "set(16)",
        "idx_id": "bloom_filter(0.01)",
    },
    "actions": {
        "idx_time": "minmax",
        "idx_level": "set(16)",
        "idx_operation": "set(64)",
        "idx_target_node_id": "bloom_filter(0.01)",
    },
}

# Runs in a process of its own: chDB hosts one data folder per process.
_SCRIPT = r"""
import json, shutil, sys, tempfile, time
from pathlib import Path
import clickhouse_connect
from cgloop.bus.codec import _records
from cgloop.bus.topics import ACTIONS, DETECTIONS, FLOWS, INT, NODES, PROBES
from cgloop.contracts.samples import SAMPLE_FOR_TOPIC, SAMPLES
from cgloop.datasets.records import KINDS
from cgloop.datasets.sink.writer import StoreWriter
from cgloop.datasets.store.migrations import default_migrations_dir, discover, migrate

path, upto, copies = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
tables = json.loads(sys.argv[4])
client = clickhouse_connect.get_client(dsn=f"chdb://{path}")
out = {}
if upto:
    # The store as it was before 0014: rows of every kind, in several inserts (several parts).
    with tempfile.TemporaryDirectory() as tmp:
        for m in discover(default_migrations_dir()):
            if m.version <= upto:
                shutil.copy(default_migrations_dir() / m.name, tmp)
        migrate(client, Path(tmp))
    writer = StoreWriter(client)
    for topic in (t.name for t in (FLOWS, INT, PROBES, NODES, DETECTIONS, ACTIONS)):
        kind = KINDS[topic]
        for part in range(3):
            payloads = []
            for c in range(copies):
                batch = SAMPLES[SAMPLE_FOR_TOPIC[topic]]()
                n = part * copies + c
                for i, record in enumerate(_records(batch)):
                    record.header.source_id = f"{topic}-source-{n % 2}"
                    record.header.sequence = 1 + n * 100 + i
                    record.header.timestamp_ns += n * 1_000_000_000
                payloads.append(batch.SerializeToString())
            writer.insert(kind, payloads, f"{topic}/{part}")

# Queries of the kinds the dashboards and analysts run; the same text before and after.
QUERIES = {
    f"{t} all": f"SELECT count(), sum(cityHash64(*)) FROM cgloop.{t}" for t in tables
} | {
    "flows in a range": "SELECT count(), sum(packets) FROM cgloop.flow_records"
        " WHERE interval_start >= (SELECT min(interval_start) FROM cgloop.flow_records)"
        " AND interval_start < (SELECT min(interval_start) FROM cgloop.flow_records)"
        " + INTERVAL 5 SECOND",
    "flows to a server": "SELECT count() FROM cgloop.flow_records"
        " WHERE dst_addr = (SELECT any(dst_addr) FROM cgloop.flow_records)",
    "int latency in a range": "SELECT count(), max(end_to_end_latency_ns)"
        " FROM cgloop.int_flow_records WHERE time >= (SELECT min(time) FROM"
        " cgloop.int_flow_records) + INTERVAL 3 SECOND",
    "probe rtt": "SELECT count(), quantileExact(0.99)(rtt_ns) FROM cgloop.probe_records"
        " WHERE sent >= (SELECT min(sent) FROM cgloop.probe_records) AND NOT lost AND NOT overdue",
    "a node": "SELECT count(), sum(power_watts) FROM cgloop.node_samples"
        " WHERE node_id = (SELECT any(node_id) FROM cgloop.node_samples)",
    "detections by severity": "SELECT severity, count() FROM cgloop.detections FINAL"
        " GROUP BY severity ORDER BY severity",
    "actions by level": "SELECT level, operation, count() FROM cgloop.actions"
        " WHERE time >= (SELECT min(time) FROM cgloop.actions) GROUP BY level, operation"
        " ORDER BY level, operation",
}


def answers():
    return {name: [list(map(str, r)) for r in client.query(sql).result_rows]
            for name, sql in QUERIES.items()}


if upto:
    out["before"] = answers()
    out["parts_before"] = client.query(
        "SELECT table, count() FROM system.parts WHERE database = 'cgloop' AND active"
        " GROUP BY table").result_rows
# Up to 0014, the migration under test (a later one may rewrite a column, and the rows with it).
with tempfile.TemporaryDirectory() as tmp:
    for m in discover(default_migrations_dir()):
        if m.version <= 14:
            shutil.copy(default_migrations_dir() / m.name, tmp)
    out["applied"] = migrate(client, Path(tmp))
# MATERIALIZE INDEX is a background mutation: wait for it (and fail on one that fails).
deadline = time.time() + 60
while time.time() < deadline:
    pending, failed = client.query(
        "SELECT countIf(NOT is_done), groupArrayIf(latest_fail_reason, latest_fail_reason != '')"
        " FROM system.mutations WHERE database = 'cgloop'").result_rows[0]
    assert not failed, failed
    if not pending:
        break
    time.sleep(0.1)
out["pending_mutations"] = pending
out["after"] = answers()
# Parts written before the migration that carry no skip-index data (MATERIALIZE INDEX missed).
out["parts_without_index"] = client.query(
    "SELECT table, count() FROM system.parts WHERE database = 'cgloop' AND active"
    " AND rows > 0 AND secondary_indices_compressed_bytes = 0 AND table IN {t:Array(String)}"
    " GROUP BY table", parameters={"t": list(tables)}).result_rows
for t in tables:
    client.command(f"OPTIMIZE TABLE cgloop.{t} FINAL")  # rewrite every part with the codecs
out["merged"] = answers()
out["codecs"] = client.query(
    "SELECT table, name, compression_codec FROM system.columns WHERE database = 'cgloop'"
    " AND table IN {t:Array(String)}", parameters={"t": list(tables)}).result_rows
out["indexes"] = client.query(
    "SELECT table, name, type_full FROM system.data_skipping_indices"
    " WHERE database = 'cgloop'").result_rows
first = client.query("SELECT toString(min(interval_start)) FROM cgloop.flow_records").result_rows
out["uses_index"] = "\n".join(r[0] for r in client.query(
    "EXPLAIN indexes = 1 SELECT sum(packets) FROM cgloop.flow_records"
    f" WHERE interval_start >= '{first[0][0]}'").result_rows)
print(json.dumps(out, default=str))
"""


def _check_schema(out: dict) -> None:
    codecs = {(t, c): codec for t, c, codec in out["codecs"]}
    # Every column of the big tables has a codec chosen for it (none left at the default).
    assert [k for k, v in codecs.items() if not v] == []
    assert codecs["flow_records", "interval_start"] == "CODEC(DoubleDelta, ZSTD(1))"
    assert codecs["flow_records", "sequence"] == "CODEC(Delta(8), ZSTD(1))"
    assert codecs["flow_records", "packets"] == "CODEC(T64, ZSTD(1))"
    assert codecs["int_hop_records", "egress_tx_utilization"] == "CODEC(Gorilla(8), ZSTD(1))"
    assert codecs["node_samples", "power_watts"] == "CODEC(Gorilla(8), ZSTD(1))"
    assert codecs["actions", "spec"] == "CODEC(ZSTD(3))"
    indexes: dict[str, dict[str, str]] = {}
    for table, name, kind in out["indexes"]:
        indexes.setdefault(table, {})[name] = kind
    assert {t: indexes.get(t) for t in TABLES} == TABLES
    assert indexes["action_results"] == {"idx_time": "minmax"}


def test_0014_on_a_fresh_store_gives_the_big_tables_codecs_and_skip_indexes(
    tmp_path: Path,
) -> None:
    import json

    out = in_own_process(_SCRIPT, str(tmp_path / "store"), "0", "0", json.dumps(list(TABLES)))
    assert out["applied"][-1] == "0014_column_codecs_and_skip_indexes.sql"
    _check_schema(out)


def test_0014_on_a_store_at_0013_keeps_its_rows_and_answers(tmp_path: Path) -> None:
    import json

    out = in_own_process(_SCRIPT, str(tmp_path / "store"), "13", "40", json.dumps(list(TABLES)))
    assert out["applied"] == ["0014_column_codecs_and_skip_indexes.sql"]
    before = out["before"]
    # Rows in every table (else "the same" proves nothing), in several parts each.
    assert all(before[f"{t} all"][0][0] != "0" for t in TABLES), before
    assert all(n >= 2 for _, n in out["parts_before"] if _ in TABLES), out["parts_before"]
    assert before["flows in a range"][0][0] != "0"
    assert out["after"] == before
    assert out["merged"] == before
    assert out["pending_mutations"] == 0
    assert out["parts_without_index"] == []
    assert "idx_interval_start" in out["uses_index"]  # a time range consults the index
    _check_schema(out)
