-- Finalised per-flow-minute statistics (issue 5, query target): flow_stats_1m keeps mergeable
-- t-digest states, so every read of "p99 per flow per minute" merges and finalises all of them
-- again (~2 s for 834 k flow-minutes). Once a minute is closed its quantiles no longer change,
-- so they are computed once and kept here as plain numbers.
--
-- Written by cgloop.datasets.store.minutes.close_minutes (the sink runs it every few seconds,
-- `cgloop dataset import` after an import): a minute is closed once a later minute has data or
-- its end is more than a few seconds in the past. A minute that receives late rows after it
-- was closed is finalised again from all its states; the newest version wins
-- (ReplacingMergeTree on finalised_at): read with FINAL for exact results before merges.
-- The still-open minute is only in flow_stats_1m / flow_minutes.

CREATE TABLE IF NOT EXISTS cgloop.flow_minutes_closed (
    minute DateTime('UTC'),
    src_addr IPv6,
    dst_addr IPv6,
    src_port UInt16,
    dst_port UInt16,
    ip_protocol UInt8,
    records UInt64,
    packets UInt64,
    bytes UInt64,
    lost_packets UInt64,
    dropped_packets UInt64,
    p50_latency_ns Float32,
    p90_latency_ns Float32,
    p99_latency_ns Float32,
    p999_latency_ns Float32,
    p50_jitter_ns Float32,
    p90_jitter_ns Float32,
    p99_jitter_ns Float32,
    p999_jitter_ns Float32,
    p50_size_bytes Float32,
    p99_size_bytes Float32,
    p50_inter_arrival_ns Float32,
    p99_inter_arrival_ns Float32,
    finalised_at DateTime64(6, 'UTC') DEFAULT now64(6)
) ENGINE = ReplacingMergeTree(finalised_at)
PARTITION BY toDate(minute)
ORDER BY (src_addr, dst_addr, src_port, dst_port, ip_protocol, minute)
TTL toDateTime(finalised_at) + INTERVAL 90 DAY;

-- flow_minutes gave the p90 of packet sizes as p50_size_bytes (index 2 of the quantiles
-- 0.5, 0.9, 0.99, 0.999); it now gives the p50, as flow_minutes_closed does.
CREATE OR REPLACE VIEW cgloop.flow_minutes AS
SELECT
    s.window AS minute,
    s.src_addr AS src_addr,
    s.dst_addr AS dst_addr,
    s.src_port AS src_port,
    s.dst_port AS dst_port,
    s.ip_protocol AS ip_protocol,
    c.platform AS platform,
    s.packets AS packets,
    s.bytes AS bytes,
    s.lost_packets AS lost_packets,
    s.dropped_packets AS dropped_packets,
    s.latency[1] AS p50_latency_ns,
    s.latency[3] AS p99_latency_ns,
    s.latency[4] AS p999_latency_ns,
    s.jitter[1] AS p50_jitter_ns,
    s.jitter[3] AS p99_jitter_ns,
    s.size[1] AS p50_size_bytes,
    s.iat[3] AS p99_inter_arrival_ns
FROM (
    SELECT
        window, src_addr, dst_addr, src_port, dst_port, ip_protocol,
        sum(packets) AS packets,
        sum(bytes) AS bytes,
        sum(lost_packets) AS lost_packets,
        sum(dropped_packets) AS dropped_packets,
        quantilesTDigestIfMerge(0.5, 0.9, 0.99, 0.999)(latency_ns) AS latency,
        quantilesTDigestIfMerge(0.5, 0.9, 0.99, 0.999)(jitter_ns) AS jitter,
        quantilesTDigestWeightedArrayMerge(0.5, 0.9, 0.99, 0.999)(size_bytes) AS size,
        quantilesTDigestWeightedArrayMerge(0.5, 0.9, 0.99, 0.999)(inter_arrival_ns) AS iat
    FROM cgloop.flow_stats_1m
    GROUP BY window, src_addr, dst_addr, src_port, dst_port, ip_protocol
) AS s
LEFT JOIN cgloop.flow_classes AS c
    USING (src_addr, dst_addr, src_port, dst_port, ip_protocol);
