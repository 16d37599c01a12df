-- Per-second RTP jitter as exact quantile states (issue 5, ingest rate). A flow has at most
-- ten records a second at the probe's 100 ms sweep, each carrying one RTP jitter value (RFC
-- 3550's running estimate), so a flow-second holds at most ten values. flow_stats_1s kept them
-- in a t-digest state, whose set-up, insert and serialisation cost ~1.1 us a flow record at
-- insert when every record starts a state of its own (bench/datasets, worst case; an exact
-- state ~0.3), the most expensive single step of the roll-ups. quantilesExact keeps the
-- values: as mergeable over any windows, exact instead of approximate, and a few bytes a
-- flow-second.
-- Its merge grows with the values merged (8 bytes each: one flow over a day is ~7 MB), which
-- suits what reads it, the flow detail dashboard's per-flow percentiles over time; questions
-- over many flows or long ranges read flow_stats_1m or flow_minutes_closed (t-digests).
--
-- An empty exact state reads as 0, not NaN, so `rtp_records` counts the values (records of RTP
-- flows) and tells "no jitter measured" from "jitter 0". Rows written before this migration
-- keep their t-digest in jitter_ns (rtp_records 0); readers fall back to it (dashboards'
-- flow detail panel). From this migration on flow_stats_1s.jitter_ns holds empty states.
-- Run migrations with the sink stopped (`cgloop store migrate` does).

ALTER TABLE cgloop.flow_stats_1s
    ADD COLUMN IF NOT EXISTS rtp_records SimpleAggregateFunction(sum, UInt64) AFTER records,
    ADD COLUMN IF NOT EXISTS jitter_exact_ns
        AggregateFunction(quantilesExactIf(0.5, 0.9, 0.99, 0.999), UInt64, UInt8) AFTER jitter_ns;

DROP VIEW IF EXISTS cgloop.flow_stats_1s_from_flows;
CREATE MATERIALIZED VIEW IF NOT EXISTS cgloop.flow_stats_1s_from_flows TO cgloop.flow_stats_1s AS
SELECT
    toStartOfSecond(interval_start) AS window,
    src_addr, dst_addr, src_port, dst_port, ip_protocol,
    count() AS records,
    countIf(rtp_clock_rate_hz > 0) AS rtp_records,
    sum(packets) AS packets,
    sum(bytes) AS bytes,
    sum(rtp_lost_packets) AS lost_packets,
    quantilesExactIfState(0.5, 0.9, 0.99, 0.999)(rtp_jitter_ns, toUInt8(rtp_clock_rate_hz > 0))
        AS jitter_exact_ns
FROM cgloop.flow_records
GROUP BY window, src_addr, dst_addr, src_port, dst_port, ip_protocol;
