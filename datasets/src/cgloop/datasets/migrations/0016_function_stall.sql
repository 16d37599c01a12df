-- A starved chain function (the lab's function-overload fault): `FunctionCounters` gains
-- `rx_waiting` (frames in the instance's RX ring its worker had not taken at the sample) and
-- `stalled_ns` (how long the worker had made no progress while frames waited; 0 with an empty
-- ring). A worker whose core another task holds reads idle (`busy_ratio`) and loses frames
-- (`rx_dropped`) only once its ring is full; these show it in the first sample.
--
-- `functions` is extended in place as in 0015 (rows stored before read 0 for both: no frames
-- waiting, no stall, which is what an agent before them could not tell apart). The view
-- `node_functions` gains both columns.
-- Dropping and re-creating the views is not atomic: run migrations with the sink stopped
-- (`cgloop store migrate` does).

ALTER TABLE cgloop.node_ingest MODIFY COLUMN functions Array(Tuple(
    function_name String, core UInt32, packets UInt64, forwarded_packets UInt64,
    last_packet_ns UInt64, instance UInt32, busy_ratio Float64, rx_dropped UInt64,
    rx_waiting UInt32, stalled_ns UInt64));

ALTER TABLE cgloop.node_samples MODIFY COLUMN functions Array(Tuple(
    function_name String, core UInt32, packets UInt64, forwarded_packets UInt64,
    last_packet_ns UInt64, instance UInt32, busy_ratio Float64, rx_dropped UInt64,
    rx_waiting UInt32, stalled_ns UInt64))
    CODEC(ZSTD(3));

DROP VIEW IF EXISTS cgloop.node_samples_mv;
CREATE MATERIALIZED VIEW cgloop.node_samples_mv TO cgloop.node_samples AS
SELECT
    header_source_id AS source_id,
    header_sequence AS sequence,
    header_schema_version AS schema_version,
    fromUnixTimestamp64Nano(toInt64(header_timestamp_ns), 'UTC') AS time,
    node_id, cores, functions, power_watts, energy_joules, queues,
    CAST((micro_loop_acting, micro_loop_reason, micro_loop_queue_sample_age_ns,
          micro_loop_protected_flows),
         'Tuple(acting Bool, reason String, queue_sample_age_ns UInt64, protected_flows UInt32)')
        AS micro_loop
FROM cgloop.node_ingest;

-- One row per chain function instance per node sample (0015), with the instance's waiting
-- frames and stall at the sample (gauges, not counters).
CREATE OR REPLACE VIEW cgloop.node_functions AS
SELECT
    source_id, sequence, time, node_id,
    f.function_name AS function_name,
    f.instance AS instance,
    f.core AS core,
    f.packets AS packets,
    f.forwarded_packets AS forwarded_packets,
    f.busy_ratio AS busy_ratio,
    f.rx_dropped AS rx_dropped,
    f.rx_waiting AS rx_waiting,
    f.stalled_ns AS stalled_ns,
    f.last_packet_ns AS last_packet_ns
FROM cgloop.node_samples
ARRAY JOIN functions AS f;
