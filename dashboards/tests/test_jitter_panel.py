"""The flow detail dashboard's RTP jitter panel reads exact per-second states (migration 0011)
and falls back to the t-digests of rows written before it, on a real store (chDB)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from cgloop.dashboards.build import PROVISIONED
from cgloop.dashboards.check import TimeRange, Variable, expand_macros, interpolate

S0 = 1_750_000_000  # 2025-06-15 15:06:40 UTC
# One flow: second S0 written before 0011 (a t-digest of 5, 6, 7 ms); S0+1: four RTP records
# through flow_records and its views, plus a non-RTP one the jitter must ignore; S0+2: no RTP.
_SCRIPT = r"""
import json, sys
import clickhouse_connect
from cgloop.datasets.store.migrations import migrate

client = clickhouse_connect.get_client(dsn=f"chdb://{sys.argv[1]}")
migrate(client)
s0 = int(sys.argv[2])
key = "toIPv6('198.51.100.7'), toIPv6('203.0.113.5'), 40000, 51000, 17"
client.command(
    "INSERT INTO cgloop.flow_stats_1s (window, src_addr, dst_addr, src_port, dst_port,"
    " ip_protocol, records, jitter_ns)"
    f" SELECT toDateTime({s0}, 'UTC'), {key}, 3, quantilesTDigestIfState(0.5, 0.9, 0.99, 0.999)("
    "  toUInt64(arrayJoin([5000000, 6000000, 7000000])), toUInt8(1))"
)
rows = [(1, 1, 1_000_000), (1, 2, 2_000_000), (1, 3, 3_000_000), (1, 4, 4_000_000),
        (1, 5, 0), (2, 6, 0)]  # (second, sequence, jitter; 0: not RTP)
values = ", ".join(
    f"('t', {seq}, toDateTime64({s0 + sec} + {seq} / 100, 9, 'UTC'), {key},"
    f" {90000 if jit else 0}, {jit or 99000000})"
    for sec, seq, jit in rows
)
client.command(
    "INSERT INTO cgloop.flow_records (source_id, sequence, interval_start, src_addr, dst_addr,"
    f" src_port, dst_port, ip_protocol, rtp_clock_rate_hz, rtp_jitter_ns) VALUES {values}"
)
out = client.query(sys.argv[3]).result_rows
print(json.dumps([[str(t), *map(float, rest)] for t, *rest in out]))
"""


def _panel_sql(title: str) -> str:
    model = json.loads((PROVISIONED / "flow-detail.json").read_text())
    (panel,) = [p for p in model["panels"] if p.get("title") == title]
    return panel["targets"][0]["rawSql"]


def test_jitter_percentiles_are_exact_per_second_and_older_seconds_keep_their_t_digest(
    tmp_path: Path,
) -> None:
    rng = TimeRange((S0 - 60) * 10**9, (S0 + 60) * 10**9)
    flow = "::ffff:198.51.100.7:40000 > ::ffff:203.0.113.5:51000 / 17"  # as FLOW_KEY spells it
    variables = {"flow": Variable("flow", [flow], multi=False)}
    sql = interpolate(_panel_sql("RTP jitter percentiles"), variables, rng, 1000)
    sql = expand_macros(sql, rng, 1000)
    done = subprocess.run(
        [sys.executable, "-c", _SCRIPT, str(tmp_path / "store"), str(S0), sql],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    # S0: the t-digest of 5/6/7 ms. S0+1: exact over 1..4 ms, quantileExact's element
    # floor(level * n) of the sorted values: p50 3 ms, p90/p99/p99.9 4 ms; the non-RTP record's
    # 99 ms is not among them. S0+2 has no RTP record: no point (not a 0).
    assert got == [
        ["2025-06-15 15:06:40", 6.0, 7.0, 7.0, 7.0],
        ["2025-06-15 15:06:41", 3.0, 4.0, 4.0, 4.0],
    ]
