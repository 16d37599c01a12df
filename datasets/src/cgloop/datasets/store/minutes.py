"""Closing flow minutes: finalised per-flow-minute quantiles in `cgloop.flow_minutes_closed`.

`flow_stats_1m` keeps mergeable states (t-digests, summed histograms), which every read must merge
and finalise. A
closed minute's quantiles never change (unless late rows arrive), so `close_minutes` computes
them once: it finds the minutes whose states changed since they were last finalised, keeps those
that are closed (a later minute has data, or the minute ended more than `grace_s` ago), and
inserts their finalised rows. A minute changed when its counters (records, packets, bytes, lost
and dropped packets, summed over the minute) differ from its finalised rows' — whenever the rows
arrived, so an insert that started before a pass and committed after it is caught by the next
pass however long it ran — or when its states were written (`flow_stats_1m.ingested_at`, the
second an insert *started*) after, or up to SLACK_S before, its last finalisation (INT latency
states, which move no counter). Running it again is harmless: a minute already finalised and
not changed since is skipped; one changed is finalised again and the newer version replaces the
older one (ReplacingMergeTree on `finalised_at`). Stateless, so any number of sinks may run it.
"""

from __future__ import annotations

from cgloop.datasets.records import DATABASE
from clickhouse_connect.driver.client import Client

TABLE = f"{DATABASE}.flow_minutes_closed"
GRACE_S = 5
SLACK_S = 10
LEVELS = (0.5, 0.9, 0.99, 0.999)


def histogram_quantiles(histogram: str, fallback: str) -> str:
    """SQL for the p50/p90/p99/p99.9 of a summed log2 histogram (`histogram`, an
    Array(UInt64) expression; bucket i, 1-based, counts values in [2^(i-1), 2^i)): the
    midpoint 1.5 * 2^(i-1) of the bucket where the running count first reaches the level
    (bucket 1 reads 0), as the cgloop.flow_minutes view computes it (migration 0010). A minute
    with no histogram (written before 0010) gives `fallback`, its t-digest quantiles."""
    levels = ", ".join(str(q) for q in LEVELS)
    return (
        f"if(arraySum({histogram}) = 0, {fallback},"
        f" arrayMap(i -> if(i <= 1, 0., 3 * pow(2, i - 2)),"
        f" arrayMap(q -> arrayFirstIndex(c -> c >= q * arraySum({histogram}),"
        f" arrayCumSum({histogram})), [{levels}])))"
    )


# The minutes to (re)finalise: closed, and either their counters differ from those of their
# newest finalised rows (rows committed after a pass read the states: caught whatever the
# insert's duration; under CPU load an insert can outlast the slack) or they were touched
# after their last finalisation or up to SLACK_S before it (ingested_at is the second an
# insert *started*; this covers INT latency states, which change no counter). An unfinalised
# minute joins with done = 1970, so it is always taken.
_COUNTERS = (
    "sum(records) AS records, sum(packets) AS packets, sum(bytes) AS bytes,"
    " sum(lost_packets) AS lost, sum(dropped_packets) AS dropped"
)
_TOUCHED = f"""
SELECT s.window FROM (
    SELECT window, max(ingested_at) AS touched, {_COUNTERS}
    FROM {DATABASE}.flow_stats_1m GROUP BY window
) AS s
LEFT JOIN (
    SELECT minute AS window, max(finalised_at) AS done, {_COUNTERS}
    FROM {TABLE} FINAL GROUP BY window
) AS f USING (window)
WHERE (s.touched + INTERVAL {{slack:UInt32}} SECOND >= f.done
       OR (s.records, s.packets, s.bytes, s.lost, s.dropped)
          != (f.records, f.packets, f.bytes, f.lost, f.dropped))
  AND (s.window < (SELECT max(window) FROM {DATABASE}.flow_stats_1m)
       OR s.window + INTERVAL 60 + {{grace:UInt32}} SECOND <= now())
ORDER BY s.window
"""

_SIZE = histogram_quantiles("size_h", "size_td")
_GAPS = histogram_quantiles("iat_h", "iat_td")
_FINALISE = f"""
INSERT INTO {TABLE} (minute, src_addr, dst_addr, src_port, dst_port, ip_protocol, records,
    packets, bytes, lost_packets, dropped_packets, p50_latency_ns, p90_latency_ns,
    p99_latency_ns, p999_latency_ns, p50_jitter_ns, p90_jitter_ns, p99_jitter_ns,
    p999_jitter_ns, p50_size_bytes, p99_size_bytes, p50_inter_arrival_ns, p99_inter_arrival_ns,
    finalised_at)
SELECT window, src_addr, dst_addr, src_port, dst_port, ip_protocol, records, packets, bytes,
    lost_packets, dropped_packets, latency[1], latency[2], latency[3], latency[4],
    jitter[1], jitter[2], jitter[3], jitter[4], size[1], size[3], iat[1], iat[3],
    {{at:DateTime64(6)}}
FROM (
    SELECT *, {_SIZE} AS size, {_GAPS} AS iat
    FROM (
        SELECT window, src_addr, dst_addr, src_port, dst_port, ip_protocol,
            sum(records) AS records, sum(packets) AS packets, sum(bytes) AS bytes,
            sum(lost_packets) AS lost_packets, sum(dropped_packets) AS dropped_packets,
            quantilesTDigestIfMerge(0.5, 0.9, 0.99, 0.999)(latency_ns) AS latency,
            quantilesTDigestIfMerge(0.5, 0.9, 0.99, 0.999)(jitter_ns) AS jitter,
            sumForEachMerge(size_histogram_bytes) AS size_h,
            sumForEachMerge(inter_arrival_histogram_ns) AS iat_h,
            quantilesTDigestWeightedArrayMerge(0.5, 0.9, 0.99, 0.999)(size_bytes) AS size_td,
            quantilesTDigestWeightedArrayMerge(0.5, 0.9, 0.99, 0.999)(inter_arrival_ns) AS iat_td
        FROM {DATABASE}.flow_stats_1m
        WHERE window IN {{windows:Array(DateTime)}}
        GROUP BY window, src_addr, dst_addr, src_port, dst_port, ip_protocol
    )
)
"""

# Minutes finalised per INSERT: bounds one statement's memory on a large import.
_PER_INSERT = 60


def close_minutes(client: Client, grace_s: int = GRACE_S) -> int:
    """Finalise every closed flow minute not finalised since its last write; return how many
    minutes were (re)finalised. Raises what the client raises (the caller decides whether to
    retry: the next call redoes whatever this one did not finish)."""
    # One version stamp for the pass, from the store's clock (finalised_at is compared with
    # the store's ingested_at), taken before the states are read.
    at = client.query("SELECT now64(6)").result_rows[0][0]
    params = {"grace": grace_s, "slack": SLACK_S}
    windows = [r[0] for r in client.query(_TOUCHED, parameters=params).result_rows]
    if not windows:
        return 0
    for i in range(0, len(windows), _PER_INSERT):
        client.command(_FINALISE, parameters={"windows": windows[i : i + _PER_INSERT], "at": at})
    return len(windows)
