"""The store side of the sink's guarantees: closed minutes catch rows that land after a pass read
the states; a replay completes an insert a crash left half-done."""

from __future__ import annotations

from pathlib import Path

from .conftest import in_own_process

# Runs in a process of its own: chDB hosts one data folder per process. The states of one
# flow-minute are written straight into flow_stats_1m with the ingested_at an insert would
# have given them: the second the insert *started*.
_SCRIPT = r"""
import json, sys
import clickhouse_connect
from cgloop.datasets.store.migrations import migrate
from cgloop.datasets.store.minutes import close_minutes

client = clickhouse_connect.get_client(dsn=f"chdb://{sys.argv[1]}")
migrate(client)
key = "toIPv6('203.0.113.9'), toIPv6('203.0.113.10'), 7, 9, 17"
cols = "window, src_addr, dst_addr, src_port, dst_port, ip_protocol, records, packets, ingested_at"

def states(minute, records, started_s_ago):
    client.command(
        f"INSERT INTO cgloop.flow_stats_1m ({cols})"
        f" SELECT toDateTime('2020-01-01 00:0{minute}:00', 'UTC'), {key}, {records},"
        f" {records * 10}, now() - {started_s_ago}"
    )

read = ("SELECT toString(minute), records, packets FROM cgloop.flow_minutes_closed FINAL"
        " WHERE src_port = 7 ORDER BY minute")
states(0, 5, 600)  # minute 0, written ten minutes ago
states(1, 1, 600)  # minute 1: minute 0 is closed
out = {"first": close_minutes(client)}
out["closed"] = client.query(read).result_rows
# An insert that started five minutes ago (longer than any slack: a loaded machine) commits
# now, after that pass read the states: one more record for minute 0.
states(0, 1, 300)
out["again"] = close_minutes(client)
out["after"] = client.query(read).result_rows
out["idle"] = close_minutes(client)  # nothing changed since: nothing to redo
print(json.dumps(out))
"""


def test_rows_committed_after_a_close_pass_are_finalised_however_long_their_insert_ran(
    tmp_path: Path,
) -> None:
    out = in_own_process(_SCRIPT, str(tmp_path / "store"))
    assert out["first"] == 2  # both minutes ended long ago
    assert out["closed"] == [["2020-01-01 00:00:00", 5, 50], ["2020-01-01 00:01:00", 1, 10]]
    # The late record is in minute 0's finalised row, and minute 0 alone was redone.
    assert out["again"] == 1
    assert out["after"] == [["2020-01-01 00:00:00", 6, 60], ["2020-01-01 00:01:00", 1, 10]]
    assert out["idle"] == 0


_REPLAY = r"""
import json, sys
import clickhouse_connect
from cgloop.contracts.samples import sample_flow_record_batch
from cgloop.datasets.records import KINDS
from cgloop.datasets.sink.writer import StoreWriter
from cgloop.datasets.store.migrations import migrate

client = clickhouse_connect.get_client(dsn=f"chdb://{sys.argv[1]}")
migrate(client)
writer = StoreWriter(client)
kind = KINDS["cgloop.flows.v1"]
batch = sample_flow_record_batch()
count = ("SELECT (SELECT count() FROM cgloop.flow_records),"
         " (SELECT sum(records) FROM cgloop.flow_stats_1m),"
         " (SELECT sum(records) FROM cgloop.flow_stats_1s)")
ddl = client.query("SELECT create_table_query FROM system.tables WHERE database = 'cgloop'"
                   " AND name = 'flow_stats_1m_from_flows'").result_rows[0][0]
# A crash half-way through an insert: the raw rows and the per-second roll-up committed, the
# per-minute roll-up not (its view is away for that insert).
client.command("DROP VIEW cgloop.flow_stats_1m_from_flows")
writer.insert(kind, [batch.SerializeToString()], "g/cgloop.flows.v1/0/0-0")
half = client.query(count).result_rows[0]
client.command(ddl)
# The restarted sink replays the planned chunk with the same token.
writer.insert(kind, [batch.SerializeToString()], "g/cgloop.flows.v1/0/0-0")
replayed = client.query(count).result_rows[0]
writer.insert(kind, [batch.SerializeToString()], "g/cgloop.flows.v1/0/0-0")
again = client.query(count).result_rows[0]
print(json.dumps({"half": half, "replayed": replayed, "again": again}))
"""


def test_a_replay_completes_an_insert_a_crash_left_half_done_and_doubles_nothing(
    tmp_path: Path,
) -> None:
    """What the sink's crash recovery relies on (ClickHouse 26.9's insert deduplication with
    deduplicate_blocks_in_dependent_materialized_views): a table that has the replayed block
    drops it, one that missed it takes it, through the views' chain (flow_records feeds the
    roll-ups)."""
    out = in_own_process(_REPLAY, str(tmp_path / "store"))
    n = out["half"][0]
    assert n >= 1
    assert out["half"] == [n, 0, n]
    assert out["replayed"] == [n, n, n]
    assert out["again"] == [n, n, n]
