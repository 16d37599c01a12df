"""StoreWriter's insert settings: a part per block of ~65 k rows a table, whatever the format."""

from __future__ import annotations

from pathlib import Path

from .conftest import in_own_process

# Runs in a process of its own: chDB hosts one data folder per process.
_SCRIPT = r"""
import json, sys
import clickhouse_connect
from cgloop.contracts.samples import sample_flow_record_batch
from cgloop.datasets.records import KINDS
from cgloop.datasets.sink.writer import StoreWriter
from cgloop.datasets.store.migrations import migrate

client = clickhouse_connect.get_client(dsn=f"chdb://{sys.argv[1]}")
migrate(client)
client.command("SYSTEM STOP MERGES")
kind = KINDS["cgloop.flows.v1"]
template = sample_flow_record_batch().records[0]
payloads = []
for m in range(24):  # 120 000 records, each its own flow-second: 120 000 roll-up groups
    batch = type(sample_flow_record_batch())()
    for i in range(m * 5000, (m + 1) * 5000):
        r = batch.records.add()
        r.CopyFrom(template)
        r.header.sequence = i
        r.five_tuple.src_port = 1024 + i % 1000
        r.interval_start_ns = template.interval_start_ns + (i // 1000) * 1_000_000_000
    payloads.append(batch.SerializeToString())
out = {}
for columnar in (True, False):
    writer = StoreWriter(client, columnar=columnar)
    rows = writer.insert(kind, payloads, f"parts/{columnar}")
    parts = client.query(
        "SELECT table, count(), sum(rows) FROM system.parts WHERE database = 'cgloop'"
        " AND active AND table IN ('flow_records', 'flow_stats_1s', 'flow_stats_1m')"
        " GROUP BY table ORDER BY table").result_rows
    out["arrow" if columnar else "protobuf"] = [rows, [list(p) for p in parts]]
    for t in ("flow_records", "flow_stats_1s", "flow_stats_1m"):
        client.command(f"TRUNCATE TABLE cgloop.{t}")
print(json.dumps(out))
"""


def test_an_insert_of_many_flow_seconds_is_not_cut_into_256_parts(tmp_path: Path) -> None:
    """120 000 records, each its own flow-second, in one insert: the roll-up views aggregate
    one level (a two-level GROUP BY hands its table 256 blocks, 256 parts an insert, several
    times slower and a merge backlog), on the Arrow and the protobuf path alike."""
    out = in_own_process(_SCRIPT, str(tmp_path / "store"))
    for path in ("arrow", "protobuf"):
        rows, parts = out[path]
        assert rows == 120_000, path
        by_table = {table: (n, int(r)) for table, n, r in parts}
        assert by_table["flow_records"][1] == 120_000, path
        assert by_table["flow_stats_1s"][1] == 120_000, path
        # Blocks of at most max_block_size (65 409) rows: 2 parts for 120 000 groups.
        assert all(n <= 2 for n, _ in by_table.values()), (path, by_table)
