"""Per-minute quantiles: summed histograms since migration 0010, older t-digests before it."""

from __future__ import annotations

from pathlib import Path

from .conftest import in_own_process

# Runs in a process of its own: chDB hosts one data folder per process.
_SCRIPT = r"""
import json, sys
import clickhouse_connect
from cgloop.datasets.store.migrations import migrate
from cgloop.datasets.store.minutes import close_minutes

client = clickhouse_connect.get_client(dsn=f"chdb://{sys.argv[1]}")
migrate(client)
key = "toIPv6('203.0.113.9'), toIPv6('203.0.113.10'), 7, 9, 17"
cols = "window, src_addr, dst_addr, src_port, dst_port, ip_protocol, records"
# A minute written before migration 0010: t-digest states, no histogram.
client.command(
    f"INSERT INTO cgloop.flow_stats_1m ({cols}, size_bytes, inter_arrival_ns)"
    f" SELECT toDateTime('2020-01-01 00:00:00', 'UTC'), {key}, 1,"
    " quantilesTDigestWeightedArrayState(0.5, 0.9, 0.99, 0.999)("
    "  [96, 1536]::Array(UInt64), [9, 1]::Array(UInt64)),"
    " quantilesTDigestWeightedArrayState(0.5, 0.9, 0.99, 0.999)("
    "  [6, 3072]::Array(UInt64), [1, 99]::Array(UInt64))"
)
# One written after: histograms, empty t-digests.
client.command(
    f"INSERT INTO cgloop.flow_stats_1m ({cols}, size_histogram_bytes, inter_arrival_histogram_ns)"
    f" SELECT toDateTime('2020-01-01 00:01:00', 'UTC'), {key}, 1,"
    " sumForEachState([0, 0, 0, 1, 5, 1]::Array(UInt64)),"
    " sumForEachState([0, 0, 99, 0, 0, 0, 0, 0, 0, 0, 0, 1]::Array(UInt64))"
)
read = ("SELECT toString(minute), toString(p50_size_bytes), toString(p99_inter_arrival_ns)"
        " FROM cgloop.{t} WHERE src_port = 7 ORDER BY minute")
out = {"legacy": [str(v) for v in client.query(
    "SELECT quantilesTDigestWeightedArrayMerge(0.5, 0.9, 0.99, 0.999)(size_bytes)[1],"
    " quantilesTDigestWeightedArrayMerge(0.5, 0.9, 0.99, 0.999)(inter_arrival_ns)[3]"
    " FROM cgloop.flow_stats_1m WHERE window = '2020-01-01 00:00:00'").result_rows[0]]}
out["view"] = client.query(read.format(t="flow_minutes")).result_rows
out["closed_count"] = close_minutes(client)
out["closed"] = client.query(read.format(t="flow_minutes_closed FINAL")).result_rows
print(json.dumps(out))
"""


def test_minute_quantiles_read_histograms_and_fall_back_to_older_t_digests(
    tmp_path: Path,
) -> None:
    out = in_own_process(_SCRIPT, str(tmp_path / "store"))
    # The older minute reads its t-digests (whatever they interpolate: not a bucket midpoint).
    legacy = [f"{float(v):g}" for v in out["legacy"]]
    assert legacy == ["256", "3072"]
    # New minute, buckets (1-based) 4: 1, 5: 5, 6: 1 -> running 1, 6, 7: the median (3.5)
    # is in bucket 5, read as 1.5 * 2^4 = 24; gaps: 99 in bucket 3, 1 in bucket 12 -> the
    # p99 (99 of 100) is in bucket 3, 1.5 * 2^2 = 6.
    want = [["2020-01-01 00:00:00", *legacy], ["2020-01-01 00:01:00", "24", "6"]]
    assert out["view"] == want
    assert out["closed_count"] == 2
    assert out["closed"] == want
