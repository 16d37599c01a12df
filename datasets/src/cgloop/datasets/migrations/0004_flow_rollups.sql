-- Roll-ups per flow per second and per minute, kept by materialized views as inserts arrive.
-- Quantiles are mergeable t-digest states (p50, p90, p99, p99.9): read them with the -Merge
-- form, e.g. quantilesTDigestIfMerge(0.5, 0.9, 0.99, 0.999)(latency_ns)[3] is the p99, over
-- any set of windows. Sources: flow records give counts, RTP loss and jitter, packet sizes and
-- inter-arrival gaps (log2 histograms, each bucket weighted at its midpoint 1.5 * 2^i); INT
-- flow records give end-to-end latency; INT drop records give dropped packets. The analyst
-- views (next migration) present them finalised.

CREATE TABLE IF NOT EXISTS cgloop.flow_stats_1s (
    window DateTime('UTC'),
    src_addr IPv6,
    dst_addr IPv6,
    src_port UInt16,
    dst_port UInt16,
    ip_protocol UInt8,
    records SimpleAggregateFunction(sum, UInt64),
    packets SimpleAggregateFunction(sum, UInt64),
    bytes SimpleAggregateFunction(sum, UInt64),
    lost_packets SimpleAggregateFunction(sum, UInt64),
    dropped_packets SimpleAggregateFunction(sum, UInt64),
    latency_ns AggregateFunction(quantilesTDigestIf(0.5, 0.9, 0.99, 0.999), UInt64, UInt8),
    jitter_ns AggregateFunction(quantilesTDigestIf(0.5, 0.9, 0.99, 0.999), UInt64, UInt8),
    size_bytes AggregateFunction(quantilesTDigestWeightedArray(0.5, 0.9, 0.99, 0.999), Array(UInt64), Array(UInt64)),
    inter_arrival_ns AggregateFunction(
        quantilesTDigestWeightedArray(0.5, 0.9, 0.99, 0.999), Array(UInt64), Array(UInt64)),
    ingested_at SimpleAggregateFunction(max, DateTime('UTC')) DEFAULT now()
) ENGINE = AggregatingMergeTree
PARTITION BY toDate(window)
ORDER BY (src_addr, dst_addr, src_port, dst_port, ip_protocol, window)
TTL ingested_at + INTERVAL 7 DAY
SETTINGS non_replicated_deduplication_window = 1000;

CREATE TABLE IF NOT EXISTS cgloop.flow_stats_1m (
    window DateTime('UTC'),
    src_addr IPv6,
    dst_addr IPv6,
    src_port UInt16,
    dst_port UInt16,
    ip_protocol UInt8,
    records SimpleAggregateFunction(sum, UInt64),
    packets SimpleAggregateFunction(sum, UInt64),
    bytes SimpleAggregateFunction(sum, UInt64),
    lost_packets SimpleAggregateFunction(sum, UInt64),
    dropped_packets SimpleAggregateFunction(sum, UInt64),
    latency_ns AggregateFunction(quantilesTDigestIf(0.5, 0.9, 0.99, 0.999), UInt64, UInt8),
    jitter_ns AggregateFunction(quantilesTDigestIf(0.5, 0.9, 0.99, 0.999), UInt64, UInt8),
    size_bytes AggregateFunction(quantilesTDigestWeightedArray(0.5, 0.9, 0.99, 0.999), Array(UInt64), Array(UInt64)),
    inter_arrival_ns AggregateFunction(
        quantilesTDigestWeightedArray(0.5, 0.9, 0.99, 0.999), Array(UInt64), Array(UInt64)),
    ingested_at SimpleAggregateFunction(max, DateTime('UTC')) DEFAULT now()
) ENGINE = AggregatingMergeTree
PARTITION BY toDate(window)
ORDER BY (src_addr, dst_addr, src_port, dst_port, ip_protocol, window)
TTL ingested_at + INTERVAL 90 DAY
SETTINGS non_replicated_deduplication_window = 1000;

CREATE MATERIALIZED VIEW IF NOT EXISTS cgloop.flow_stats_1s_from_flows TO cgloop.flow_stats_1s AS
SELECT
    toStartOfSecond(interval_start) AS window,
    src_addr, dst_addr, src_port, dst_port, ip_protocol,
    count() AS records,
    sum(packets) AS packets,
    sum(bytes) AS bytes,
    sum(rtp_lost_packets) AS lost_packets,
    toUInt64(0) AS dropped_packets,
    quantilesTDigestIfState(0.5, 0.9, 0.99, 0.999)(toUInt64(0), toUInt8(0)) AS latency_ns,
    quantilesTDigestIfState(0.5, 0.9, 0.99, 0.999)(rtp_jitter_ns, toUInt8(rtp_clock_rate_hz > 0)) AS jitter_ns,
    quantilesTDigestWeightedArrayState(0.5, 0.9, 0.99, 0.999)(
        arrayMap(i -> toUInt64(if(i = 1, 0, 3 * pow(2, i - 2))), arrayEnumerate(size_histogram_bytes)), size_histogram_bytes) AS size_bytes,
    quantilesTDigestWeightedArrayState(0.5, 0.9, 0.99, 0.999)(
        arrayMap(i -> toUInt64(if(i = 1, 0, 3 * pow(2, i - 2))), arrayEnumerate(inter_arrival_histogram_ns)), inter_arrival_histogram_ns)
        AS inter_arrival_ns
FROM cgloop.flow_records
GROUP BY window, src_addr, dst_addr, src_port, dst_port, ip_protocol;

CREATE MATERIALIZED VIEW IF NOT EXISTS cgloop.flow_stats_1s_from_int TO cgloop.flow_stats_1s AS
SELECT
    toStartOfSecond(time) AS window,
    src_addr, dst_addr, src_port, dst_port, ip_protocol,
    toUInt64(0) AS records,
    toUInt64(0) AS packets,
    toUInt64(0) AS bytes,
    toUInt64(0) AS lost_packets,
    toUInt64(0) AS dropped_packets,
    quantilesTDigestIfState(0.5, 0.9, 0.99, 0.999)(end_to_end_latency_ns, toUInt8(1)) AS latency_ns,
    quantilesTDigestIfState(0.5, 0.9, 0.99, 0.999)(toUInt64(0), toUInt8(0)) AS jitter_ns,
    quantilesTDigestWeightedArrayState(0.5, 0.9, 0.99, 0.999)(
        emptyArrayUInt64(), emptyArrayUInt64()) AS size_bytes,
    quantilesTDigestWeightedArrayState(0.5, 0.9, 0.99, 0.999)(
        emptyArrayUInt64(), emptyArrayUInt64()) AS inter_arrival_ns
FROM cgloop.int_flow_records
GROUP BY window, src_addr, dst_addr, src_port, dst_port, ip_protocol;

CREATE MATERIALIZED VIEW IF NOT EXISTS cgloop.flow_stats_1s_from_drops TO cgloop.flow_stats_1s AS
SELECT
    toStartOfSecond(time) AS window,
    src_addr, dst_addr, src_port, dst_port, ip_protocol,
    toUInt64(0) AS records,
    toUInt64(0) AS packets,
    toUInt64(0) AS bytes,
    toUInt64(0) AS lost_packets,
    sum(drop_count) AS dropped_packets,
    quantilesTDigestIfState(0.5, 0.9, 0.99, 0.999)(toUInt64(0), toUInt8(0)) AS latency_ns,
    quantilesTDigestIfState(0.5, 0.9, 0.99, 0.999)(toUInt64(0), toUInt8(0)) AS jitter_ns,
    quantilesTDigestWeightedArrayState(0.5, 0.9, 0.99, 0.999)(
        emptyArrayUInt64(), emptyArrayUInt64()) AS size_bytes,
    quantilesTDigestWeightedArrayState(0.5, 0.9, 0.99, 0.999)(
        emptyArrayUInt64(), emptyArrayUInt64()) AS inter_arrival_ns
FROM cgloop.int_drop_records
GROUP BY window, src_addr, dst_addr, src_port, dst_port, ip_protocol;

CREATE MATERIALIZED VIEW IF NOT EXISTS cgloop.flow_stats_1m_from_flows TO cgloop.flow_stats_1m AS
SELECT
    toStartOfMinute(interval_start) AS window,
    src_addr, dst_addr, src_port, dst_port, ip_protocol,
    count() AS records,
    sum(packets) AS packets,
    sum(bytes) AS bytes,
    sum(rtp_lost_packets) AS lost_packets,
    toUInt64(0) AS dropped_packets,
    quantilesTDigestIfState(0.5, 0.9, 0.99, 0.999)(toUInt64(0), toUInt8(0)) AS latency_ns,
    quantilesTDigestIfState(0.5, 0.9, 0.99, 0.999)(rtp_jitter_ns, toUInt8(rtp_clock_rate_hz > 0)) AS jitter_ns,
    quantilesTDigestWeightedArrayState(0.5, 0.9, 0.99, 0.999)(
        arrayMap(i -> toUInt64(if(i = 1, 0, 3 * pow(2, i - 2))), arrayEnumerate(size_histogram_bytes)), size_histogram_bytes) AS size_bytes,
    quantilesTDigestWeightedArrayState(0.5, 0.9, 0.99, 0.999)(
        arrayMap(i -> toUInt64(if(i = 1, 0, 3 * pow(2, i - 2))), arrayEnumerate(inter_arrival_histogram_ns)), inter_arrival_histogram_ns)
        AS inter_arrival_ns
FROM cgloop.flow_records
GROUP BY window, src_addr, dst_addr, src_port, dst_port, ip_protocol;

CREATE MATERIALIZED VIEW IF NOT EXISTS cgloop.flow_stats_1m_from_int TO cgloop.flow_stats_1m AS
SELECT
    toStartOfMinute(time) AS window,
    src_addr, dst_addr, src_port, dst_port, ip_protocol,
    toUInt64(0) AS records,
    toUInt64(0) AS packets,
    toUInt64(0) AS bytes,
    toUInt64(0) AS lost_packets,
    toUInt64(0) AS dropped_packets,
    quantilesTDigestIfState(0.5, 0.9, 0.99, 0.999)(end_to_end_latency_ns, toUInt8(1)) AS latency_ns,
    quantilesTDigestIfState(0.5, 0.9, 0.99, 0.999)(toUInt64(0), toUInt8(0)) AS jitter_ns,
    quantilesTDigestWeightedArrayState(0.5, 0.9, 0.99, 0.999)(
        emptyArrayUInt64(), emptyArrayUInt64()) AS size_bytes,
    quantilesTDigestWeightedArrayState(0.5, 0.9, 0.99, 0.999)(
        emptyArrayUInt64(), emptyArrayUInt64()) AS inter_arrival_ns
FROM cgloop.int_flow_records
GROUP BY window, src_addr, dst_addr, src_port, dst_port, ip_protocol;

CREATE MATERIALIZED VIEW IF NOT EXISTS cgloop.flow_stats_1m_from_drops TO cgloop.flow_stats_1m AS
SELECT
    toStartOfMinute(time) AS window,
    src_addr, dst_addr, src_port, dst_port, ip_protocol,
    toUInt64(0) AS records,
    toUInt64(0) AS packets,
    toUInt64(0) AS bytes,
    toUInt64(0) AS lost_packets,
    sum(drop_count) AS dropped_packets,
    quantilesTDigestIfState(0.5, 0.9, 0.99, 0.999)(toUInt64(0), toUInt8(0)) AS latency_ns,
    quantilesTDigestIfState(0.5, 0.9, 0.99, 0.999)(toUInt64(0), toUInt8(0)) AS jitter_ns,
    quantilesTDigestWeightedArrayState(0.5, 0.9, 0.99, 0.999)(
        emptyArrayUInt64(), emptyArrayUInt64()) AS size_bytes,
    quantilesTDigestWeightedArrayState(0.5, 0.9, 0.99, 0.999)(
        emptyArrayUInt64(), emptyArrayUInt64()) AS inter_arrival_ns
FROM cgloop.int_drop_records
GROUP BY window, src_addr, dst_addr, src_port, dst_port, ip_protocol;
