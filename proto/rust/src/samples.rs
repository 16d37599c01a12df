//! Canonical sample records, one per Kafka message type.
//!
//! The same values are defined in Python (`cgloop.contracts.samples`); the cross-language test
//! checks that both encode to identical bytes. Change both together, then regenerate the golden
//! files (proto/testdata/vectors/README.md).
//!
//! Every field the samples were written with is set to a non-default value so that it is on the
//! wire. Literals end with `..Default::default()` so that a field added later to a .proto does not
//! break the build; add it here (and in Python) to cover it by the vectors. Values are chosen
//! for that, not to be physically consistent (a lost probe has an RTT, a UDP flow has TCP
//! flags). Doubles are exactly representable so no decimal rounding differs.

// `..Default::default()` on complete literals is deliberate (see above).
#![allow(clippy::needless_update)]

use std::collections::BTreeMap;

use crate::v1::{
    action, action_event, chain_function, detection, dpi, int_record, previous_state, Acl, Action,
    ActionBatch, ActionEvent, ActionLevel, ActionOperation, ActionResult, ActionState,
    ActionTarget, ChainFunction, Comparator, CoreSample, DeadLetter, Detection, DetectionBatch,
    DetectionKind, Direction, Dpi, DpiDrop, Evidence, ExpectedEffect, FiveTuple, FlowRecord,
    FlowRecordBatch, Forward, FunctionCounters, FunctionKind, InstalledFlowRule, InstalledIntent,
    InstalledMeter, IntDropRecord, IntEventReason, IntFlowRecord, IntHop, IntHopRecord,
    IntQueueRecord, IntRecord, IntRecordBatch, LatencySummary, LinkRef, Log2Histogram, Mark,
    MeterBand, MeterBandType, MeterUnit, MicroLoopStatus, Mirror, NodeSample, NodeSampleBatch,
    NotifyAction, OnosConnectPoint, OnosFlowRuleAction, OnosIntentAction, OnosMeterAction,
    OnosQueueAction, PowerPolicy, PreviousChain, PreviousClassRate, PreviousFlowClass,
    PreviousPowerPolicies, PreviousProtections, PreviousState, ProbeMethod, ProbeRecord,
    ProbeRecordBatch, ProtectFlowAction, ProtectedFlow, QueueProtectionSanction, QueueRef,
    QueueSample, RateLimit, RecordHeader, ReprioritiseFlowAction, RtpStats, ServiceChain,
    SetChainAction, SetClassRateAction, SetCoreFrequencyAction, SetPowerPolicyAction, Severity,
    Verdict, Verification, XmanMode,
};
use crate::SCHEMA_VERSION;

/// Reference instant of all samples: 2025-06-15T15:06:40Z in ns since the Unix epoch.
pub const T0_NS: u64 = 1_750_000_000_000_000_000;
/// Detection ids referenced by the action sample.
pub const DETECTION_ID_1: &str = "0b9e4a52-6d1f-4c8e-9a37-5f2d1c0e8a01";
pub const DETECTION_ID_2: &str = "0b9e4a52-6d1f-4c8e-9a37-5f2d1c0e8a02";
pub const ACTION_ID: &str = "7c41d0e2-93ab-4f6e-8d15-2a6b9e3f4c10";
pub const ROLLED_BACK_ACTION_ID: &str = "7c41d0e2-93ab-4f6e-8d15-2a6b9e3f4c0f";

fn header(source_id: &str, sequence: u64, timestamp_ns: u64) -> Option<RecordHeader> {
    Some(RecordHeader {
        schema_version: SCHEMA_VERSION,
        source_id: source_id.to_owned(),
        sequence,
        timestamp_ns,
        ..Default::default()
    })
}

fn string_map(entries: &[(&str, &str)]) -> BTreeMap<String, String> {
    entries
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

/// A downstream cloud-gaming media flow: server 198.51.100.7:49004 -> client 192.0.2.10:51000/UDP.
pub fn gaming_five_tuple() -> FiveTuple {
    FiveTuple {
        src_addr: vec![198, 51, 100, 7],
        dst_addr: vec![192, 0, 2, 10],
        src_port: 49_004,
        dst_port: 51_000,
        ip_protocol: 17,
        ..Default::default()
    }
}

pub fn sample_flow_record_batch() -> FlowRecordBatch {
    let record = FlowRecord {
        header: header("node-a/flow-probe", 42, T0_NS + 100_000_000),
        five_tuple: Some(gaming_five_tuple()),
        direction: Direction::Egress as i32,
        vlan_id: 100,
        ifindex: 7,
        interface_name: "veth-gw0".to_owned(),
        interval_start_ns: T0_NS,
        interval_end_ns: T0_NS + 100_000_000,
        is_final: true,
        packets: 3_000,
        bytes: 3_600_000,
        first_seen_ns: T0_NS - 5_000_000_000,
        last_seen_ns: T0_NS + 99_000_000,
        size_min_bytes: 60,
        size_max_bytes: 1_400,
        size_sum_bytes: 3_600_000,
        size_sum_squares_bytes2: 4_500_000_000,
        size_histogram_bytes: Some(Log2Histogram {
            buckets: vec![0, 0, 0, 0, 0, 12, 3, 0, 0, 0, 2_985],
            ..Default::default()
        }),
        inter_arrival_histogram_ns: Some(Log2Histogram {
            buckets: vec![0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 100, 0, 400, 0, 1_500, 900, 99],
            ..Default::default()
        }),
        max_burst_packets: 24,
        burst_count: 110,
        ecn_not_ect_packets: 2_990,
        ecn_ect0_packets: 4,
        ecn_ect1_packets: 5,
        ecn_ce_packets: 1,
        last_dscp: 46,
        tcp_flags_seen: 0x18,
        rtp: Some(RtpStats {
            ssrc: 0x1234_abcd,
            payload_type: 96,
            clock_rate_hz: 90_000,
            jitter_ns: 1_500_000,
            lost_packets: 3,
            reordered_packets: 2,
            sequence_gaps: 2,
            duplicate_packets: 1,
            marker_packets: 180,
            extended_highest_sequence: 70_000,
            ..Default::default()
        }),
        ..Default::default()
    };
    FlowRecordBatch {
        records: vec![record],
        ..Default::default()
    }
}

fn int_hop(switch_id: u32, ingress_port: u32, egress_port: u32, hop_latency_ns: u64) -> IntHop {
    let ingress_timestamp_ns = T0_NS + u64::from(switch_id) * 1_000;
    IntHop {
        switch_id,
        ingress_port,
        egress_port,
        hop_latency_ns,
        queue_id: 1,
        queue_occupancy_cells: 120 * switch_id,
        egress_tx_utilization: 0.5,
        ingress_timestamp_ns,
        egress_timestamp_ns: ingress_timestamp_ns + hop_latency_ns,
        l2_ingress_port: 1_000 + ingress_port,
        l2_egress_port: 1_000 + egress_port,
        buffer_id: 2,
        buffer_occupancy_cells: 300 * switch_id,
        egress_tx_utilization_raw: 5_000,
        ..Default::default()
    }
}

/// One record of each of the four INT kinds, in oneof field order.
pub fn sample_int_record_batch() -> IntRecordBatch {
    let source = "int-collector-1";
    let hop = IntHopRecord {
        header: header(source, 7, T0_NS + 1_000_000),
        five_tuple: Some(gaming_five_tuple()),
        hop_index: 1,
        hop: Some(int_hop(2, 1, 3, 850)),
        ..Default::default()
    };
    let flow = IntFlowRecord {
        header: header(source, 8, T0_NS + 1_000_000),
        five_tuple: Some(gaming_five_tuple()),
        path_switch_ids: vec![1, 2],
        hops: vec![int_hop(1, 5, 2, 1_250), int_hop(2, 1, 3, 850)],
        end_to_end_latency_ns: 2_100,
        reason: IntEventReason::LatencyChange as i32,
        report_sequence: 9_001,
        reporter_switch_id: 2,
        report_count: 42,
        ..Default::default()
    };
    let queue = IntQueueRecord {
        header: header(source, 9, T0_NS + 2_000_000),
        switch_id: 2,
        egress_port: 3,
        queue_id: 1,
        queue_occupancy_cells: 4_096,
        queue_latency_ns: 3_000_000,
        congested: true,
        egress_tx_utilization: 0.875,
        ..Default::default()
    };
    let drop = IntDropRecord {
        header: header(source, 10, T0_NS + 3_000_000),
        switch_id: 3,
        ingress_port: 2,
        egress_port: 4,
        queue_id: 1,
        drop_reason: 71,
        drop_count: 17,
        five_tuple: Some(gaming_five_tuple()),
        ..Default::default()
    };
    let records = [
        int_record::Record::Hop(hop),
        int_record::Record::Flow(flow),
        int_record::Record::Queue(queue),
        int_record::Record::Drop(drop),
    ]
    .into_iter()
    .map(|record| IntRecord {
        record: Some(record),
        ..Default::default()
    })
    .collect();
    IntRecordBatch { records }
}

/// A TWAMP-light probe over IPv6 (2001:db8::1 -> 2001:db8::2), to cover 16-byte addresses.
pub fn sample_probe_record_batch() -> ProbeRecordBatch {
    let mut source_addr = vec![0x20, 0x01, 0x0d, 0xb8];
    source_addr.extend([0; 11]);
    let mut target_addr = source_addr.clone();
    source_addr.push(1);
    target_addr.push(2);
    let record = ProbeRecord {
        header: header("node-a/prober", 5, T0_NS + 2_350_000),
        probe_id: "gfn-edge-rtt".to_owned(),
        method: ProbeMethod::TwampLight as i32,
        source_addr,
        target_addr,
        source_port: 40_000,
        target_port: 862,
        dscp: 46,
        ecn: 1,
        probe_sequence: 1_234,
        packet_bytes: 128,
        sent_ns: T0_NS + 2_000_000,
        received_ns: T0_NS + 2_350_000,
        rtt_ns: 340_000,
        lost: true,
        overdue: true,
        reply_ttl: 61,
        forward_delay_ns: 180_000,
        reverse_delay_ns: 160_000,
        reply_ecn: 3,
        ..Default::default()
    };
    ProbeRecordBatch {
        records: vec![record],
        ..Default::default()
    }
}

pub fn sample_node_sample_batch() -> NodeSampleBatch {
    let core = |core: u32, frequency_khz: u32, governor: &str, utilization: f64| CoreSample {
        core,
        frequency_khz,
        min_frequency_khz: 800_000,
        max_frequency_khz: 3_000_000,
        governor: governor.to_owned(),
        utilization,
        ..Default::default()
    };
    let function = |name: &str, core: u32, packets: u64| FunctionCounters {
        function_name: name.to_owned(),
        core,
        packets,
        forwarded_packets: packets - 10,
        last_packet_ns: T0_NS + 3_000_000 + u64::from(core),
        ..Default::default()
    };
    let sample = NodeSample {
        header: header("node-a/agent", 11, T0_NS + 5_000_000),
        node_id: "node-a".to_owned(),
        cores: vec![
            core(0, 2_400_000, "userspace", 0.75),
            core(1, 1_200_000, "performance", 0.25),
        ],
        functions: vec![
            function("router", 0, 1_000_000),
            // The second instance of a user-space function, with its load, ring losses and a
            // stall.
            FunctionCounters {
                instance: 1,
                busy_ratio: Some(0.625),
                rx_dropped: 12,
                rx_waiting: 40,
                stalled_ns: 75_000_000,
                ..function("nat", 1, 999_000)
            },
        ],
        power_watts: Some(42.5),
        energy_joules: Some(12_345.25),
        queues: vec![QueueSample {
            interface_name: "cpe".to_owned(),
            class_id: 0x10040,
            class_name: "l4s".to_owned(),
            backlog_bytes: 3_000,
            backlog_packets: 2,
            max_backlog_bytes: 15_000,
            drops: 7,
            overlimits: 120,
            sent_packets: 50_000,
            sent_bytes: 60_000_000,
            sojourn_packets: 900,
            sojourn_p50_ns: 150_000,
            sojourn_p99_ns: 1_100_000,
            sojourn_max_ns: 2_300_000,
            qprot_sanctioned_packets: 1_200,
            ce_marked_packets: 35,
        }],
        micro_loop: Some(MicroLoopStatus {
            acting: true,
            reason: "1 of 3 queue readers failing: cpe (netlink: No such device)".to_owned(),
            queue_sample_age_ns: 900_000,
            protected_flows: 2,
        }),
    };
    NodeSampleBatch {
        records: vec![sample],
        ..Default::default()
    }
}

/// One detection per subject variant, in oneof field order.
pub fn sample_detection_batch() -> DetectionBatch {
    let subjects = [
        (
            DetectionKind::L4sUnresponsiveEcn,
            detection::Subject::Flow(gaming_five_tuple()),
        ),
        (
            DetectionKind::QueueCongestion,
            detection::Subject::Queue(QueueRef {
                node_id: "node-a".to_owned(),
                interface_name: "veth-gw0".to_owned(),
                queue_id: 1,
                ..Default::default()
            }),
        ),
        (
            DetectionKind::NodeOverload,
            detection::Subject::NodeId("node-b".to_owned()),
        ),
        (
            DetectionKind::FunctionOverload,
            detection::Subject::FunctionName("nat".to_owned()),
        ),
        (
            DetectionKind::PathChange,
            detection::Subject::Link(LinkRef {
                src_device_id: "device:leaf1".to_owned(),
                src_port: 3,
                dst_device_id: "device:spine1".to_owned(),
                dst_port: 1,
                ..Default::default()
            }),
        ),
    ];
    let records = subjects
        .into_iter()
        .zip(1u64..)
        .map(|((kind, subject), n)| Detection {
            header: header("analytics-1", 20 + n, T0_NS + n * 1_000_000),
            id: format!("0b9e4a52-6d1f-4c8e-9a37-5f2d1c0e8a{n:02x}"),
            kind: kind as i32,
            severity: Severity::Major as i32,
            confidence: 0.875,
            evidence: vec![
                Evidence {
                    name: "ce_fraction".to_owned(),
                    value: 0.5,
                    threshold: 0.25,
                    baseline: 0.0625,
                    unit: "ratio".to_owned(),
                    ..Default::default()
                },
                Evidence {
                    name: "victim_p99_rtt_ns".to_owned(),
                    value: 30_000_000.0,
                    threshold: 20_000_000.0,
                    baseline: 15_000_000.0,
                    unit: "ns".to_owned(),
                    ..Default::default()
                },
            ],
            detector: "l4s-abuse".to_owned(),
            model_version: "2025.06.1".to_owned(),
            window_start_ns: T0_NS - 1_000_000_000,
            window_end_ns: T0_NS,
            labels: string_map(&[("platform", "GFN"), ("scenario", "unresponsive-ecn")]),
            subject: Some(subject),
            ..Default::default()
        })
        .collect();
    DetectionBatch { records }
}

fn latency_summary(scale_ns: u64) -> LatencySummary {
    LatencySummary {
        samples: 1_200,
        p50_ns: scale_ns,
        p90_ns: scale_ns * 2,
        p99_ns: scale_ns * 3,
        p999_ns: scale_ns * 4,
        max_ns: scale_ns * 5,
        ..Default::default()
    }
}

/// One Action (proposed, dry run, itself a rollback) and one ActionResult (verified) as engines
/// wrote them before typed actions (parameter maps: old records still read), then one typed
/// Action per member of Action.spec and one ActionResult per member of PreviousState.
#[allow(deprecated)] // the old records' parameter maps
pub fn sample_action_batch() -> ActionBatch {
    let action = Action {
        header: header("policy-engine", 3, T0_NS + 10_000_000),
        id: ACTION_ID.to_owned(),
        reason_detection_ids: vec![DETECTION_ID_1.to_owned(), DETECTION_ID_2.to_owned()],
        policy_id: "l4s-abuse-demote".to_owned(),
        level: ActionLevel::Micro as i32,
        target: Some(ActionTarget {
            node_id: "node-a".to_owned(),
            interface_name: "veth-gw0".to_owned(),
            flow: Some(gaming_five_tuple()),
            switch_id: 2,
            device_id: "device:leaf1".to_owned(),
            queue_id: 1,
            ..Default::default()
        }),
        operation: ActionOperation::ReprioritiseFlow as i32,
        parameters: string_map(&[("class_id", "0x00010030"), ("rewrite_dscp", "0")]),
        expected_effect: Some(ExpectedEffect {
            metric: "victim.p99_rtt_ns".to_owned(),
            comparator: Comparator::LessThan as i32,
            value: 20_000_000.0,
            within_ns: 500_000_000,
            ..Default::default()
        }),
        deadline_ns: T0_NS + 200_000_000,
        state: ActionState::Proposed as i32,
        dry_run: true,
        rollback_of_action_id: ROLLED_BACK_ACTION_ID.to_owned(),
        ..Default::default()
    };
    let result = ActionResult {
        header: header("policy-engine", 4, T0_NS + 600_000_000),
        action_id: ACTION_ID.to_owned(),
        state: ActionState::Verified as i32,
        verification: Some(Verification {
            verdict: Verdict::Improved as i32,
            metric: "victim.p99_rtt_ns".to_owned(),
            before_value: 30_000_000.0,
            after_value: 16_000_000.0,
            latency_before: Some(latency_summary(10_000_000)),
            latency_after: Some(latency_summary(4_000_000)),
            detail: "p99 RTT back under the SLO".to_owned(),
            ..Default::default()
        }),
        message: "applied by node-a agent".to_owned(),
        applied_ns: T0_NS + 45_000_000,
        apply_latency_ns: 180_000,
        detection_to_apply_ns: 45_000_000,
        verified_ns: T0_NS + 545_000_000,
        previous_parameters: string_map(&[("class_id", "0x00010010"), ("rewrite_dscp", "46")]),
        ..Default::default()
    };
    let events = [
        action_event::Event::Action(action),
        action_event::Event::Result(result),
    ]
    .into_iter()
    .chain(typed_actions().into_iter().map(action_event::Event::Action))
    .chain(typed_results().into_iter().map(action_event::Event::Result))
    .map(|event| ActionEvent { event: Some(event) })
    .collect();
    ActionBatch { events }
}

/// Every function of the catalogue once (two Dpi for both members of each oneof).
fn sample_chain_functions() -> Vec<ChainFunction> {
    use chain_function::Function as F;
    let f = |function: F, kind: FunctionKind, core: u32, packets: u64, dropped_packets: u64| {
        ChainFunction {
            function: Some(function),
            kind: kind as i32,
            core,
            packets,
            dropped_packets,
            ..Default::default()
        }
    };
    vec![
        f(F::Forward(Forward {}), FunctionKind::Elementary, 0, 0, 0),
        f(
            F::Acl(Acl {
                proto: 17,
                dst_port: 49_005,
                src_port: 5_004,
            }),
            FunctionKind::Basic,
            1,
            1_000,
            3,
        ),
        f(
            F::Mark(Mark {
                dscp: Some(46),
                ecn: Some(1),
            }),
            FunctionKind::Basic,
            0,
            0,
            0,
        ),
        f(
            F::RateLimit(RateLimit {
                rate_bps: 50_000_000,
                burst_bytes: 15_000,
            }),
            FunctionKind::Unspecified,
            0,
            0,
            0,
        ),
        f(
            F::Mirror(Mirror {
                interface: "veth-tap".to_owned(),
            }),
            FunctionKind::Unspecified,
            0,
            0,
            0,
        ),
        ChainFunction {
            // Natif's scale-out: two instances, one per core.
            instances: 2,
            instance_cores: vec![2, 3],
            ..f(
                F::Dpi(Dpi {
                    pattern: Some(dpi::Pattern::Text("GFN".to_owned())),
                    depth: Some(64),
                    on_match: Some(dpi::OnMatch::MarkDscp(34)),
                }),
                FunctionKind::Advanced,
                2,
                0,
                0,
            )
        },
        f(
            F::Dpi(Dpi {
                pattern: Some(dpi::Pattern::Hex("4746".to_owned())),
                depth: None,
                on_match: Some(dpi::OnMatch::Drop(DpiDrop {})),
            }),
            FunctionKind::Unspecified,
            3,
            0,
            0,
        ),
    ]
}

/// One action per member of Action.spec, the operation's typed parameters.
fn typed_actions() -> Vec<Action> {
    use action::Spec;
    let specs = vec![
        (
            ActionOperation::ReprioritiseFlow,
            Spec::ReprioritiseFlow(ReprioritiseFlowAction {
                class_id: 0x10010,
                rewrite_dscp: Some(46),
            }),
        ),
        (
            ActionOperation::SetClassRate,
            Spec::SetClassRate(SetClassRateAction {
                class_id: 0x10030,
                rate_bps: 50_000_000,
                ceil_bps: Some(80_000_000),
            }),
        ),
        (
            ActionOperation::SetChain,
            Spec::SetChain(SetChainAction {
                chain_id: "gaming-edge".to_owned(),
                traffic_class: "gaming".to_owned(),
                functions: sample_chain_functions(),
                base_rtt_us: 190,
                free_cores: vec![2, 3],
                processing_us: vec![0.0, 0.5, 0.5, 0.5, 0.5, 7.0, 7.5],
            }),
        ),
        (
            ActionOperation::SetPowerPolicy,
            Spec::SetPowerPolicy(SetPowerPolicyAction {
                cores: vec![2, 3],
                min_frequency_khz: 800_000,
                max_frequency_khz: 2_400_000,
                governor: Some("userspace".to_owned()),
                xman_mode: XmanMode::Load as i32,
                latency_critical: vec![2],
            }),
        ),
        (
            ActionOperation::OnosFlowRule,
            Spec::OnosFlowRule(OnosFlowRuleAction {
                priority: 40_000,
                queue_id: Some(1),
                output_port: Some("2".to_owned()),
                timeout_s: 600,
                app_id: Some("org.cgloop".to_owned()),
            }),
        ),
        (
            ActionOperation::OnosQueue,
            Spec::OnosQueue(OnosQueueAction {
                port: "3".to_owned(),
                queue_id: 1,
                min_rate_bps: Some(10_000_000),
                max_rate_bps: Some(90_000_000),
                priority: Some(7),
            }),
        ),
        (
            ActionOperation::Notify,
            Spec::Notify(NotifyAction {
                message: "switch queue congested".to_owned(),
            }),
        ),
        (
            ActionOperation::OnosMeter,
            Spec::OnosMeter(OnosMeterAction {
                unit: MeterUnit::KbPerSec as i32,
                burst: true,
                bands: vec![MeterBand {
                    r#type: MeterBandType::Remark as i32,
                    rate: 10_000,
                    burst_size: 64,
                    prec: 1,
                }],
            }),
        ),
        (
            ActionOperation::OnosIntent,
            Spec::OnosIntent(OnosIntentAction {
                app_id: "org.cgloop".to_owned(),
                priority: 200,
                ingress: Some(OnosConnectPoint {
                    device_id: "of:0000000000000001".to_owned(),
                    port: 1,
                }),
                egress: Some(OnosConnectPoint {
                    device_id: "of:0000000000000002".to_owned(),
                    port: 2,
                }),
            }),
        ),
    ];
    let id = |n: u32| format!("{}{n}", &ACTION_ID[..ACTION_ID.len() - 2]);
    let mut out: Vec<Action> = specs
        .into_iter()
        .enumerate()
        .map(|(i, (operation, spec))| Action {
            header: header(
                "policy-engine",
                10 + i as u64,
                T0_NS + 700_000_000 + i as u64,
            ),
            id: id(20 + i as u32),
            operation: operation as i32,
            state: ActionState::Proposed as i32,
            spec: Some(spec),
            ..Default::default()
        })
        .collect();
    out.push(Action {
        header: header("policy-engine", 19, T0_NS + 800_000_000),
        id: id(30),
        operation: ActionOperation::ReprioritiseFlow as i32,
        state: ActionState::Proposed as i32,
        rollback_of_action_id: id(20),
        spec: Some(Spec::Rollback(PreviousState {
            state: Some(previous_state::State::FlowClass(
                PreviousFlowClass::default(),
            )),
        })),
        ..Default::default()
    });
    out.extend(node_level_actions());
    out
}

/// The operations only the node micro loop records (and the engine's protect_flow).
fn node_level_actions() -> Vec<Action> {
    use action::Spec;
    let specs = vec![
        (
            ActionOperation::ProtectFlow,
            Spec::ProtectFlow(ProtectFlowAction {
                latency_slo_ns: 20_000_000,
                class_id: 0x10020,
                rewrite_dscp: Some(46),
                ttl_ns: 30_000_000_000,
            }),
        ),
        (
            ActionOperation::QueueProtectionSanction,
            Spec::QueueProtectionSanction(QueueProtectionSanction {
                from_class_id: 0x10040,
                to_class_id: 0x10010,
                sanctioned_packets: 1_200,
                sanctioned_bytes: 1_440_000,
                interval_start_ns: T0_NS + 1_000_000_000,
                interval_end_ns: T0_NS + 1_100_000_000,
                max_score_us: 5_250.5,
                max_queue_delay_ns: 2_400_000,
            }),
        ),
        (
            ActionOperation::SetCoreFrequency,
            Spec::SetCoreFrequency(SetCoreFrequencyAction {
                core: 2,
                min_frequency_khz: 2_400_000,
                max_frequency_khz: 3_000_000,
                previous_min_frequency_khz: 800_000,
                previous_max_frequency_khz: 3_000_000,
                xman_mode: "load".to_owned(),
            }),
        ),
    ];
    specs
        .into_iter()
        .enumerate()
        .map(|(i, (operation, spec))| Action {
            header: header(
                "node-a/agent",
                40 + i as u64,
                T0_NS + 1_100_000_000 + i as u64,
            ),
            id: format!("{}{}", &ACTION_ID[..ACTION_ID.len() - 2], 40 + i),
            level: ActionLevel::Node as i32,
            operation: operation as i32,
            state: ActionState::Applied as i32,
            cause: "class 1:40 queue delay 2.4 ms >= 1.0 ms, bucket score 5250 us >= 4000 us"
                .to_owned(),
            spec: Some(spec),
            ..Default::default()
        })
        .collect()
}

/// One applied result per member of PreviousState, the typed rollback state.
fn typed_results() -> Vec<ActionResult> {
    use previous_state::State;
    let previous = vec![
        State::FlowClass(PreviousFlowClass {
            class_id: Some(0x10030),
            rewrite_dscp: Some(0),
        }),
        State::ClassRate(PreviousClassRate {
            class_id: 0x10030,
            rate_bps: 250_000_000,
            ceil_bps: 1_000_000_000,
        }),
        State::Chain(PreviousChain {
            chain_id: "gaming-edge".to_owned(),
            traffic_class: "gaming".to_owned(),
            chain: Some(ServiceChain {
                chain_id: "gaming-old".to_owned(),
                traffic_class: "gaming".to_owned(),
                functions: vec![ChainFunction {
                    function: Some(chain_function::Function::Forward(Forward {})),
                    ..Default::default()
                }],
            }),
        }),
        State::PowerPolicies(PreviousPowerPolicies {
            policies: vec![PowerPolicy {
                cores: vec![2, 3],
                governor: "schedutil".to_owned(),
                min_frequency_khz: 400_000,
                max_frequency_khz: 3_000_000,
                xman_mode: XmanMode::Feedback as i32,
                forbid_cstates: true,
            }],
        }),
        State::OnosFlowRule(InstalledFlowRule {
            device_id: "of:0000000000000001".to_owned(),
            flow_id: "49539596143441920".to_owned(),
        }),
        State::OnosMeter(InstalledMeter {
            device_id: "of:0000000000000001".to_owned(),
            meter_id: "5".to_owned(),
        }),
        State::OnosIntent(InstalledIntent {
            app_id: "org.cgloop".to_owned(),
            key: "0x12".to_owned(),
        }),
        State::Protections(PreviousProtections {
            flows: vec![ProtectedFlow {
                interface_name: "cpe".to_owned(),
                flow: Some(gaming_five_tuple()),
                latency_slo_ns: 20_000_000,
                class_id: 0x10020,
                rewrite_dscp: Some(46),
                ttl_ns: 30_000_000_000,
                expires_ns: T0_NS + 30_000_000_000,
                promoted: true,
                promotions: 3,
            }],
        }),
    ];
    previous
        .into_iter()
        .enumerate()
        .map(|(i, state)| ActionResult {
            header: header(
                "policy-engine",
                20 + i as u64,
                T0_NS + 900_000_000 + i as u64,
            ),
            action_id: format!("{}{}", &ACTION_ID[..ACTION_ID.len() - 2], 20 + i),
            state: ActionState::Applied as i32,
            previous: Some(PreviousState { state: Some(state) }),
            ..Default::default()
        })
        .collect()
}

/// A poison message from the flow topic: its value is not a valid FlowRecordBatch.
pub fn sample_dead_letter() -> DeadLetter {
    DeadLetter {
        header: header("flow-sink", 77, T0_NS + 7_000_000),
        topic: "cgloop.flows".to_owned(),
        partition: 3,
        offset: 123_456,
        key: b"node-a".to_vec(),
        value: vec![0x0a, 0x05, b'j', b'u', b'n', b'k', 0xff],
        reason: "decode error: buffer underflow in FlowRecordBatch.records".to_owned(),
        consumer_group: "cgloop-flow-sink".to_owned(),
        original_timestamp_ms: 1_750_000_000_000,
        ..Default::default()
    }
}
