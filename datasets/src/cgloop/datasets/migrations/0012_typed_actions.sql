-- Typed actions (issue 18): an Action's parameters are the member of its `spec` oneof named
-- like the operation (ReprioritiseFlowAction ...), an ActionResult's rollback state is
-- `previous` (PreviousState); the map<string,string> `parameters` / `previous_parameters` are
-- deprecated, still read for old records.
--
-- ClickHouse's Protobuf format decodes a oneof's members as ordinary fields: the members not set
-- read as their defaults, so every member gets its flattened ingest columns (the descriptor's
-- paths, `cgloop store schema-diff`) and the views pick the one `operation` names. An empty
-- function message (Forward, DpiDrop) has no column: a `forward` reads as a function with every
-- parameter 0; `optional` fields absent read 0 too.
--
-- The analyst tables keep their columns and gain one JSON text column each: actions.spec (the
-- typed parameters; '' for old rows) and action_results.previous (the typed rollback state).
-- actions.parameters stays the one column that reads both: old rows their map, typed rows the
-- top-level fields of `spec` (values as JSON text). Old rows are not rewritten.
-- Dropping and re-creating the views is not atomic: run migrations with the sink stopped
-- (`cgloop store migrate` does).

ALTER TABLE cgloop.action_ingest ADD COLUMN IF NOT EXISTS action_reprioritise_flow_class_id UInt32;
ALTER TABLE cgloop.action_ingest ADD COLUMN IF NOT EXISTS action_reprioritise_flow_rewrite_dscp UInt32;
ALTER TABLE cgloop.action_ingest ADD COLUMN IF NOT EXISTS action_set_class_rate_class_id UInt32;
ALTER TABLE cgloop.action_ingest ADD COLUMN IF NOT EXISTS action_set_class_rate_rate_bps UInt64;
ALTER TABLE cgloop.action_ingest ADD COLUMN IF NOT EXISTS action_set_class_rate_ceil_bps UInt64;
ALTER TABLE cgloop.action_ingest ADD COLUMN IF NOT EXISTS action_set_chain_chain_id String;
ALTER TABLE cgloop.action_ingest ADD COLUMN IF NOT EXISTS action_set_chain_traffic_class String;
ALTER TABLE cgloop.action_ingest ADD COLUMN IF NOT EXISTS action_set_chain_functions Array(Tuple(
    kind LowCardinality(String), core UInt32, packets UInt64, dropped_packets UInt64,
    acl_proto UInt32, acl_dst_port UInt32, acl_src_port UInt32, mark_dscp UInt32, mark_ecn UInt32, rate_limit_rate_bps UInt64, rate_limit_burst_bytes UInt64, mirror_interface String,
    dpi_depth UInt32, dpi_text String, dpi_hex String, dpi_mark_dscp UInt32));
ALTER TABLE cgloop.action_ingest ADD COLUMN IF NOT EXISTS action_set_chain_base_rtt_us UInt64;
ALTER TABLE cgloop.action_ingest ADD COLUMN IF NOT EXISTS action_set_chain_free_cores Array(UInt32);
ALTER TABLE cgloop.action_ingest ADD COLUMN IF NOT EXISTS action_set_chain_processing_us Array(Float64);
ALTER TABLE cgloop.action_ingest ADD COLUMN IF NOT EXISTS action_set_power_policy_cores Array(UInt32);
ALTER TABLE cgloop.action_ingest ADD COLUMN IF NOT EXISTS action_set_power_policy_min_frequency_khz UInt32;
ALTER TABLE cgloop.action_ingest ADD COLUMN IF NOT EXISTS action_set_power_policy_max_frequency_khz UInt32;
ALTER TABLE cgloop.action_ingest ADD COLUMN IF NOT EXISTS action_set_power_policy_governor String;
ALTER TABLE cgloop.action_ingest ADD COLUMN IF NOT EXISTS action_set_power_policy_xman_mode LowCardinality(String);
ALTER TABLE cgloop.action_ingest ADD COLUMN IF NOT EXISTS action_set_power_policy_latency_critical Array(UInt32);
ALTER TABLE cgloop.action_ingest ADD COLUMN IF NOT EXISTS action_onos_flow_rule_priority UInt32;
ALTER TABLE cgloop.action_ingest ADD COLUMN IF NOT EXISTS action_onos_flow_rule_queue_id UInt32;
ALTER TABLE cgloop.action_ingest ADD COLUMN IF NOT EXISTS action_onos_flow_rule_output_port String;
ALTER TABLE cgloop.action_ingest ADD COLUMN IF NOT EXISTS action_onos_flow_rule_timeout_s UInt32;
ALTER TABLE cgloop.action_ingest ADD COLUMN IF NOT EXISTS action_onos_flow_rule_app_id String;
ALTER TABLE cgloop.action_ingest ADD COLUMN IF NOT EXISTS action_onos_queue_port String;
ALTER TABLE cgloop.action_ingest ADD COLUMN IF NOT EXISTS action_onos_queue_queue_id UInt32;
ALTER TABLE cgloop.action_ingest ADD COLUMN IF NOT EXISTS action_onos_queue_min_rate_bps UInt64;
ALTER TABLE cgloop.action_ingest ADD COLUMN IF NOT EXISTS action_onos_queue_max_rate_bps UInt64;
ALTER TABLE cgloop.action_ingest ADD COLUMN IF NOT EXISTS action_onos_queue_priority UInt32;
ALTER TABLE cgloop.action_ingest ADD COLUMN IF NOT EXISTS action_notify_message String;
ALTER TABLE cgloop.action_ingest ADD COLUMN IF NOT EXISTS action_rollback_flow_class_class_id UInt32;
ALTER TABLE cgloop.action_ingest ADD COLUMN IF NOT EXISTS action_rollback_flow_class_rewrite_dscp UInt32;
ALTER TABLE cgloop.action_ingest ADD COLUMN IF NOT EXISTS action_rollback_class_rate_class_id UInt32;
ALTER TABLE cgloop.action_ingest ADD COLUMN IF NOT EXISTS action_rollback_class_rate_rate_bps UInt64;
ALTER TABLE cgloop.action_ingest ADD COLUMN IF NOT EXISTS action_rollback_class_rate_ceil_bps UInt64;
ALTER TABLE cgloop.action_ingest ADD COLUMN IF NOT EXISTS action_rollback_chain_chain_id String;
ALTER TABLE cgloop.action_ingest ADD COLUMN IF NOT EXISTS action_rollback_chain_traffic_class String;
ALTER TABLE cgloop.action_ingest ADD COLUMN IF NOT EXISTS action_rollback_chain_chain_chain_id String;
ALTER TABLE cgloop.action_ingest ADD COLUMN IF NOT EXISTS action_rollback_chain_chain_traffic_class String;
ALTER TABLE cgloop.action_ingest ADD COLUMN IF NOT EXISTS action_rollback_chain_chain_functions Array(Tuple(
    kind LowCardinality(String), core UInt32, packets UInt64, dropped_packets UInt64,
    acl_proto UInt32, acl_dst_port UInt32, acl_src_port UInt32, mark_dscp UInt32, mark_ecn UInt32, rate_limit_rate_bps UInt64, rate_limit_burst_bytes UInt64, mirror_interface String,
    dpi_depth UInt32, dpi_text String, dpi_hex String, dpi_mark_dscp UInt32));
ALTER TABLE cgloop.action_ingest ADD COLUMN IF NOT EXISTS action_rollback_power_policies_policies Array(Tuple(cores Array(UInt32), governor String, min_frequency_khz UInt32, max_frequency_khz UInt32, xman_mode LowCardinality(String), forbid_cstates Bool));
ALTER TABLE cgloop.action_ingest ADD COLUMN IF NOT EXISTS action_rollback_onos_flow_rule_device_id String;
ALTER TABLE cgloop.action_ingest ADD COLUMN IF NOT EXISTS action_rollback_onos_flow_rule_flow_id String;
ALTER TABLE cgloop.action_ingest ADD COLUMN IF NOT EXISTS result_previous_flow_class_class_id UInt32;
ALTER TABLE cgloop.action_ingest ADD COLUMN IF NOT EXISTS result_previous_flow_class_rewrite_dscp UInt32;
ALTER TABLE cgloop.action_ingest ADD COLUMN IF NOT EXISTS result_previous_class_rate_class_id UInt32;
ALTER TABLE cgloop.action_ingest ADD COLUMN IF NOT EXISTS result_previous_class_rate_rate_bps UInt64;
ALTER TABLE cgloop.action_ingest ADD COLUMN IF NOT EXISTS result_previous_class_rate_ceil_bps UInt64;
ALTER TABLE cgloop.action_ingest ADD COLUMN IF NOT EXISTS result_previous_chain_chain_id String;
ALTER TABLE cgloop.action_ingest ADD COLUMN IF NOT EXISTS result_previous_chain_traffic_class String;
ALTER TABLE cgloop.action_ingest ADD COLUMN IF NOT EXISTS result_previous_chain_chain_chain_id String;
ALTER TABLE cgloop.action_ingest ADD COLUMN IF NOT EXISTS result_previous_chain_chain_traffic_class String;
ALTER TABLE cgloop.action_ingest ADD COLUMN IF NOT EXISTS result_previous_chain_chain_functions Array(Tuple(
    kind LowCardinality(String), core UInt32, packets UInt64, dropped_packets UInt64,
    acl_proto UInt32, acl_dst_port UInt32, acl_src_port UInt32, mark_dscp UInt32, mark_ecn UInt32, rate_limit_rate_bps UInt64, rate_limit_burst_bytes UInt64, mirror_interface String,
    dpi_depth UInt32, dpi_text String, dpi_hex String, dpi_mark_dscp UInt32));
ALTER TABLE cgloop.action_ingest ADD COLUMN IF NOT EXISTS result_previous_power_policies_policies Array(Tuple(cores Array(UInt32), governor String, min_frequency_khz UInt32, max_frequency_khz UInt32, xman_mode LowCardinality(String), forbid_cstates Bool));
ALTER TABLE cgloop.action_ingest ADD COLUMN IF NOT EXISTS result_previous_onos_flow_rule_device_id String;
ALTER TABLE cgloop.action_ingest ADD COLUMN IF NOT EXISTS result_previous_onos_flow_rule_flow_id String;
ALTER TABLE cgloop.action_ingest ADD COLUMN IF NOT EXISTS action_rollback_onos_meter_device_id String;
ALTER TABLE cgloop.action_ingest ADD COLUMN IF NOT EXISTS action_rollback_onos_meter_meter_id String;
ALTER TABLE cgloop.action_ingest ADD COLUMN IF NOT EXISTS action_rollback_onos_intent_app_id String;
ALTER TABLE cgloop.action_ingest ADD COLUMN IF NOT EXISTS action_rollback_onos_intent_key String;
ALTER TABLE cgloop.action_ingest ADD COLUMN IF NOT EXISTS action_onos_meter_unit LowCardinality(String);
ALTER TABLE cgloop.action_ingest ADD COLUMN IF NOT EXISTS action_onos_meter_burst Bool;
ALTER TABLE cgloop.action_ingest ADD COLUMN IF NOT EXISTS action_onos_meter_bands Array(Tuple(
    type LowCardinality(String), rate UInt64, burst_size UInt64, prec UInt32));
ALTER TABLE cgloop.action_ingest ADD COLUMN IF NOT EXISTS action_onos_intent_app_id String;
ALTER TABLE cgloop.action_ingest ADD COLUMN IF NOT EXISTS action_onos_intent_priority UInt32;
ALTER TABLE cgloop.action_ingest ADD COLUMN IF NOT EXISTS action_onos_intent_ingress_device_id String;
ALTER TABLE cgloop.action_ingest ADD COLUMN IF NOT EXISTS action_onos_intent_ingress_port UInt32;
ALTER TABLE cgloop.action_ingest ADD COLUMN IF NOT EXISTS action_onos_intent_egress_device_id String;
ALTER TABLE cgloop.action_ingest ADD COLUMN IF NOT EXISTS action_onos_intent_egress_port UInt32;
ALTER TABLE cgloop.action_ingest ADD COLUMN IF NOT EXISTS result_previous_onos_meter_device_id String;
ALTER TABLE cgloop.action_ingest ADD COLUMN IF NOT EXISTS result_previous_onos_meter_meter_id String;
ALTER TABLE cgloop.action_ingest ADD COLUMN IF NOT EXISTS result_previous_onos_intent_app_id String;
ALTER TABLE cgloop.action_ingest ADD COLUMN IF NOT EXISTS result_previous_onos_intent_key String;

ALTER TABLE cgloop.actions ADD COLUMN IF NOT EXISTS spec String DEFAULT '' AFTER parameters;
ALTER TABLE cgloop.action_results ADD COLUMN IF NOT EXISTS previous String DEFAULT ''
    AFTER previous_parameters;

DROP VIEW IF EXISTS cgloop.actions_mv;
CREATE MATERIALIZED VIEW cgloop.actions_mv TO cgloop.actions AS
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
    -- Old rows: their map; typed rows: the top-level fields of `spec` (JSON text values), so a
    -- reader of `parameters` sees both.
    if(notEmpty(action_parameters), action_parameters,
       CAST(JSONExtractKeysAndValuesRaw(spec), 'Map(String, String)')) AS parameters,
    -- The typed parameters as JSON: the member of Action.spec the operation names (a rollback:
    -- the state it restores); '' for old rows, whose parameters map says it.
    if(notEmpty(action_parameters), '', if(action_rollback_of_action_id != '', multiIf(
        action_operation = 'ACTION_OPERATION_REPRIORITISE_FLOW',
            toJSONString(CAST((action_rollback_flow_class_class_id, action_rollback_flow_class_rewrite_dscp),
                'Tuple(class_id UInt32, rewrite_dscp UInt32)')),
        action_operation = 'ACTION_OPERATION_SET_CLASS_RATE',
            toJSONString(CAST((action_rollback_class_rate_class_id, action_rollback_class_rate_rate_bps,
                action_rollback_class_rate_ceil_bps), 'Tuple(class_id UInt32, rate_bps UInt64, ceil_bps UInt64)')),
        action_operation = 'ACTION_OPERATION_SET_CHAIN',
            toJSONString(CAST((action_rollback_chain_chain_id, action_rollback_chain_traffic_class,
                action_rollback_chain_chain_chain_id, action_rollback_chain_chain_functions),
                'Tuple(chain_id String, traffic_class String, previous_chain_id String, functions '
                || toTypeName(action_rollback_chain_chain_functions) || ')')),
        action_operation = 'ACTION_OPERATION_SET_POWER_POLICY',
            toJSONString(CAST(tuple(action_rollback_power_policies_policies),
                'Tuple(policies ' || toTypeName(action_rollback_power_policies_policies) || ')')),
        action_operation = 'ACTION_OPERATION_ONOS_FLOW_RULE',
            toJSONString(CAST((action_rollback_onos_flow_rule_device_id, action_rollback_onos_flow_rule_flow_id),
                'Tuple(device_id String, flow_id String)')),
        action_operation = 'ACTION_OPERATION_ONOS_METER',
            toJSONString(CAST((action_rollback_onos_meter_device_id,
                action_rollback_onos_meter_meter_id), 'Tuple(device_id String, meter_id String)')),
        action_operation = 'ACTION_OPERATION_ONOS_INTENT',
            toJSONString(CAST((action_rollback_onos_intent_app_id, action_rollback_onos_intent_key),
                'Tuple(app_id String, key String)')),
        ''),
    multiIf(
        action_operation = 'ACTION_OPERATION_REPRIORITISE_FLOW',
            toJSONString(CAST((action_reprioritise_flow_class_id,
                action_reprioritise_flow_rewrite_dscp), 'Tuple(class_id UInt32, rewrite_dscp UInt32)')),
        action_operation = 'ACTION_OPERATION_SET_CLASS_RATE',
            toJSONString(CAST((action_set_class_rate_class_id, action_set_class_rate_rate_bps,
                action_set_class_rate_ceil_bps),
                'Tuple(class_id UInt32, rate_bps UInt64, ceil_bps UInt64)')),
        action_operation = 'ACTION_OPERATION_SET_CHAIN',
            toJSONString(CAST((action_set_chain_chain_id, action_set_chain_traffic_class,
                action_set_chain_functions, action_set_chain_base_rtt_us,
                action_set_chain_free_cores, action_set_chain_processing_us),
                'Tuple(chain_id String, traffic_class String, functions '
                || toTypeName(action_set_chain_functions) || ', base_rtt_us UInt64, '
                || 'free_cores Array(UInt32), processing_us Array(Float64))')),
        action_operation = 'ACTION_OPERATION_SET_POWER_POLICY',
            toJSONString(CAST((action_set_power_policy_cores,
                action_set_power_policy_min_frequency_khz, action_set_power_policy_max_frequency_khz,
                action_set_power_policy_governor, toString(action_set_power_policy_xman_mode),
                action_set_power_policy_latency_critical),
                'Tuple(cores Array(UInt32), min_frequency_khz UInt32, max_frequency_khz UInt32, '
                || 'governor String, xman_mode String, latency_critical Array(UInt32))')),
        action_operation = 'ACTION_OPERATION_ONOS_FLOW_RULE',
            toJSONString(CAST((action_onos_flow_rule_priority, action_onos_flow_rule_queue_id,
                action_onos_flow_rule_output_port, action_onos_flow_rule_timeout_s,
                action_onos_flow_rule_app_id),
                'Tuple(priority UInt32, queue_id UInt32, output_port String, timeout_s UInt32, '
                || 'app_id String)')),
        action_operation = 'ACTION_OPERATION_ONOS_QUEUE',
            toJSONString(CAST((action_onos_queue_port, action_onos_queue_queue_id,
                action_onos_queue_min_rate_bps, action_onos_queue_max_rate_bps,
                action_onos_queue_priority),
                'Tuple(port String, queue_id UInt32, min_rate_bps UInt64, max_rate_bps UInt64, '
                || 'priority UInt32)')),
        action_operation = 'ACTION_OPERATION_NOTIFY',
            toJSONString(CAST(tuple(action_notify_message), 'Tuple(message String)')),
        action_operation = 'ACTION_OPERATION_ONOS_METER',
            toJSONString(CAST((toString(action_onos_meter_unit), action_onos_meter_burst,
                action_onos_meter_bands),
                'Tuple(unit String, burst Bool, bands ' || toTypeName(action_onos_meter_bands)
                || ')')),
        action_operation = 'ACTION_OPERATION_ONOS_INTENT',
            toJSONString(CAST((action_onos_intent_app_id, action_onos_intent_priority,
                (action_onos_intent_ingress_device_id, action_onos_intent_ingress_port),
                (action_onos_intent_egress_device_id, action_onos_intent_egress_port)),
                'Tuple(app_id String, priority UInt32, ingress Tuple(device_id String, '
                || 'port UInt32), egress Tuple(device_id String, port UInt32))')),
        ''))) AS spec,
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

DROP VIEW IF EXISTS cgloop.action_results_mv;
CREATE MATERIALIZED VIEW cgloop.action_results_mv TO cgloop.action_results AS
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
    result_previous_parameters AS previous_parameters,
    -- The typed rollback state as JSON ('' for old rows and results without one).
    multiIf(
            result_previous_flow_class_class_id != 0 OR result_previous_flow_class_rewrite_dscp != 0,
                toJSONString(CAST((result_previous_flow_class_class_id, result_previous_flow_class_rewrite_dscp),
                    'Tuple(class_id UInt32, rewrite_dscp UInt32)')),
            result_previous_class_rate_class_id != 0,
                toJSONString(CAST((result_previous_class_rate_class_id, result_previous_class_rate_rate_bps,
                    result_previous_class_rate_ceil_bps), 'Tuple(class_id UInt32, rate_bps UInt64, ceil_bps UInt64)')),
            result_previous_chain_traffic_class != '',
                toJSONString(CAST((result_previous_chain_chain_id, result_previous_chain_traffic_class,
                    result_previous_chain_chain_chain_id, result_previous_chain_chain_functions),
                    'Tuple(chain_id String, traffic_class String, previous_chain_id String, functions '
                    || toTypeName(result_previous_chain_chain_functions) || ')')),
            notEmpty(result_previous_power_policies_policies),
                toJSONString(CAST(tuple(result_previous_power_policies_policies),
                    'Tuple(policies ' || toTypeName(result_previous_power_policies_policies) || ')')),
            result_previous_onos_flow_rule_flow_id != '',
                toJSONString(CAST((result_previous_onos_flow_rule_device_id, result_previous_onos_flow_rule_flow_id),
                    'Tuple(device_id String, flow_id String)')),
            result_previous_onos_meter_meter_id != '',
                toJSONString(CAST((result_previous_onos_meter_device_id,
                    result_previous_onos_meter_meter_id), 'Tuple(device_id String, meter_id String)')),
            result_previous_onos_intent_key != '',
                toJSONString(CAST((result_previous_onos_intent_app_id,
                    result_previous_onos_intent_key), 'Tuple(app_id String, key String)')),
            '') AS previous
FROM cgloop.action_ingest
WHERE result_header_source_id != '';
