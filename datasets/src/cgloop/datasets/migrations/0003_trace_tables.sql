-- The tables analysts and detectors read, one per record kind, filled from the ingest tables
-- by materialized views.
--
-- Conventions: plain column names (the record header becomes source_id, sequence, time);
-- times are DateTime64(9, 'UTC') (the `_ns` epoch fields), durations stay integer ns with the
-- unit in the name; addresses are IPv6 (IPv4 as ::ffff:a.b.c.d); enum values are their names.
-- Sort keys follow the questions asked: source, then flow (or switch/queue/node), then time;
-- (source_id, sequence) ends every key so ReplacingMergeTree collapses upstream duplicates.
-- Every table keeps the last 1000 insert-block ids (non_replicated_deduplication_window): the
-- sink's replay of a batch after a crash carries the same dedup token and is dropped on insert,
-- here and in every view fed from it. Daily partitions by event time. TTLs count from
-- ingested_at (not event time), so an imported dataset recorded long ago is not dropped on
-- arrival; the durations are defaults (change one with `cgloop store ttl TABLE DAYS`).

CREATE TABLE IF NOT EXISTS cgloop.flow_records (
    source_id LowCardinality(String),
    sequence UInt64,
    schema_version UInt16,
    time DateTime64(9, 'UTC'),
    src_addr IPv6,
    dst_addr IPv6,
    src_port UInt16,
    dst_port UInt16,
    ip_protocol UInt8,
    direction LowCardinality(String),
    vlan_id UInt16,
    ifindex UInt32,
    interface_name LowCardinality(String),
    interval_start DateTime64(9, 'UTC'),
    interval_end DateTime64(9, 'UTC'),
    is_final Bool,
    packets UInt64,
    bytes UInt64,
    first_seen DateTime64(9, 'UTC'),
    last_seen DateTime64(9, 'UTC'),
    size_min_bytes UInt32,
    size_max_bytes UInt32,
    size_sum_bytes UInt64,
    size_sum_squares_bytes2 UInt64,
    size_histogram_bytes Array(UInt64),
    inter_arrival_histogram_ns Array(UInt64),
    max_burst_packets UInt32,
    burst_count UInt32,
    ecn_not_ect_packets UInt64,
    ecn_ect0_packets UInt64,
    ecn_ect1_packets UInt64,
    ecn_ce_packets UInt64,
    last_dscp UInt8,
    tcp_flags_seen UInt8,
    rtp_ssrc UInt32,
    rtp_payload_type UInt8,
    rtp_clock_rate_hz UInt32,
    rtp_jitter_ns UInt64,
    rtp_lost_packets UInt64,
    rtp_reordered_packets UInt64,
    rtp_sequence_gaps UInt64,
    rtp_duplicate_packets UInt64,
    rtp_marker_packets UInt64,
    rtp_extended_highest_sequence UInt32,
    ingested_at DateTime('UTC') DEFAULT now()
) ENGINE = ReplacingMergeTree
PARTITION BY toDate(interval_start)
ORDER BY (source_id, src_addr, dst_addr, src_port, dst_port, ip_protocol, interval_start, sequence)
TTL ingested_at + INTERVAL 30 DAY
SETTINGS non_replicated_deduplication_window = 1000;

CREATE MATERIALIZED VIEW IF NOT EXISTS cgloop.flow_records_mv TO cgloop.flow_records AS
SELECT
    header_source_id AS source_id,
    header_sequence AS sequence,
    header_schema_version AS schema_version,
    fromUnixTimestamp64Nano(toInt64(header_timestamp_ns), 'UTC') AS time,
    if(length(five_tuple_src_addr) = 4,
       IPv4ToIPv6(reinterpretAsUInt32(reverse(five_tuple_src_addr))),
       CAST(toFixedString(five_tuple_src_addr, 16) AS IPv6)) AS src_addr,
    if(length(five_tuple_dst_addr) = 4,
       IPv4ToIPv6(reinterpretAsUInt32(reverse(five_tuple_dst_addr))),
       CAST(toFixedString(five_tuple_dst_addr, 16) AS IPv6)) AS dst_addr,
    five_tuple_src_port AS src_port,
    five_tuple_dst_port AS dst_port,
    five_tuple_ip_protocol AS ip_protocol,
    direction, vlan_id, ifindex, interface_name,
    fromUnixTimestamp64Nano(toInt64(interval_start_ns), 'UTC') AS interval_start,
    fromUnixTimestamp64Nano(toInt64(interval_end_ns), 'UTC') AS interval_end,
    is_final, packets, bytes,
    fromUnixTimestamp64Nano(toInt64(first_seen_ns), 'UTC') AS first_seen,
    fromUnixTimestamp64Nano(toInt64(last_seen_ns), 'UTC') AS last_seen,
    size_min_bytes, size_max_bytes, size_sum_bytes, size_sum_squares_bytes2,
    size_histogram_bytes_buckets AS size_histogram_bytes,
    inter_arrival_histogram_ns_buckets AS inter_arrival_histogram_ns,
    max_burst_packets, burst_count,
    ecn_not_ect_packets, ecn_ect0_packets, ecn_ect1_packets, ecn_ce_packets,
    last_dscp, tcp_flags_seen,
    rtp_ssrc, rtp_payload_type, rtp_clock_rate_hz, rtp_jitter_ns, rtp_lost_packets,
    rtp_reordered_packets, rtp_sequence_gaps, rtp_duplicate_packets, rtp_marker_packets,
    rtp_extended_highest_sequence
FROM cgloop.flow_ingest;

-- INT: one ingest table, four record kinds (the IntRecord oneof); each view keeps its kind.
CREATE TABLE IF NOT EXISTS cgloop.int_hop_records (
    source_id LowCardinality(String),
    sequence UInt64,
    schema_version UInt16,
    time DateTime64(9, 'UTC'),
    src_addr IPv6,
    dst_addr IPv6,
    src_port UInt16,
    dst_port UInt16,
    ip_protocol UInt8,
    hop_index UInt8,
    switch_id UInt32,
    ingress_port UInt32,
    egress_port UInt32,
    hop_latency_ns UInt64,
    queue_id UInt32,
    queue_occupancy_cells UInt32,
    egress_tx_utilization Float64,
    ingress_timestamp DateTime64(9, 'UTC'),
    egress_timestamp DateTime64(9, 'UTC'),
    ingested_at DateTime('UTC') DEFAULT now()
) ENGINE = ReplacingMergeTree
PARTITION BY toDate(time)
ORDER BY (source_id, switch_id, src_addr, dst_addr, src_port, dst_port, ip_protocol, time, sequence)
TTL ingested_at + INTERVAL 30 DAY
SETTINGS non_replicated_deduplication_window = 1000;

CREATE MATERIALIZED VIEW IF NOT EXISTS cgloop.int_hop_records_mv TO cgloop.int_hop_records AS
SELECT
    hop_header_source_id AS source_id,
    hop_header_sequence AS sequence,
    hop_header_schema_version AS schema_version,
    fromUnixTimestamp64Nano(toInt64(hop_header_timestamp_ns), 'UTC') AS time,
    if(length(hop_five_tuple_src_addr) = 4,
       IPv4ToIPv6(reinterpretAsUInt32(reverse(hop_five_tuple_src_addr))),
       CAST(toFixedString(hop_five_tuple_src_addr, 16) AS IPv6)) AS src_addr,
    if(length(hop_five_tuple_dst_addr) = 4,
       IPv4ToIPv6(reinterpretAsUInt32(reverse(hop_five_tuple_dst_addr))),
       CAST(toFixedString(hop_five_tuple_dst_addr, 16) AS IPv6)) AS dst_addr,
    hop_five_tuple_src_port AS src_port,
    hop_five_tuple_dst_port AS dst_port,
    hop_five_tuple_ip_protocol AS ip_protocol,
    hop_hop_index AS hop_index,
    hop_hop_switch_id AS switch_id,
    hop_hop_ingress_port AS ingress_port,
    hop_hop_egress_port AS egress_port,
    hop_hop_hop_latency_ns AS hop_latency_ns,
    hop_hop_queue_id AS queue_id,
    hop_hop_queue_occupancy_cells AS queue_occupancy_cells,
    hop_hop_egress_tx_utilization AS egress_tx_utilization,
    fromUnixTimestamp64Nano(toInt64(hop_hop_ingress_timestamp_ns), 'UTC') AS ingress_timestamp,
    fromUnixTimestamp64Nano(toInt64(hop_hop_egress_timestamp_ns), 'UTC') AS egress_timestamp
FROM cgloop.int_ingest
WHERE hop_header_source_id != '';

CREATE TABLE IF NOT EXISTS cgloop.int_flow_records (
    source_id LowCardinality(String),
    sequence UInt64,
    schema_version UInt16,
    time DateTime64(9, 'UTC'),
    src_addr IPv6,
    dst_addr IPv6,
    src_port UInt16,
    dst_port UInt16,
    ip_protocol UInt8,
    path_switch_ids Array(UInt32),
    hops Array(Tuple(
        switch_id UInt32, ingress_port UInt32, egress_port UInt32, hop_latency_ns UInt64,
        queue_id UInt32, queue_occupancy_cells UInt32, egress_tx_utilization Float64,
        ingress_timestamp_ns UInt64, egress_timestamp_ns UInt64)),
    end_to_end_latency_ns UInt64,
    reason LowCardinality(String),
    report_sequence UInt32,
    ingested_at DateTime('UTC') DEFAULT now()
) ENGINE = ReplacingMergeTree
PARTITION BY toDate(time)
ORDER BY (source_id, src_addr, dst_addr, src_port, dst_port, ip_protocol, time, sequence)
TTL ingested_at + INTERVAL 30 DAY
SETTINGS non_replicated_deduplication_window = 1000;

CREATE MATERIALIZED VIEW IF NOT EXISTS cgloop.int_flow_records_mv TO cgloop.int_flow_records AS
SELECT
    flow_header_source_id AS source_id,
    flow_header_sequence AS sequence,
    flow_header_schema_version AS schema_version,
    fromUnixTimestamp64Nano(toInt64(flow_header_timestamp_ns), 'UTC') AS time,
    if(length(flow_five_tuple_src_addr) = 4,
       IPv4ToIPv6(reinterpretAsUInt32(reverse(flow_five_tuple_src_addr))),
       CAST(toFixedString(flow_five_tuple_src_addr, 16) AS IPv6)) AS src_addr,
    if(length(flow_five_tuple_dst_addr) = 4,
       IPv4ToIPv6(reinterpretAsUInt32(reverse(flow_five_tuple_dst_addr))),
       CAST(toFixedString(flow_five_tuple_dst_addr, 16) AS IPv6)) AS dst_addr,
    flow_five_tuple_src_port AS src_port,
    flow_five_tuple_dst_port AS dst_port,
    flow_five_tuple_ip_protocol AS ip_protocol,
    flow_path_switch_ids AS path_switch_ids,
    flow_hops AS hops,
    flow_end_to_end_latency_ns AS end_to_end_latency_ns,
    flow_reason AS reason,
    flow_report_sequence AS report_sequence
FROM cgloop.int_ingest
WHERE flow_header_source_id != '';

CREATE TABLE IF NOT EXISTS cgloop.int_queue_records (
    source_id LowCardinality(String),
    sequence UInt64,
    schema_version UInt16,
    time DateTime64(9, 'UTC'),
    switch_id UInt32,
    egress_port UInt32,
    queue_id UInt32,
    queue_occupancy_cells UInt32,
    queue_latency_ns UInt64,
    congested Bool,
    egress_tx_utilization Float64,
    ingested_at DateTime('UTC') DEFAULT now()
) ENGINE = ReplacingMergeTree
PARTITION BY toDate(time)
ORDER BY (source_id, switch_id, egress_port, queue_id, time, sequence)
TTL ingested_at + INTERVAL 30 DAY
SETTINGS non_replicated_deduplication_window = 1000;

CREATE MATERIALIZED VIEW IF NOT EXISTS cgloop.int_queue_records_mv TO cgloop.int_queue_records AS
SELECT
    queue_header_source_id AS source_id,
    queue_header_sequence AS sequence,
    queue_header_schema_version AS schema_version,
    fromUnixTimestamp64Nano(toInt64(queue_header_timestamp_ns), 'UTC') AS time,
    queue_switch_id AS switch_id,
    queue_egress_port AS egress_port,
    queue_queue_id AS queue_id,
    queue_queue_occupancy_cells AS queue_occupancy_cells,
    queue_queue_latency_ns AS queue_latency_ns,
    queue_congested AS congested,
    queue_egress_tx_utilization AS egress_tx_utilization
FROM cgloop.int_ingest
WHERE queue_header_source_id != '';

CREATE TABLE IF NOT EXISTS cgloop.int_drop_records (
    source_id LowCardinality(String),
    sequence UInt64,
    schema_version UInt16,
    time DateTime64(9, 'UTC'),
    switch_id UInt32,
    ingress_port UInt32,
    egress_port UInt32,
    queue_id UInt32,
    drop_reason UInt8,
    drop_count UInt64,
    src_addr IPv6,
    dst_addr IPv6,
    src_port UInt16,
    dst_port UInt16,
    ip_protocol UInt8,
    ingested_at DateTime('UTC') DEFAULT now()
) ENGINE = ReplacingMergeTree
PARTITION BY toDate(time)
ORDER BY (source_id, switch_id, time, sequence)
TTL ingested_at + INTERVAL 30 DAY
SETTINGS non_replicated_deduplication_window = 1000;

CREATE MATERIALIZED VIEW IF NOT EXISTS cgloop.int_drop_records_mv TO cgloop.int_drop_records AS
SELECT
    drop_header_source_id AS source_id,
    drop_header_sequence AS sequence,
    drop_header_schema_version AS schema_version,
    fromUnixTimestamp64Nano(toInt64(drop_header_timestamp_ns), 'UTC') AS time,
    drop_switch_id AS switch_id,
    drop_ingress_port AS ingress_port,
    drop_egress_port AS egress_port,
    drop_queue_id AS queue_id,
    drop_drop_reason AS drop_reason,
    drop_drop_count AS drop_count,
    if(length(drop_five_tuple_src_addr) = 4,
       IPv4ToIPv6(reinterpretAsUInt32(reverse(drop_five_tuple_src_addr))),
       CAST(toFixedString(drop_five_tuple_src_addr, 16) AS IPv6)) AS src_addr,
    if(length(drop_five_tuple_dst_addr) = 4,
       IPv4ToIPv6(reinterpretAsUInt32(reverse(drop_five_tuple_dst_addr))),
       CAST(toFixedString(drop_five_tuple_dst_addr, 16) AS IPv6)) AS dst_addr,
    drop_five_tuple_src_port AS src_port,
    drop_five_tuple_dst_port AS dst_port,
    drop_five_tuple_ip_protocol AS ip_protocol
FROM cgloop.int_ingest
WHERE drop_header_source_id != '';

CREATE TABLE IF NOT EXISTS cgloop.probe_records (
    source_id LowCardinality(String),
    sequence UInt64,
    schema_version UInt16,
    time DateTime64(9, 'UTC'),
    probe_id LowCardinality(String),
    method LowCardinality(String),
    source_addr IPv6,
    target_addr IPv6,
    source_port UInt16,
    target_port UInt16,
    dscp UInt8,
    ecn UInt8,
    probe_sequence UInt64,
    packet_bytes UInt32,
    sent DateTime64(9, 'UTC'),
    received DateTime64(9, 'UTC'),
    rtt_ns UInt64,
    lost Bool,
    reply_ttl UInt8,
    forward_delay_ns UInt64,
    reverse_delay_ns UInt64,
    reply_ecn UInt8,
    ingested_at DateTime('UTC') DEFAULT now()
) ENGINE = ReplacingMergeTree
PARTITION BY toDate(sent)
ORDER BY (source_id, probe_id, sent, sequence)
TTL ingested_at + INTERVAL 30 DAY
SETTINGS non_replicated_deduplication_window = 1000;

CREATE MATERIALIZED VIEW IF NOT EXISTS cgloop.probe_records_mv TO cgloop.probe_records AS
SELECT
    header_source_id AS source_id,
    header_sequence AS sequence,
    header_schema_version AS schema_version,
    fromUnixTimestamp64Nano(toInt64(header_timestamp_ns), 'UTC') AS time,
    probe_id, method,
    if(length(source_addr) = 4,
       IPv4ToIPv6(reinterpretAsUInt32(reverse(source_addr))),
       CAST(toFixedString(source_addr, 16) AS IPv6)) AS source_addr,
    if(length(target_addr) = 4,
       IPv4ToIPv6(reinterpretAsUInt32(reverse(target_addr))),
       CAST(toFixedString(target_addr, 16) AS IPv6)) AS target_addr,
    source_port, target_port, dscp, ecn, probe_sequence, packet_bytes,
    fromUnixTimestamp64Nano(toInt64(sent_ns), 'UTC') AS sent,
    fromUnixTimestamp64Nano(toInt64(received_ns), 'UTC') AS received,
    rtt_ns, lost, reply_ttl, forward_delay_ns, reverse_delay_ns, reply_ecn
FROM cgloop.probe_ingest;

CREATE TABLE IF NOT EXISTS cgloop.node_samples (
    source_id LowCardinality(String),
    sequence UInt64,
    schema_version UInt16,
    time DateTime64(9, 'UTC'),
    node_id LowCardinality(String),
    cores Array(Tuple(
        core UInt32, frequency_khz UInt32, min_frequency_khz UInt32, max_frequency_khz UInt32,
        governor String, utilization Float64)),
    functions Array(Tuple(
        function_name String, core UInt32, packets UInt64, forwarded_packets UInt64,
        last_packet_ns UInt64)),
    power_watts Float64,
    energy_joules Float64,
    ingested_at DateTime('UTC') DEFAULT now()
) ENGINE = ReplacingMergeTree
PARTITION BY toDate(time)
ORDER BY (source_id, node_id, time, sequence)
TTL ingested_at + INTERVAL 30 DAY
SETTINGS non_replicated_deduplication_window = 1000;

CREATE MATERIALIZED VIEW IF NOT EXISTS cgloop.node_samples_mv TO cgloop.node_samples AS
SELECT
    header_source_id AS source_id,
    header_sequence AS sequence,
    header_schema_version AS schema_version,
    fromUnixTimestamp64Nano(toInt64(header_timestamp_ns), 'UTC') AS time,
    node_id, cores, functions, power_watts, energy_joules
FROM cgloop.node_ingest;

CREATE TABLE IF NOT EXISTS cgloop.detections (
    source_id LowCardinality(String),
    sequence UInt64,
    schema_version UInt16,
    time DateTime64(9, 'UTC'),
    id String,
    kind LowCardinality(String),
    severity LowCardinality(String),
    confidence Float64,
    evidence Array(Tuple(
        name String, value Float64, threshold Float64, baseline Float64, unit String)),
    detector LowCardinality(String),
    model_version LowCardinality(String),
    window_start DateTime64(9, 'UTC'),
    window_end DateTime64(9, 'UTC'),
    labels Map(String, String),
    -- the subject (a oneof: only the fields of one subject are set)
    subject_type LowCardinality(String),
    flow_src_addr IPv6,
    flow_dst_addr IPv6,
    flow_src_port UInt16,
    flow_dst_port UInt16,
    flow_ip_protocol UInt8,
    queue_node_id String,
    queue_interface_name String,
    queue_id UInt32,
    node_id String,
    function_name String,
    link_src_device_id String,
    link_src_port UInt32,
    link_dst_device_id String,
    link_dst_port UInt32,
    ingested_at DateTime('UTC') DEFAULT now()
) ENGINE = ReplacingMergeTree
PARTITION BY toDate(window_end)
ORDER BY (source_id, kind, window_end, sequence)
TTL ingested_at + INTERVAL 365 DAY
SETTINGS non_replicated_deduplication_window = 1000;

CREATE MATERIALIZED VIEW IF NOT EXISTS cgloop.detections_mv TO cgloop.detections AS
SELECT
    header_source_id AS source_id,
    header_sequence AS sequence,
    header_schema_version AS schema_version,
    fromUnixTimestamp64Nano(toInt64(header_timestamp_ns), 'UTC') AS time,
    id, kind, severity, confidence, evidence, detector, model_version,
    fromUnixTimestamp64Nano(toInt64(window_start_ns), 'UTC') AS window_start,
    fromUnixTimestamp64Nano(toInt64(window_end_ns), 'UTC') AS window_end,
    labels,
    -- a flow always has its IP protocol number; the address columns are aliased below
    multiIf(flow_ip_protocol != 0, 'flow',
            queue_node_id != '' OR queue_interface_name != '', 'queue',
            node_id != '', 'node',
            function_name != '', 'function',
            link_src_device_id != '' OR link_dst_device_id != '', 'link', '') AS subject_type,
    if(length(flow_src_addr) = 4,
       IPv4ToIPv6(reinterpretAsUInt32(reverse(flow_src_addr))),
       CAST(toFixedString(flow_src_addr, 16) AS IPv6)) AS flow_src_addr,
    if(length(flow_dst_addr) = 4,
       IPv4ToIPv6(reinterpretAsUInt32(reverse(flow_dst_addr))),
       CAST(toFixedString(flow_dst_addr, 16) AS IPv6)) AS flow_dst_addr,
    flow_src_port, flow_dst_port, flow_ip_protocol,
    queue_node_id, queue_interface_name, queue_queue_id AS queue_id,
    node_id, function_name,
    link_src_device_id, link_src_port, link_dst_device_id, link_dst_port
FROM cgloop.detection_ingest;

CREATE TABLE IF NOT EXISTS cgloop.actions (
    source_id LowCardinality(String),
    sequence UInt64,
    schema_version UInt16,
    time DateTime64(9, 'UTC'),
    id String,
    reason_detection_ids Array(String),
    policy_id LowCardinality(String),
    level LowCardinality(String),
    target_node_id String,
    target_interface_name String,
    target_flow_src_addr IPv6,
    target_flow_dst_addr IPv6,
    target_flow_src_port UInt16,
    target_flow_dst_port UInt16,
    target_flow_ip_protocol UInt8,
    target_switch_id UInt32,
    target_device_id String,
    target_queue_id UInt32,
    operation LowCardinality(String),
    parameters Map(String, String),
    expected_metric String,
    expected_comparator LowCardinality(String),
    expected_value Float64,
    expected_within_ns UInt64,
    deadline DateTime64(9, 'UTC'),
    state LowCardinality(String),
    dry_run Bool,
    rollback_of_action_id String,
    ingested_at DateTime('UTC') DEFAULT now()
) ENGINE = ReplacingMergeTree
PARTITION BY toDate(time)
ORDER BY (source_id, id, time, sequence)
TTL ingested_at + INTERVAL 365 DAY
SETTINGS non_replicated_deduplication_window = 1000;

CREATE MATERIALIZED VIEW IF NOT EXISTS cgloop.actions_mv TO cgloop.actions AS
SELECT
    action_header_source_id AS source_id,
    action_header_sequence AS sequence,
    action_header_schema_version AS schema_version,
    fromUnixTimestamp64Nano(toInt64(action_header_timestamp_ns), 'UTC') AS time,
    action_id AS id,
    action_reason_detection_ids AS reason_detection_ids,
    action_policy_id AS policy_id,
    action_level AS level,
    action_target_node_id AS target_node_id,
    action_target_interface_name AS target_interface_name,
    if(length(action_target_flow_src_addr) = 4,
       IPv4ToIPv6(reinterpretAsUInt32(reverse(action_target_flow_src_addr))),
       CAST(toFixedString(action_target_flow_src_addr, 16) AS IPv6)) AS target_flow_src_addr,
    if(length(action_target_flow_dst_addr) = 4,
       IPv4ToIPv6(reinterpretAsUInt32(reverse(action_target_flow_dst_addr))),
       CAST(toFixedString(action_target_flow_dst_addr, 16) AS IPv6)) AS target_flow_dst_addr,
    action_target_flow_src_port AS target_flow_src_port,
    action_target_flow_dst_port AS target_flow_dst_port,
    action_target_flow_ip_protocol AS target_flow_ip_protocol,
    action_target_switch_id AS target_switch_id,
    action_target_device_id AS target_device_id,
    action_target_queue_id AS target_queue_id,
    action_operation AS operation,
    action_parameters AS parameters,
    action_expected_effect_metric AS expected_metric,
    action_expected_effect_comparator AS expected_comparator,
    action_expected_effect_value AS expected_value,
    action_expected_effect_within_ns AS expected_within_ns,
    fromUnixTimestamp64Nano(toInt64(action_deadline_ns), 'UTC') AS deadline,
    action_state AS state,
    action_dry_run AS dry_run,
    action_rollback_of_action_id AS rollback_of_action_id
FROM cgloop.action_ingest
WHERE action_header_source_id != '';

CREATE TABLE IF NOT EXISTS cgloop.action_results (
    source_id LowCardinality(String),
    sequence UInt64,
    schema_version UInt16,
    time DateTime64(9, 'UTC'),
    action_id String,
    state LowCardinality(String),
    verdict LowCardinality(String),
    verified_metric String,
    before_value Float64,
    after_value Float64,
    latency_before Tuple(
        samples UInt64, p50_ns UInt64, p90_ns UInt64, p99_ns UInt64, p999_ns UInt64,
        max_ns UInt64),
    latency_after Tuple(
        samples UInt64, p50_ns UInt64, p90_ns UInt64, p99_ns UInt64, p999_ns UInt64,
        max_ns UInt64),
    verification_detail String,
    message String,
    applied DateTime64(9, 'UTC'),
    apply_latency_ns UInt64,
    detection_to_apply_ns UInt64,
    verified DateTime64(9, 'UTC'),
    previous_parameters Map(String, String),
    ingested_at DateTime('UTC') DEFAULT now()
) ENGINE = ReplacingMergeTree
PARTITION BY toDate(time)
ORDER BY (source_id, action_id, time, sequence)
TTL ingested_at + INTERVAL 365 DAY
SETTINGS non_replicated_deduplication_window = 1000;

CREATE MATERIALIZED VIEW IF NOT EXISTS cgloop.action_results_mv TO cgloop.action_results AS
SELECT
    result_header_source_id AS source_id,
    result_header_sequence AS sequence,
    result_header_schema_version AS schema_version,
    fromUnixTimestamp64Nano(toInt64(result_header_timestamp_ns), 'UTC') AS time,
    result_action_id AS action_id,
    result_state AS state,
    result_verification_verdict AS verdict,
    result_verification_metric AS verified_metric,
    result_verification_before_value AS before_value,
    result_verification_after_value AS after_value,
    tuple(result_verification_latency_before_samples, result_verification_latency_before_p50_ns,
          result_verification_latency_before_p90_ns, result_verification_latency_before_p99_ns,
          result_verification_latency_before_p999_ns, result_verification_latency_before_max_ns)
        AS latency_before,
    tuple(result_verification_latency_after_samples, result_verification_latency_after_p50_ns,
          result_verification_latency_after_p90_ns, result_verification_latency_after_p99_ns,
          result_verification_latency_after_p999_ns, result_verification_latency_after_max_ns)
        AS latency_after,
    result_verification_detail AS verification_detail,
    result_message AS message,
    fromUnixTimestamp64Nano(toInt64(result_applied_ns), 'UTC') AS applied,
    result_apply_latency_ns AS apply_latency_ns,
    result_detection_to_apply_ns AS detection_to_apply_ns,
    fromUnixTimestamp64Nano(toInt64(result_verified_ns), 'UTC') AS verified,
    result_previous_parameters AS previous_parameters
FROM cgloop.action_ingest
WHERE result_header_source_id != '';

CREATE TABLE IF NOT EXISTS cgloop.dead_letters (
    source_id LowCardinality(String),
    sequence UInt64,
    schema_version UInt16,
    time DateTime64(9, 'UTC'),
    topic LowCardinality(String),
    partition Int32,
    offset Int64,
    key String,
    value String,
    reason String,
    consumer_group LowCardinality(String),
    original_time DateTime64(3, 'UTC'),
    ingested_at DateTime('UTC') DEFAULT now()
) ENGINE = ReplacingMergeTree
PARTITION BY toDate(time)
ORDER BY (source_id, topic, time, sequence)
TTL ingested_at + INTERVAL 30 DAY
SETTINGS non_replicated_deduplication_window = 1000;

CREATE MATERIALIZED VIEW IF NOT EXISTS cgloop.dead_letters_mv TO cgloop.dead_letters AS
SELECT
    header_source_id AS source_id,
    header_sequence AS sequence,
    header_schema_version AS schema_version,
    fromUnixTimestamp64Nano(toInt64(header_timestamp_ns), 'UTC') AS time,
    topic, partition, offset, key, value, reason, consumer_group,
    fromUnixTimestamp64Milli(original_timestamp_ms, 'UTC') AS original_time
FROM cgloop.deadletter_ingest;
