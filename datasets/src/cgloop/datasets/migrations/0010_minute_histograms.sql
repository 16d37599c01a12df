-- Per-minute packet-size and inter-arrival quantiles from summed histograms (issue 5, ingest
-- rate). The probe already exports both as log2 histograms (bucket i counts values in
-- [2^i, 2^(i+1)), docs/probe.md); flow_stats_1m turned every bucket into a weighted t-digest
-- point, which cost ~1.1 us per flow record at insert (bench/datasets), the most expensive
-- step of the per-minute roll-up. A histogram summed bucket by bucket is itself a mergeable
-- quantile sketch, and an exact one for what the probe measured: the t-digest only ever saw
-- the bucket midpoints. So the roll-up now keeps the bucket sums (`sumForEach` states, read
-- with sumForEachMerge) and readers take a quantile as the midpoint 1.5 * 2^(i-1) of the
-- bucket i (1-based; bucket 1 reads 0) where the running count first reaches the level, the
-- points the t-digest was fed.
--
-- From this migration on flow_stats_1m.size_bytes / inter_arrival_ns hold empty states; rows
-- written before it keep theirs, and the readers fall back to them where a minute has no
-- histogram. flow_stats_1s.size_bytes / inter_arrival_ns go: empty since 0006 and read by
-- nothing, they still cost two empty t-digest states built and written per flow-second.
-- Run migrations with the sink stopped (`cgloop store migrate` does).

ALTER TABLE cgloop.flow_stats_1s
    DROP COLUMN IF EXISTS size_bytes,
    DROP COLUMN IF EXISTS inter_arrival_ns;

ALTER TABLE cgloop.flow_stats_1m
    ADD COLUMN IF NOT EXISTS size_histogram_bytes AggregateFunction(sumForEach, Array(UInt64))
        AFTER inter_arrival_ns,
    ADD COLUMN IF NOT EXISTS inter_arrival_histogram_ns AggregateFunction(sumForEach, Array(UInt64))
        AFTER size_histogram_bytes;

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
    sumForEachState(size_histogram_bytes) AS size_histogram_bytes,
    sumForEachState(inter_arrival_histogram_ns) AS inter_arrival_histogram_ns
FROM cgloop.flow_records
GROUP BY window, src_addr, dst_addr, src_port, dst_port, ip_protocol;

-- The same columns as before; p50_size_bytes and p99_inter_arrival_ns now come from the
-- histograms (cgloop.datasets.store.minutes.histogram_quantiles writes the same expression).
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
    if(arraySum(s.size_h) = 0, s.size[1],
       arrayMap(i -> if(i <= 1, 0., 3 * pow(2, i - 2)),
                arrayMap(q -> arrayFirstIndex(c -> c >= q * arraySum(s.size_h), arrayCumSum(s.size_h)),
                         [0.5, 0.9, 0.99, 0.999]))[1]) AS p50_size_bytes,
    if(arraySum(s.iat_h) = 0, s.iat[3],
       arrayMap(i -> if(i <= 1, 0., 3 * pow(2, i - 2)),
                arrayMap(q -> arrayFirstIndex(c -> c >= q * arraySum(s.iat_h), arrayCumSum(s.iat_h)),
                         [0.5, 0.9, 0.99, 0.999]))[3]) AS p99_inter_arrival_ns
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
        quantilesTDigestWeightedArrayMerge(0.5, 0.9, 0.99, 0.999)(inter_arrival_ns) AS iat,
        sumForEachMerge(size_histogram_bytes) AS size_h,
        sumForEachMerge(inter_arrival_histogram_ns) AS iat_h
    FROM cgloop.flow_stats_1m
    GROUP BY window, src_addr, dst_addr, src_port, dst_port, ip_protocol
) AS s
LEFT JOIN cgloop.flow_classes AS c
    USING (src_addr, dst_addr, src_port, dst_port, ip_protocol);
