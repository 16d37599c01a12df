-- Labelled per-flow features from third-party datasets (one row per flow per capture), and the
-- plain-named views analysts start from (docs/queries.md).

CREATE TABLE IF NOT EXISTS cgloop.flow_features (
    dataset LowCardinality(String),
    capture LowCardinality(String),
    flow_id UInt32,
    src_addr IPv6,
    dst_addr IPv6,
    src_port UInt16,
    dst_port UInt16,
    ip_protocol UInt8,
    label LowCardinality(String),
    platform LowCardinality(String),
    title LowCardinality(String),
    players UInt8,
    bytes UInt64,
    packets UInt64,
    mean_packet_bytes Float64,
    mean_inter_packet_s Float64,
    frames UInt64,
    mean_frame_bytes Float64,
    mean_frame_packets Float64,
    mean_inter_frame_s Float64,
    ingested_at DateTime('UTC') DEFAULT now()
) ENGINE = ReplacingMergeTree
ORDER BY (dataset, capture, flow_id)
SETTINGS non_replicated_deduplication_window = 1000;

-- The class of each flow: the latest GAMING_FLOW_CLASSIFIED detection about it.
CREATE VIEW IF NOT EXISTS cgloop.flow_classes AS
SELECT
    flow_src_addr AS src_addr,
    flow_dst_addr AS dst_addr,
    flow_src_port AS src_port,
    flow_dst_port AS dst_port,
    flow_ip_protocol AS ip_protocol,
    argMax(labels['platform'], window_end) AS platform,
    argMax(confidence, window_end) AS confidence,
    max(window_end) AS classified_at
FROM cgloop.detections FINAL
WHERE kind = 'DETECTION_KIND_GAMING_FLOW_CLASSIFIED'
GROUP BY src_addr, dst_addr, src_port, dst_port, ip_protocol;

-- Every flow per minute with finalised quantiles and its class ('' when unclassified).
CREATE VIEW IF NOT EXISTS cgloop.flow_minutes AS
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
    s.size[2] AS p50_size_bytes,
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

-- Gaming flows only: the flows a classifier recognised, with their platform and latency.
CREATE VIEW IF NOT EXISTS cgloop.gaming_flow_minutes AS
SELECT * FROM cgloop.flow_minutes WHERE platform != '';

-- Each action of the loop with its reason, its final state and its verified effect.
CREATE VIEW IF NOT EXISTS cgloop.loop_actions AS
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
    r.message AS message
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
        argMax(message, time) AS message
    FROM cgloop.action_results FINAL
    GROUP BY action_id
) AS r ON r.action_id = a.id;

-- From the first detection an action cites to the action being applied, per action.
CREATE VIEW IF NOT EXISTS cgloop.detection_to_action AS
SELECT
    la.action_id AS action_id,
    la.operation AS operation,
    min(d.window_end) AS first_detection_at,
    any(la.applied_at) AS applied_at,
    dateDiff('millisecond', min(d.window_end), any(la.applied_at)) AS detection_to_apply_ms
FROM cgloop.loop_actions AS la
ARRAY JOIN la.reason_detection_ids AS detection_id
INNER JOIN (SELECT id, window_end FROM cgloop.detections FINAL) AS d ON d.id = detection_id
WHERE la.applied_at > toDateTime64(0, 9, 'UTC')
GROUP BY la.action_id, la.operation;
