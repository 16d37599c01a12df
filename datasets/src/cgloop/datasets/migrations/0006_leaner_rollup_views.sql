-- Cheaper roll-up maintenance (issue 5, ingest rate). Same tables, same columns, same view
-- names; only the SELECTs of the six roll-up views change:
--
-- * A view no longer computes states it has no data for (`quantilesTDigestIfState(...)(0, 0)`,
--   empty weighted arrays): it leaves those columns out and the table fills them with their
--   default, the empty state, which merges the same way at a fraction of the cost.
-- * flow_stats_1s keeps counts, RTP jitter (from flow records) and latency (from INT): the
--   per-second series dashboards draw. Packet-size and inter-arrival quantiles, which cost
--   as much again per flow per second, are kept per minute only (flow_stats_1m); from this
--   migration on, flow_stats_1s.size_bytes / inter_arrival_ns hold empty states.
--
-- Measured with bench/datasets/bench_datasets.py (old and new views side by side); figures in
-- docs/datasets.md. Dropping and re-creating a view is not atomic: run migrations with the sink
-- stopped (`cgloop store migrate` does).

DROP VIEW IF EXISTS cgloop.flow_stats_1s_from_flows;
CREATE MATERIALIZED VIEW IF NOT EXISTS cgloop.flow_stats_1s_from_flows TO cgloop.flow_stats_1s AS
SELECT
    toStartOfSecond(interval_start) AS window,
    src_addr, dst_addr, src_port, dst_port, ip_protocol,
    count() AS records,
    sum(packets) AS packets,
    sum(bytes) AS bytes,
    sum(rtp_lost_packets) AS lost_packets,
    quantilesTDigestIfState(0.5, 0.9, 0.99, 0.999)(rtp_jitter_ns, toUInt8(rtp_clock_rate_hz > 0)) AS jitter_ns
FROM cgloop.flow_records
GROUP BY window, src_addr, dst_addr, src_port, dst_port, ip_protocol;

DROP VIEW IF EXISTS cgloop.flow_stats_1s_from_int;
CREATE MATERIALIZED VIEW IF NOT EXISTS cgloop.flow_stats_1s_from_int TO cgloop.flow_stats_1s AS
SELECT
    toStartOfSecond(time) AS window,
    src_addr, dst_addr, src_port, dst_port, ip_protocol,
    quantilesTDigestIfState(0.5, 0.9, 0.99, 0.999)(end_to_end_latency_ns, toUInt8(1)) AS latency_ns
FROM cgloop.int_flow_records
GROUP BY window, src_addr, dst_addr, src_port, dst_port, ip_protocol;

DROP VIEW IF EXISTS cgloop.flow_stats_1s_from_drops;
CREATE MATERIALIZED VIEW IF NOT EXISTS cgloop.flow_stats_1s_from_drops TO cgloop.flow_stats_1s AS
SELECT
    toStartOfSecond(time) AS window,
    src_addr, dst_addr, src_port, dst_port, ip_protocol,
    sum(drop_count) AS dropped_packets
FROM cgloop.int_drop_records
GROUP BY window, src_addr, dst_addr, src_port, dst_port, ip_protocol;

-- The histogram bucket i (1-based) is weighted at its midpoint 1.5 * 2^(i-1) (bucket 1: 0).
DROP VIEW IF EXISTS cgloop.flow_stats_1m_from_flows;
CREATE MATERIALIZED VIEW IF NOT EXISTS cgloop.flow_stats_1m_from_flows TO cgloop.flow_stats_1m AS
SELECT
    toStartOfMinute(interval_start) AS window,
    src_addr, dst_addr, src_port, dst_port, ip_protocol,
    count() AS records,
    sum(packets) AS packets,
    sum(bytes) AS bytes,
    sum(rtp_lost_packets) AS lost_packets,
    quantilesTDigestIfState(0.5, 0.9, 0.99, 0.999)(rtp_jitter_ns, toUInt8(rtp_clock_rate_hz > 0)) AS jitter_ns,
    quantilesTDigestWeightedArrayState(0.5, 0.9, 0.99, 0.999)(
        arrayMap(i -> toUInt64(if(i = 1, 0, 3 * pow(2, i - 2))), arrayEnumerate(size_histogram_bytes)), size_histogram_bytes) AS size_bytes,
    quantilesTDigestWeightedArrayState(0.5, 0.9, 0.99, 0.999)(
        arrayMap(i -> toUInt64(if(i = 1, 0, 3 * pow(2, i - 2))), arrayEnumerate(inter_arrival_histogram_ns)), inter_arrival_histogram_ns)
        AS inter_arrival_ns
FROM cgloop.flow_records
GROUP BY window, src_addr, dst_addr, src_port, dst_port, ip_protocol;

DROP VIEW IF EXISTS cgloop.flow_stats_1m_from_int;
CREATE MATERIALIZED VIEW IF NOT EXISTS cgloop.flow_stats_1m_from_int TO cgloop.flow_stats_1m AS
SELECT
    toStartOfMinute(time) AS window,
    src_addr, dst_addr, src_port, dst_port, ip_protocol,
    quantilesTDigestIfState(0.5, 0.9, 0.99, 0.999)(end_to_end_latency_ns, toUInt8(1)) AS latency_ns
FROM cgloop.int_flow_records
GROUP BY window, src_addr, dst_addr, src_port, dst_port, ip_protocol;

DROP VIEW IF EXISTS cgloop.flow_stats_1m_from_drops;
CREATE MATERIALIZED VIEW IF NOT EXISTS cgloop.flow_stats_1m_from_drops TO cgloop.flow_stats_1m AS
SELECT
    toStartOfMinute(time) AS window,
    src_addr, dst_addr, src_port, dst_port, ip_protocol,
    sum(drop_count) AS dropped_packets
FROM cgloop.int_drop_records
GROUP BY window, src_addr, dst_addr, src_port, dst_port, ip_protocol;
