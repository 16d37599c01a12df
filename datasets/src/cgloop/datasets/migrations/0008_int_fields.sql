-- INT fields the collector parsed but could not export (issue 4): per hop the level-2
-- interface ids (instruction bit 6), buffer id and occupancy (bit 8) and the raw egress TX
-- utilization (bit 7, before scaling); per flow record the reporting switch and how many
-- reports were folded into the record. Older rows read 0 for all of them.
--
-- The new IntHop fields extend the named tuple of `hops` (metadata-only on the Null ingest
-- table; on int_flow_records existing parts read the new elements as 0).
-- Dropping and re-creating the views is not atomic: run migrations with the sink stopped
-- (`cgloop store migrate` does).

ALTER TABLE cgloop.int_ingest ADD COLUMN IF NOT EXISTS hop_hop_l2_ingress_port UInt32;
ALTER TABLE cgloop.int_ingest ADD COLUMN IF NOT EXISTS hop_hop_l2_egress_port UInt32;
ALTER TABLE cgloop.int_ingest ADD COLUMN IF NOT EXISTS hop_hop_buffer_id UInt32;
ALTER TABLE cgloop.int_ingest ADD COLUMN IF NOT EXISTS hop_hop_buffer_occupancy_cells UInt32;
ALTER TABLE cgloop.int_ingest ADD COLUMN IF NOT EXISTS hop_hop_egress_tx_utilization_raw UInt32;
ALTER TABLE cgloop.int_ingest MODIFY COLUMN flow_hops Array(Tuple(
    switch_id UInt32, ingress_port UInt32, egress_port UInt32, hop_latency_ns UInt64,
    queue_id UInt32, queue_occupancy_cells UInt32, egress_tx_utilization Float64,
    ingress_timestamp_ns UInt64, egress_timestamp_ns UInt64,
    l2_ingress_port UInt32, l2_egress_port UInt32, buffer_id UInt32,
    buffer_occupancy_cells UInt32, egress_tx_utilization_raw UInt32));
ALTER TABLE cgloop.int_ingest ADD COLUMN IF NOT EXISTS flow_reporter_switch_id UInt32;
ALTER TABLE cgloop.int_ingest ADD COLUMN IF NOT EXISTS flow_report_count UInt32;

ALTER TABLE cgloop.int_hop_records ADD COLUMN IF NOT EXISTS l2_ingress_port UInt32 DEFAULT 0 AFTER egress_timestamp;
ALTER TABLE cgloop.int_hop_records ADD COLUMN IF NOT EXISTS l2_egress_port UInt32 DEFAULT 0 AFTER l2_ingress_port;
ALTER TABLE cgloop.int_hop_records ADD COLUMN IF NOT EXISTS buffer_id UInt32 DEFAULT 0 AFTER l2_egress_port;
ALTER TABLE cgloop.int_hop_records ADD COLUMN IF NOT EXISTS buffer_occupancy_cells UInt32 DEFAULT 0 AFTER buffer_id;
ALTER TABLE cgloop.int_hop_records ADD COLUMN IF NOT EXISTS egress_tx_utilization_raw UInt32 DEFAULT 0 AFTER buffer_occupancy_cells;

ALTER TABLE cgloop.int_flow_records MODIFY COLUMN hops Array(Tuple(
    switch_id UInt32, ingress_port UInt32, egress_port UInt32, hop_latency_ns UInt64,
    queue_id UInt32, queue_occupancy_cells UInt32, egress_tx_utilization Float64,
    ingress_timestamp_ns UInt64, egress_timestamp_ns UInt64,
    l2_ingress_port UInt32, l2_egress_port UInt32, buffer_id UInt32,
    buffer_occupancy_cells UInt32, egress_tx_utilization_raw UInt32));
ALTER TABLE cgloop.int_flow_records ADD COLUMN IF NOT EXISTS reporter_switch_id UInt32 DEFAULT 0 AFTER report_sequence;
ALTER TABLE cgloop.int_flow_records ADD COLUMN IF NOT EXISTS report_count UInt32 DEFAULT 0 AFTER reporter_switch_id;

DROP VIEW IF EXISTS cgloop.int_hop_records_mv;
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
    fromUnixTimestamp64Nano(toInt64(hop_hop_egress_timestamp_ns), 'UTC') AS egress_timestamp,
    hop_hop_l2_ingress_port AS l2_ingress_port,
    hop_hop_l2_egress_port AS l2_egress_port,
    hop_hop_buffer_id AS buffer_id,
    hop_hop_buffer_occupancy_cells AS buffer_occupancy_cells,
    hop_hop_egress_tx_utilization_raw AS egress_tx_utilization_raw
FROM cgloop.int_ingest
WHERE hop_header_source_id != '';

DROP VIEW IF EXISTS cgloop.int_flow_records_mv;
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
    flow_report_sequence AS report_sequence,
    flow_reporter_switch_id AS reporter_switch_id,
    flow_report_count AS report_count
FROM cgloop.int_ingest
WHERE flow_header_source_id != '';
