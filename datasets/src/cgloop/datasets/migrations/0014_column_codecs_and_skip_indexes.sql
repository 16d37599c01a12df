-- Column codecs and skip indexes on the big tables (issue 22, "Storage").
--
-- Codecs, by what a column holds (ClickHouse's default before this was LZ4 on every column):
--   * times, in sort-key order a steady stride per flow/probe/node/switch: DoubleDelta, ZSTD(1);
--     irregular times (detections, actions) and ingested_at: Delta, ZSTD(1|3);
--   * monotonic counters (sequence, probe_sequence, RTP's extended sequence, INT's report
--     sequence): Delta, ZSTD(1);
--   * float gauges (egress utilisation, power, energy, confidence, expected values): Gorilla,
--     ZSTD(1);
--   * small integers (ports, protocol, counts per interval, sizes, latencies in ns, histogram
--     buckets): T64, ZSTD(1);
--   * everything else (addresses, strings, arrays of tuples): ZSTD(1) on the high-volume tables
--     (flows, INT, probes: inserts are the bottleneck), ZSTD(3) on the low-volume ones (node
--     samples, detections, actions).
-- Types do not change (bundles compare names and types, not codecs). A codec change is metadata
-- only: parts written before it keep LZ4 until a merge rewrites them (new inserts and every
-- merge use the new codecs); no data is rewritten here.
--
-- Skip indexes where dashboards and analysts filter and the sort key does not help: the time
-- column every panel's $__timeFilter reads (the sort keys start with source_id and the flow or
-- node, so a time range otherwise prunes only daily partitions) as minmax; addresses analysts
-- pick flows by (dst_addr: third in the flow keys) as bloom_filter; enum-like columns panels
-- filter on (detections.severity, actions.level / operation) as set; values looked up one at
-- a time and not leading a sort key (detections.id, actions.target_node_id) as bloom_filter. Parts written after ADD INDEX carry the index; MATERIALIZE INDEX builds it for
-- the parts already stored, as a background mutation (system.mutations shows it; waiting for it
-- took ~0.7 s per index even on an empty table). Until it is done a part without the index is
-- read whole: results are the same, only slower. All statements are idempotent (IF NOT EXISTS;
-- a repeated MODIFY ... CODEC or MATERIALIZE INDEX does no harm).

ALTER TABLE cgloop.flow_records
    MODIFY COLUMN source_id CODEC(ZSTD(1)),
    MODIFY COLUMN sequence CODEC(Delta, ZSTD(1)),
    MODIFY COLUMN schema_version CODEC(T64, ZSTD(1)),
    MODIFY COLUMN time CODEC(DoubleDelta, ZSTD(1)),
    MODIFY COLUMN src_addr CODEC(ZSTD(1)),
    MODIFY COLUMN dst_addr CODEC(ZSTD(1)),
    MODIFY COLUMN src_port CODEC(T64, ZSTD(1)),
    MODIFY COLUMN dst_port CODEC(T64, ZSTD(1)),
    MODIFY COLUMN ip_protocol CODEC(T64, ZSTD(1)),
    MODIFY COLUMN direction CODEC(ZSTD(1)),
    MODIFY COLUMN vlan_id CODEC(T64, ZSTD(1)),
    MODIFY COLUMN ifindex CODEC(T64, ZSTD(1)),
    MODIFY COLUMN interface_name CODEC(ZSTD(1)),
    MODIFY COLUMN interval_start CODEC(DoubleDelta, ZSTD(1)),
    MODIFY COLUMN interval_end CODEC(DoubleDelta, ZSTD(1)),
    MODIFY COLUMN is_final CODEC(T64, ZSTD(1)),
    MODIFY COLUMN packets CODEC(T64, ZSTD(1)),
    MODIFY COLUMN bytes CODEC(T64, ZSTD(1)),
    MODIFY COLUMN first_seen CODEC(DoubleDelta, ZSTD(1)),
    MODIFY COLUMN last_seen CODEC(DoubleDelta, ZSTD(1)),
    MODIFY COLUMN size_min_bytes CODEC(T64, ZSTD(1)),
    MODIFY COLUMN size_max_bytes CODEC(T64, ZSTD(1)),
    MODIFY COLUMN size_sum_bytes CODEC(T64, ZSTD(1)),
    MODIFY COLUMN size_sum_squares_bytes2 CODEC(T64, ZSTD(1)),
    MODIFY COLUMN size_histogram_bytes CODEC(T64, ZSTD(1)),
    MODIFY COLUMN inter_arrival_histogram_ns CODEC(T64, ZSTD(1)),
    MODIFY COLUMN max_burst_packets CODEC(T64, ZSTD(1)),
    MODIFY COLUMN burst_count CODEC(T64, ZSTD(1)),
    MODIFY COLUMN ecn_not_ect_packets CODEC(T64, ZSTD(1)),
    MODIFY COLUMN ecn_ect0_packets CODEC(T64, ZSTD(1)),
    MODIFY COLUMN ecn_ect1_packets CODEC(T64, ZSTD(1)),
    MODIFY COLUMN ecn_ce_packets CODEC(T64, ZSTD(1)),
    MODIFY COLUMN last_dscp CODEC(T64, ZSTD(1)),
    MODIFY COLUMN tcp_flags_seen CODEC(T64, ZSTD(1)),
    MODIFY COLUMN rtp_ssrc CODEC(ZSTD(1)),
    MODIFY COLUMN rtp_payload_type CODEC(T64, ZSTD(1)),
    MODIFY COLUMN rtp_clock_rate_hz CODEC(T64, ZSTD(1)),
    MODIFY COLUMN rtp_jitter_ns CODEC(T64, ZSTD(1)),
    MODIFY COLUMN rtp_lost_packets CODEC(T64, ZSTD(1)),
    MODIFY COLUMN rtp_reordered_packets CODEC(T64, ZSTD(1)),
    MODIFY COLUMN rtp_sequence_gaps CODEC(T64, ZSTD(1)),
    MODIFY COLUMN rtp_duplicate_packets CODEC(T64, ZSTD(1)),
    MODIFY COLUMN rtp_marker_packets CODEC(T64, ZSTD(1)),
    MODIFY COLUMN rtp_extended_highest_sequence CODEC(Delta, ZSTD(1)),
    MODIFY COLUMN ingested_at CODEC(Delta, ZSTD(1));
ALTER TABLE cgloop.flow_records
    ADD INDEX IF NOT EXISTS idx_interval_start interval_start TYPE minmax GRANULARITY 1,
    ADD INDEX IF NOT EXISTS idx_dst_addr dst_addr TYPE bloom_filter(0.01) GRANULARITY 4;
ALTER TABLE cgloop.flow_records MATERIALIZE INDEX idx_interval_start;
ALTER TABLE cgloop.flow_records MATERIALIZE INDEX idx_dst_addr;

ALTER TABLE cgloop.int_hop_records
    MODIFY COLUMN source_id CODEC(ZSTD(1)),
    MODIFY COLUMN sequence CODEC(Delta, ZSTD(1)),
    MODIFY COLUMN schema_version CODEC(T64, ZSTD(1)),
    MODIFY COLUMN time CODEC(DoubleDelta, ZSTD(1)),
    MODIFY COLUMN src_addr CODEC(ZSTD(1)),
    MODIFY COLUMN dst_addr CODEC(ZSTD(1)),
    MODIFY COLUMN src_port CODEC(T64, ZSTD(1)),
    MODIFY COLUMN dst_port CODEC(T64, ZSTD(1)),
    MODIFY COLUMN ip_protocol CODEC(T64, ZSTD(1)),
    MODIFY COLUMN hop_index CODEC(T64, ZSTD(1)),
    MODIFY COLUMN switch_id CODEC(T64, ZSTD(1)),
    MODIFY COLUMN ingress_port CODEC(T64, ZSTD(1)),
    MODIFY COLUMN egress_port CODEC(T64, ZSTD(1)),
    MODIFY COLUMN hop_latency_ns CODEC(T64, ZSTD(1)),
    MODIFY COLUMN queue_id CODEC(T64, ZSTD(1)),
    MODIFY COLUMN queue_occupancy_cells CODEC(T64, ZSTD(1)),
    MODIFY COLUMN egress_tx_utilization CODEC(Gorilla, ZSTD(1)),
    MODIFY COLUMN ingress_timestamp CODEC(DoubleDelta, ZSTD(1)),
    MODIFY COLUMN egress_timestamp CODEC(DoubleDelta, ZSTD(1)),
    MODIFY COLUMN l2_ingress_port CODEC(T64, ZSTD(1)),
    MODIFY COLUMN l2_egress_port CODEC(T64, ZSTD(1)),
    MODIFY COLUMN buffer_id CODEC(T64, ZSTD(1)),
    MODIFY COLUMN buffer_occupancy_cells CODEC(T64, ZSTD(1)),
    MODIFY COLUMN egress_tx_utilization_raw CODEC(T64, ZSTD(1)),
    MODIFY COLUMN ingested_at CODEC(Delta, ZSTD(1));
ALTER TABLE cgloop.int_hop_records
    ADD INDEX IF NOT EXISTS idx_time time TYPE minmax GRANULARITY 1,
    ADD INDEX IF NOT EXISTS idx_dst_addr dst_addr TYPE bloom_filter(0.01) GRANULARITY 4;
ALTER TABLE cgloop.int_hop_records MATERIALIZE INDEX idx_time;
ALTER TABLE cgloop.int_hop_records MATERIALIZE INDEX idx_dst_addr;

ALTER TABLE cgloop.int_flow_records
    MODIFY COLUMN source_id CODEC(ZSTD(1)),
    MODIFY COLUMN sequence CODEC(Delta, ZSTD(1)),
    MODIFY COLUMN schema_version CODEC(T64, ZSTD(1)),
    MODIFY COLUMN time CODEC(DoubleDelta, ZSTD(1)),
    MODIFY COLUMN src_addr CODEC(ZSTD(1)),
    MODIFY COLUMN dst_addr CODEC(ZSTD(1)),
    MODIFY COLUMN src_port CODEC(T64, ZSTD(1)),
    MODIFY COLUMN dst_port CODEC(T64, ZSTD(1)),
    MODIFY COLUMN ip_protocol CODEC(T64, ZSTD(1)),
    MODIFY COLUMN path_switch_ids CODEC(T64, ZSTD(1)),
    MODIFY COLUMN hops CODEC(ZSTD(1)),
    MODIFY COLUMN end_to_end_latency_ns CODEC(T64, ZSTD(1)),
    MODIFY COLUMN reason CODEC(ZSTD(1)),
    MODIFY COLUMN report_sequence CODEC(Delta, ZSTD(1)),
    MODIFY COLUMN reporter_switch_id CODEC(T64, ZSTD(1)),
    MODIFY COLUMN report_count CODEC(T64, ZSTD(1)),
    MODIFY COLUMN ingested_at CODEC(Delta, ZSTD(1));
ALTER TABLE cgloop.int_flow_records
    ADD INDEX IF NOT EXISTS idx_time time TYPE minmax GRANULARITY 1,
    ADD INDEX IF NOT EXISTS idx_dst_addr dst_addr TYPE bloom_filter(0.01) GRANULARITY 4;
ALTER TABLE cgloop.int_flow_records MATERIALIZE INDEX idx_time;
ALTER TABLE cgloop.int_flow_records MATERIALIZE INDEX idx_dst_addr;

ALTER TABLE cgloop.int_queue_records
    MODIFY COLUMN source_id CODEC(ZSTD(1)),
    MODIFY COLUMN sequence CODEC(Delta, ZSTD(1)),
    MODIFY COLUMN schema_version CODEC(T64, ZSTD(1)),
    MODIFY COLUMN time CODEC(DoubleDelta, ZSTD(1)),
    MODIFY COLUMN switch_id CODEC(T64, ZSTD(1)),
    MODIFY COLUMN egress_port CODEC(T64, ZSTD(1)),
    MODIFY COLUMN queue_id CODEC(T64, ZSTD(1)),
    MODIFY COLUMN queue_occupancy_cells CODEC(T64, ZSTD(1)),
    MODIFY COLUMN queue_latency_ns CODEC(T64, ZSTD(1)),
    MODIFY COLUMN congested CODEC(T64, ZSTD(1)),
    MODIFY COLUMN egress_tx_utilization CODEC(Gorilla, ZSTD(1)),
    MODIFY COLUMN ingested_at CODEC(Delta, ZSTD(1));
ALTER TABLE cgloop.int_queue_records
    ADD INDEX IF NOT EXISTS idx_time time TYPE minmax GRANULARITY 1;
ALTER TABLE cgloop.int_queue_records MATERIALIZE INDEX idx_time;

ALTER TABLE cgloop.int_drop_records
    MODIFY COLUMN source_id CODEC(ZSTD(1)),
    MODIFY COLUMN sequence CODEC(Delta, ZSTD(1)),
    MODIFY COLUMN schema_version CODEC(T64, ZSTD(1)),
    MODIFY COLUMN time CODEC(DoubleDelta, ZSTD(1)),
    MODIFY COLUMN switch_id CODEC(T64, ZSTD(1)),
    MODIFY COLUMN ingress_port CODEC(T64, ZSTD(1)),
    MODIFY COLUMN egress_port CODEC(T64, ZSTD(1)),
    MODIFY COLUMN queue_id CODEC(T64, ZSTD(1)),
    MODIFY COLUMN drop_reason CODEC(T64, ZSTD(1)),
    MODIFY COLUMN drop_count CODEC(T64, ZSTD(1)),
    MODIFY COLUMN src_addr CODEC(ZSTD(1)),
    MODIFY COLUMN dst_addr CODEC(ZSTD(1)),
    MODIFY COLUMN src_port CODEC(T64, ZSTD(1)),
    MODIFY COLUMN dst_port CODEC(T64, ZSTD(1)),
    MODIFY COLUMN ip_protocol CODEC(T64, ZSTD(1)),
    MODIFY COLUMN ingested_at CODEC(Delta, ZSTD(1));
ALTER TABLE cgloop.int_drop_records
    ADD INDEX IF NOT EXISTS idx_time time TYPE minmax GRANULARITY 1;
ALTER TABLE cgloop.int_drop_records MATERIALIZE INDEX idx_time;

ALTER TABLE cgloop.probe_records
    MODIFY COLUMN source_id CODEC(ZSTD(1)),
    MODIFY COLUMN sequence CODEC(Delta, ZSTD(1)),
    MODIFY COLUMN schema_version CODEC(T64, ZSTD(1)),
    MODIFY COLUMN time CODEC(DoubleDelta, ZSTD(1)),
    MODIFY COLUMN probe_id CODEC(ZSTD(1)),
    MODIFY COLUMN method CODEC(ZSTD(1)),
    MODIFY COLUMN source_addr CODEC(ZSTD(1)),
    MODIFY COLUMN target_addr CODEC(ZSTD(1)),
    MODIFY COLUMN source_port CODEC(T64, ZSTD(1)),
    MODIFY COLUMN target_port CODEC(T64, ZSTD(1)),
    MODIFY COLUMN dscp CODEC(T64, ZSTD(1)),
    MODIFY COLUMN ecn CODEC(T64, ZSTD(1)),
    MODIFY COLUMN probe_sequence CODEC(Delta, ZSTD(1)),
    MODIFY COLUMN packet_bytes CODEC(T64, ZSTD(1)),
    MODIFY COLUMN sent CODEC(DoubleDelta, ZSTD(1)),
    MODIFY COLUMN received CODEC(DoubleDelta, ZSTD(1)),
    MODIFY COLUMN rtt_ns CODEC(T64, ZSTD(1)),
    MODIFY COLUMN lost CODEC(T64, ZSTD(1)),
    MODIFY COLUMN overdue CODEC(T64, ZSTD(1)),
    MODIFY COLUMN reply_ttl CODEC(T64, ZSTD(1)),
    MODIFY COLUMN forward_delay_ns CODEC(T64, ZSTD(1)),
    MODIFY COLUMN reverse_delay_ns CODEC(T64, ZSTD(1)),
    MODIFY COLUMN reply_ecn CODEC(T64, ZSTD(1)),
    MODIFY COLUMN ingested_at CODEC(Delta, ZSTD(1));
ALTER TABLE cgloop.probe_records
    ADD INDEX IF NOT EXISTS idx_sent sent TYPE minmax GRANULARITY 1;
ALTER TABLE cgloop.probe_records MATERIALIZE INDEX idx_sent;

ALTER TABLE cgloop.node_samples
    MODIFY COLUMN source_id CODEC(ZSTD(3)),
    MODIFY COLUMN sequence CODEC(Delta, ZSTD(1)),
    MODIFY COLUMN schema_version CODEC(T64, ZSTD(1)),
    MODIFY COLUMN time CODEC(DoubleDelta, ZSTD(1)),
    MODIFY COLUMN node_id CODEC(ZSTD(3)),
    MODIFY COLUMN cores CODEC(ZSTD(3)),
    MODIFY COLUMN functions CODEC(ZSTD(3)),
    MODIFY COLUMN power_watts CODEC(Gorilla, ZSTD(1)),
    MODIFY COLUMN energy_joules CODEC(Gorilla, ZSTD(1)),
    MODIFY COLUMN queues CODEC(ZSTD(3)),
    MODIFY COLUMN micro_loop CODEC(ZSTD(3)),
    MODIFY COLUMN ingested_at CODEC(Delta, ZSTD(1));
ALTER TABLE cgloop.node_samples
    ADD INDEX IF NOT EXISTS idx_time time TYPE minmax GRANULARITY 1;
ALTER TABLE cgloop.node_samples MATERIALIZE INDEX idx_time;

ALTER TABLE cgloop.detections
    MODIFY COLUMN source_id CODEC(ZSTD(3)),
    MODIFY COLUMN sequence CODEC(Delta, ZSTD(1)),
    MODIFY COLUMN schema_version CODEC(T64, ZSTD(1)),
    MODIFY COLUMN time CODEC(Delta, ZSTD(3)),
    MODIFY COLUMN id CODEC(ZSTD(3)),
    MODIFY COLUMN kind CODEC(ZSTD(3)),
    MODIFY COLUMN severity CODEC(ZSTD(3)),
    MODIFY COLUMN confidence CODEC(Gorilla, ZSTD(1)),
    MODIFY COLUMN evidence CODEC(ZSTD(3)),
    MODIFY COLUMN detector CODEC(ZSTD(3)),
    MODIFY COLUMN model_version CODEC(ZSTD(3)),
    MODIFY COLUMN window_start CODEC(Delta, ZSTD(3)),
    MODIFY COLUMN window_end CODEC(Delta, ZSTD(3)),
    MODIFY COLUMN labels CODEC(ZSTD(3)),
    MODIFY COLUMN subject_type CODEC(ZSTD(3)),
    MODIFY COLUMN flow_src_addr CODEC(ZSTD(3)),
    MODIFY COLUMN flow_dst_addr CODEC(ZSTD(3)),
    MODIFY COLUMN flow_src_port CODEC(T64, ZSTD(1)),
    MODIFY COLUMN flow_dst_port CODEC(T64, ZSTD(1)),
    MODIFY COLUMN flow_ip_protocol CODEC(T64, ZSTD(1)),
    MODIFY COLUMN queue_node_id CODEC(ZSTD(3)),
    MODIFY COLUMN queue_interface_name CODEC(ZSTD(3)),
    MODIFY COLUMN queue_id CODEC(T64, ZSTD(1)),
    MODIFY COLUMN node_id CODEC(ZSTD(3)),
    MODIFY COLUMN function_name CODEC(ZSTD(3)),
    MODIFY COLUMN link_src_device_id CODEC(ZSTD(3)),
    MODIFY COLUMN link_src_port CODEC(T64, ZSTD(1)),
    MODIFY COLUMN link_dst_device_id CODEC(ZSTD(3)),
    MODIFY COLUMN link_dst_port CODEC(T64, ZSTD(1)),
    MODIFY COLUMN ingested_at CODEC(Delta, ZSTD(1));
ALTER TABLE cgloop.detections
    ADD INDEX IF NOT EXISTS idx_window_end window_end TYPE minmax GRANULARITY 1,
    ADD INDEX IF NOT EXISTS idx_severity severity TYPE set(16) GRANULARITY 4,
    ADD INDEX IF NOT EXISTS idx_id id TYPE bloom_filter(0.01) GRANULARITY 4;
ALTER TABLE cgloop.detections MATERIALIZE INDEX idx_window_end;
ALTER TABLE cgloop.detections MATERIALIZE INDEX idx_severity;
ALTER TABLE cgloop.detections MATERIALIZE INDEX idx_id;

ALTER TABLE cgloop.actions
    MODIFY COLUMN source_id CODEC(ZSTD(3)),
    MODIFY COLUMN sequence CODEC(Delta, ZSTD(1)),
    MODIFY COLUMN schema_version CODEC(T64, ZSTD(1)),
    MODIFY COLUMN time CODEC(Delta, ZSTD(3)),
    MODIFY COLUMN id CODEC(ZSTD(3)),
    MODIFY COLUMN reason_detection_ids CODEC(ZSTD(3)),
    MODIFY COLUMN policy_id CODEC(ZSTD(3)),
    MODIFY COLUMN level CODEC(ZSTD(3)),
    MODIFY COLUMN target_node_id CODEC(ZSTD(3)),
    MODIFY COLUMN target_interface_name CODEC(ZSTD(3)),
    MODIFY COLUMN target_flow_src_addr CODEC(ZSTD(3)),
    MODIFY COLUMN target_flow_dst_addr CODEC(ZSTD(3)),
    MODIFY COLUMN target_flow_src_port CODEC(T64, ZSTD(1)),
    MODIFY COLUMN target_flow_dst_port CODEC(T64, ZSTD(1)),
    MODIFY COLUMN target_flow_ip_protocol CODEC(T64, ZSTD(1)),
    MODIFY COLUMN target_switch_id CODEC(T64, ZSTD(1)),
    MODIFY COLUMN target_device_id CODEC(ZSTD(3)),
    MODIFY COLUMN target_queue_id CODEC(T64, ZSTD(1)),
    MODIFY COLUMN operation CODEC(ZSTD(3)),
    MODIFY COLUMN parameters CODEC(ZSTD(3)),
    MODIFY COLUMN spec CODEC(ZSTD(3)),
    MODIFY COLUMN cause CODEC(ZSTD(3)),
    MODIFY COLUMN expected_metric CODEC(ZSTD(3)),
    MODIFY COLUMN expected_comparator CODEC(ZSTD(3)),
    MODIFY COLUMN expected_value CODEC(Gorilla, ZSTD(1)),
    MODIFY COLUMN expected_within_ns CODEC(T64, ZSTD(1)),
    MODIFY COLUMN deadline CODEC(Delta, ZSTD(3)),
    MODIFY COLUMN state CODEC(ZSTD(3)),
    MODIFY COLUMN dry_run CODEC(T64, ZSTD(1)),
    MODIFY COLUMN rollback_of_action_id CODEC(ZSTD(3)),
    MODIFY COLUMN ingested_at CODEC(Delta, ZSTD(1));
ALTER TABLE cgloop.actions
    ADD INDEX IF NOT EXISTS idx_time time TYPE minmax GRANULARITY 1,
    ADD INDEX IF NOT EXISTS idx_level level TYPE set(16) GRANULARITY 4,
    ADD INDEX IF NOT EXISTS idx_operation operation TYPE set(64) GRANULARITY 4,
    ADD INDEX IF NOT EXISTS idx_target_node_id target_node_id TYPE bloom_filter(0.01) GRANULARITY 4;
ALTER TABLE cgloop.actions MATERIALIZE INDEX idx_time;
ALTER TABLE cgloop.actions MATERIALIZE INDEX idx_level;
ALTER TABLE cgloop.actions MATERIALIZE INDEX idx_operation;
ALTER TABLE cgloop.actions MATERIALIZE INDEX idx_target_node_id;

-- action_results: read beside actions by the loop panels, `time >= $__fromTime`.
ALTER TABLE cgloop.action_results
    ADD INDEX IF NOT EXISTS idx_time time TYPE minmax GRANULARITY 1;
ALTER TABLE cgloop.action_results MATERIALIZE INDEX idx_time;
