-- The node micro loop (issue 19): what the agent sees of its queues, and what it does alone.
--
-- Node samples: `NodeSample.queues` (one QueueSample per HTB class the agent manages, over the
-- export interval) is kept like the node's other repeated sub-messages (`cores`, `functions`):
-- an array of named tuples in `node_samples.queues`; the view `node_queues` is that array one
-- row per class (ARRAY JOIN), with the tc handle as text. `micro_loop` (MicroLoopStatus) is a
-- named tuple. Rows stored before 0013 read no queues and `micro_loop.acting` false.
--
-- Actions: `cause` (why the agent acted); level ACTION_LEVEL_NODE needs nothing (enum values
-- are stored as their names); the typed JSON of migration 0012 extends to PROTECT_FLOW,
-- QUEUE_PROTECTION_SANCTION and SET_CORE_FREQUENCY, and to the protections a protect_flow
-- restores (`PreviousState.protections`, in a rollback's `spec` and a result's `previous`).
-- Addresses inside JSON are text (IPv4 dotted, IPv6 as ClickHouse prints it).
-- Dropping and re-creating the views is not atomic: run migrations with the sink stopped
-- (`cgloop store migrate` does).

ALTER TABLE cgloop.node_ingest ADD COLUMN IF NOT EXISTS queues Array(Tuple(
    interface_name String, class_id UInt32, class_name String, backlog_bytes UInt64,
    backlog_packets UInt64, max_backlog_bytes UInt64, drops UInt64, overlimits UInt64,
    sent_packets UInt64, sent_bytes UInt64, sojourn_packets UInt64, sojourn_p50_ns UInt64,
    sojourn_p99_ns UInt64, sojourn_max_ns UInt64, qprot_sanctioned_packets UInt64,
    ce_marked_packets UInt64));
ALTER TABLE cgloop.node_ingest ADD COLUMN IF NOT EXISTS micro_loop_acting Bool;
ALTER TABLE cgloop.node_ingest ADD COLUMN IF NOT EXISTS micro_loop_reason String;
ALTER TABLE cgloop.node_ingest ADD COLUMN IF NOT EXISTS micro_loop_queue_sample_age_ns UInt64;
ALTER TABLE cgloop.node_ingest ADD COLUMN IF NOT EXISTS micro_loop_protected_flows UInt32;

ALTER TABLE cgloop.node_samples ADD COLUMN IF NOT EXISTS queues Array(Tuple(
    interface_name String, class_id UInt32, class_name String, backlog_bytes UInt64,
    backlog_packets UInt64, max_backlog_bytes UInt64, drops UInt64, overlimits UInt64,
    sent_packets UInt64, sent_bytes UInt64, sojourn_packets UInt64, sojourn_p50_ns UInt64,
    sojourn_p99_ns UInt64, sojourn_max_ns UInt64, qprot_sanctioned_packets UInt64,
    ce_marked_packets UInt64)) AFTER energy_joules;
ALTER TABLE cgloop.node_samples ADD COLUMN IF NOT EXISTS micro_loop Tuple(
    acting Bool, reason String, queue_sample_age_ns UInt64, protected_flows UInt32)
    AFTER queues;

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

-- One row per class per node sample. Counters (drops, overlimits, sent_*) are the kernel's,
-- monotonic while the class lives: per-interval values are differences between a class's
-- consecutive rows. Sojourn percentiles, sanctions and CE marks are the interval's own.
CREATE OR REPLACE VIEW cgloop.node_queues AS
SELECT
    source_id, sequence, time, node_id,
    q.interface_name AS interface_name,
    q.class_id AS class_id,
    -- tc's notation: major:minor in hex without leading zeros, e.g. 65600 -> '1:40'
    concat(replaceRegexpOne(lower(hex(bitShiftRight(q.class_id, 16))), '^0+(.)', '\\1'), ':',
           replaceRegexpOne(lower(hex(bitAnd(q.class_id, 65535))), '^0+(.)', '\\1'))
        AS class_handle,
    q.class_name AS class_name,
    q.backlog_bytes AS backlog_bytes,
    q.backlog_packets AS backlog_packets,
    q.max_backlog_bytes AS max_backlog_bytes,
    q.drops AS drops,
    q.overlimits AS overlimits,
    q.sent_packets AS sent_packets,
    q.sent_bytes AS sent_bytes,
    q.sojourn_packets AS sojourn_packets,
    q.sojourn_p50_ns AS sojourn_p50_ns,
    q.sojourn_p99_ns AS sojourn_p99_ns,
    q.sojourn_max_ns AS sojourn_max_ns,
    q.qprot_sanctioned_packets AS qprot_sanctioned_packets,
    q.ce_marked_packets AS ce_marked_packets
FROM cgloop.node_samples
ARRAY JOIN queues AS q;

ALTER TABLE cgloop.action_ingest ADD COLUMN IF NOT EXISTS action_protect_flow_latency_slo_ns UInt64;
ALTER TABLE cgloop.action_ingest ADD COLUMN IF NOT EXISTS action_protect_flow_class_id UInt32;
ALTER TABLE cgloop.action_ingest ADD COLUMN IF NOT EXISTS action_protect_flow_rewrite_dscp UInt32;
ALTER TABLE cgloop.action_ingest ADD COLUMN IF NOT EXISTS action_protect_flow_ttl_ns UInt64;
ALTER TABLE cgloop.action_ingest ADD COLUMN IF NOT EXISTS action_queue_protection_sanction_from_class_id UInt32;
ALTER TABLE cgloop.action_ingest ADD COLUMN IF NOT EXISTS action_queue_protection_sanction_to_class_id UInt32;
ALTER TABLE cgloop.action_ingest ADD COLUMN IF NOT EXISTS action_queue_protection_sanction_sanctioned_packets UInt64;
ALTER TABLE cgloop.action_ingest ADD COLUMN IF NOT EXISTS action_queue_protection_sanction_sanctioned_bytes UInt64;
ALTER TABLE cgloop.action_ingest ADD COLUMN IF NOT EXISTS action_queue_protection_sanction_interval_start_ns UInt64;
ALTER TABLE cgloop.action_ingest ADD COLUMN IF NOT EXISTS action_queue_protection_sanction_interval_end_ns UInt64;
ALTER TABLE cgloop.action_ingest ADD COLUMN IF NOT EXISTS action_queue_protection_sanction_max_score_us Float64;
ALTER TABLE cgloop.action_ingest ADD COLUMN IF NOT EXISTS action_queue_protection_sanction_max_queue_delay_ns UInt64;
ALTER TABLE cgloop.action_ingest ADD COLUMN IF NOT EXISTS action_set_core_frequency_core UInt32;
ALTER TABLE cgloop.action_ingest ADD COLUMN IF NOT EXISTS action_set_core_frequency_min_frequency_khz UInt32;
ALTER TABLE cgloop.action_ingest ADD COLUMN IF NOT EXISTS action_set_core_frequency_max_frequency_khz UInt32;
ALTER TABLE cgloop.action_ingest ADD COLUMN IF NOT EXISTS action_set_core_frequency_previous_min_frequency_khz UInt32;
ALTER TABLE cgloop.action_ingest ADD COLUMN IF NOT EXISTS action_set_core_frequency_previous_max_frequency_khz UInt32;
ALTER TABLE cgloop.action_ingest ADD COLUMN IF NOT EXISTS action_set_core_frequency_xman_mode String;
ALTER TABLE cgloop.action_ingest ADD COLUMN IF NOT EXISTS action_cause String;
ALTER TABLE cgloop.action_ingest ADD COLUMN IF NOT EXISTS action_rollback_protections_flows Array(Tuple(
    interface_name String, flow_src_addr String, flow_dst_addr String, flow_src_port UInt32,
    flow_dst_port UInt32, flow_ip_protocol UInt32, latency_slo_ns UInt64, class_id UInt32,
    rewrite_dscp UInt32, ttl_ns UInt64, expires_ns UInt64, promoted Bool, promotions UInt64));
ALTER TABLE cgloop.action_ingest ADD COLUMN IF NOT EXISTS result_previous_protections_flows Array(Tuple(
    interface_name String, flow_src_addr String, flow_dst_addr String, flow_src_port UInt32,
    flow_dst_port UInt32, flow_ip_protocol UInt32, latency_slo_ns UInt64, class_id UInt32,
    rewrite_dscp UInt32, ttl_ns UInt64, expires_ns UInt64, promoted Bool, promotions UInt64));

ALTER TABLE cgloop.actions ADD COLUMN IF NOT EXISTS cause String DEFAULT '' AFTER spec;

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
        action_operation = 'ACTION_OPERATION_PROTECT_FLOW',
            toJSONString(CAST(tuple(arrayMap(f -> (f.interface_name,
                (if(length(f.flow_src_addr) = 4,
                    IPv4NumToString(reinterpretAsUInt32(reverse(f.flow_src_addr))),
                    IPv6NumToString(toFixedString(f.flow_src_addr, 16))),
                 if(length(f.flow_dst_addr) = 4,
                     IPv4NumToString(reinterpretAsUInt32(reverse(f.flow_dst_addr))),
                     IPv6NumToString(toFixedString(f.flow_dst_addr, 16))),
                 f.flow_src_port, f.flow_dst_port, f.flow_ip_protocol),
                f.latency_slo_ns, f.class_id, f.rewrite_dscp, f.ttl_ns, f.expires_ns, f.promoted,
                f.promotions), action_rollback_protections_flows)),
                'Tuple(flows Array(Tuple(interface_name String, flow Tuple(src_addr String, '
                || 'dst_addr String, src_port UInt32, dst_port UInt32, ip_protocol UInt32), '
                || 'latency_slo_ns UInt64, class_id UInt32, rewrite_dscp UInt32, ttl_ns UInt64, '
                || 'expires_ns UInt64, promoted Bool, promotions UInt64)))')),
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
        action_operation = 'ACTION_OPERATION_PROTECT_FLOW',
            toJSONString(CAST((action_protect_flow_latency_slo_ns, action_protect_flow_class_id,
                action_protect_flow_rewrite_dscp, action_protect_flow_ttl_ns),
                'Tuple(latency_slo_ns UInt64, class_id UInt32, rewrite_dscp UInt32, ttl_ns UInt64)')),
        action_operation = 'ACTION_OPERATION_QUEUE_PROTECTION_SANCTION',
            toJSONString(CAST((action_queue_protection_sanction_from_class_id,
                action_queue_protection_sanction_to_class_id,
                action_queue_protection_sanction_sanctioned_packets,
                action_queue_protection_sanction_sanctioned_bytes,
                action_queue_protection_sanction_interval_start_ns,
                action_queue_protection_sanction_interval_end_ns,
                action_queue_protection_sanction_max_score_us,
                action_queue_protection_sanction_max_queue_delay_ns),
                'Tuple(from_class_id UInt32, to_class_id UInt32, sanctioned_packets UInt64, '
                || 'sanctioned_bytes UInt64, interval_start_ns UInt64, interval_end_ns UInt64, '
                || 'max_score_us Float64, max_queue_delay_ns UInt64)')),
        action_operation = 'ACTION_OPERATION_SET_CORE_FREQUENCY',
            toJSONString(CAST((action_set_core_frequency_core,
                action_set_core_frequency_min_frequency_khz,
                action_set_core_frequency_max_frequency_khz,
                action_set_core_frequency_previous_min_frequency_khz,
                action_set_core_frequency_previous_max_frequency_khz,
                action_set_core_frequency_xman_mode),
                'Tuple(core UInt32, min_frequency_khz UInt32, max_frequency_khz UInt32, '
                || 'previous_min_frequency_khz UInt32, previous_max_frequency_khz UInt32, '
                || 'xman_mode String)')),
        ''))) AS spec,
    -- Why the agent acted (node level); '' for the engine's actions and rows before 0013.
    action_cause AS cause,
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
            -- Protections before a protect_flow (an empty list, nothing protected before,
            -- reads '' like any result without a rollback state).
            notEmpty(result_previous_protections_flows),
                toJSONString(CAST(tuple(arrayMap(f -> (f.interface_name,
                    (if(length(f.flow_src_addr) = 4,
                        IPv4NumToString(reinterpretAsUInt32(reverse(f.flow_src_addr))),
                        IPv6NumToString(toFixedString(f.flow_src_addr, 16))),
                     if(length(f.flow_dst_addr) = 4,
                         IPv4NumToString(reinterpretAsUInt32(reverse(f.flow_dst_addr))),
                         IPv6NumToString(toFixedString(f.flow_dst_addr, 16))),
                     f.flow_src_port, f.flow_dst_port, f.flow_ip_protocol),
                    f.latency_slo_ns, f.class_id, f.rewrite_dscp, f.ttl_ns, f.expires_ns, f.promoted,
                    f.promotions), result_previous_protections_flows)),
                    'Tuple(flows Array(Tuple(interface_name String, flow Tuple(src_addr String, '
                || 'dst_addr String, src_port UInt32, dst_port UInt32, ip_protocol UInt32), '
                || 'latency_slo_ns UInt64, class_id UInt32, rewrite_dscp UInt32, ttl_ns UInt64, '
                || 'expires_ns UInt64, promoted Bool, promotions UInt64)))')),
            '') AS previous
FROM cgloop.action_ingest
WHERE result_header_source_id != '';

-- loop_actions gains the agent's cause and the apply latency (a node-level action cites no
-- detection, so detection_to_apply_ns is 0 for it); columns appended, the rest unchanged.
CREATE OR REPLACE VIEW cgloop.loop_actions AS
SELECT
    a.id AS action_id,
    a.time AS decided_at,
    a.policy_id AS policy_id,
    a.operation AS operation,
    a.level AS level,
    a.target_node_id AS target_node_id,
    a.reason_detection_ids AS reason_detection_ids,
    a.expected_metric AS expected_metric,
    a.dry_run AS dry_run,
    r.state AS final_state,
    r.verdict AS verdict,
    r.before_value AS before_value,
    r.after_value AS after_value,
    r.applied AS applied_at,
    r.detection_to_apply_ns AS detection_to_apply_ns,
    r.message AS message,
    a.cause AS cause,
    r.apply_latency_ns AS apply_latency_ns
-- the first record of each action is its decision; later ones (if any) repeat it with a new state
FROM (SELECT * FROM cgloop.actions FINAL ORDER BY time LIMIT 1 BY id) AS a
LEFT JOIN (
    SELECT
        action_id,
        argMax(state, time) AS state,
        argMax(verdict, time) AS verdict,
        argMax(before_value, time) AS before_value,
        argMax(after_value, time) AS after_value,
        max(applied) AS applied,
        max(detection_to_apply_ns) AS detection_to_apply_ns,
        argMax(message, time) AS message,
        max(apply_latency_ns) AS apply_latency_ns
    FROM cgloop.action_results FINAL
    GROUP BY action_id
) AS r ON r.action_id = a.id;
