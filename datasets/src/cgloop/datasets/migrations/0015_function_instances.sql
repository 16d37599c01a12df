-- Natif's scale-out of a chain function (issue 20): a node sample reports a user-space
-- (AF_XDP) function once per instance, with that instance's load. `FunctionCounters` gains
-- `instance` (from 0), `busy_ratio` (share of the interval the instance's worker spent
-- processing frames; absent for BPF functions and for an instance's first sample) and
-- `rx_dropped` (frames its socket lost to a full ring, monotonic).
--
-- `functions` keeps being an array of named tuples, extended in place (ClickHouse fills the
-- new elements of stored rows with their defaults: instance 0, busy_ratio 0, rx_dropped 0,
-- which is what an agent before the scale-out meant). busy_ratio is a Float64 like the
-- samples' other optional doubles (power_watts): an absent reading is stored as 0. The view
-- `node_functions` is the array one row per (function, instance).
--
-- Actions: a chain function (`ChainFunction`, in set_chain's parameters, a chain rollback and
-- a result's previous chain) gains `instances` and `instance_cores`; the three ingest columns
-- that carry them are extended the same way, and the actions' typed JSON (migration 0012,
-- which casts to the columns' own types) shows them.
-- Dropping and re-creating the views is not atomic: run migrations with the sink stopped
-- (`cgloop store migrate` does).

ALTER TABLE cgloop.node_ingest MODIFY COLUMN functions Array(Tuple(
    function_name String, core UInt32, packets UInt64, forwarded_packets UInt64,
    last_packet_ns UInt64, instance UInt32, busy_ratio Float64, rx_dropped UInt64));

ALTER TABLE cgloop.node_samples MODIFY COLUMN functions Array(Tuple(
    function_name String, core UInt32, packets UInt64, forwarded_packets UInt64,
    last_packet_ns UInt64, instance UInt32, busy_ratio Float64, rx_dropped UInt64))
    CODEC(ZSTD(3));

ALTER TABLE cgloop.action_ingest MODIFY COLUMN action_set_chain_functions Array(Tuple(
    kind LowCardinality(String), core UInt32, packets UInt64, dropped_packets UInt64,
    instances UInt32, instance_cores Array(UInt32),
    acl_proto UInt32, acl_dst_port UInt32, acl_src_port UInt32, mark_dscp UInt32, mark_ecn UInt32,
    rate_limit_rate_bps UInt64, rate_limit_burst_bytes UInt64, mirror_interface String,
    dpi_depth UInt32, dpi_text String, dpi_hex String, dpi_mark_dscp UInt32));

ALTER TABLE cgloop.action_ingest MODIFY COLUMN action_rollback_chain_chain_functions Array(Tuple(
    kind LowCardinality(String), core UInt32, packets UInt64, dropped_packets UInt64,
    instances UInt32, instance_cores Array(UInt32),
    acl_proto UInt32, acl_dst_port UInt32, acl_src_port UInt32, mark_dscp UInt32, mark_ecn UInt32,
    rate_limit_rate_bps UInt64, rate_limit_burst_bytes UInt64, mirror_interface String,
    dpi_depth UInt32, dpi_text String, dpi_hex String, dpi_mark_dscp UInt32));

ALTER TABLE cgloop.action_ingest MODIFY COLUMN result_previous_chain_chain_functions Array(Tuple(
    kind LowCardinality(String), core UInt32, packets UInt64, dropped_packets UInt64,
    instances UInt32, instance_cores Array(UInt32),
    acl_proto UInt32, acl_dst_port UInt32, acl_src_port UInt32, mark_dscp UInt32, mark_ecn UInt32,
    rate_limit_rate_bps UInt64, rate_limit_burst_bytes UInt64, mirror_interface String,
    dpi_depth UInt32, dpi_text String, dpi_hex String, dpi_mark_dscp UInt32));

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

-- One row per chain function instance per node sample. packets, forwarded_packets and
-- rx_dropped are monotonic while the chain stays (a SetChain restarts packets and
-- forwarded_packets): per-interval values are differences between consecutive rows of one
-- (node, function, instance). busy_ratio is the interval's own.
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
    f.last_packet_ns AS last_packet_ns
FROM cgloop.node_samples
ARRAY JOIN functions AS f;
