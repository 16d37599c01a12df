"""Canonical sample records, one per Kafka message type.

The same values are defined in Rust (proto/rust/src/samples.rs); tests/test_contract_vectors.py
checks that both encode to identical bytes. Change both together, then regenerate the golden
files (proto/testdata/vectors/README.md).

Every field of every message is set to a non-default value so that every field is on the wire.
Values are chosen for that, not to be physically consistent (a lost probe has an RTT, a UDP
flow has TCP flags). Doubles are exactly representable so no decimal rounding differs.
"""

from collections.abc import Callable

from cgloop.contracts import SCHEMA_VERSION
from cgloop.contracts.bus import topic_specs
from cgloop.v1 import (
    action_pb2,
    common_pb2,
    deadletter_pb2,
    detection_pb2,
    flow_pb2,
    int_pb2,
    node_agent_pb2,
    node_pb2,
    probe_pb2,
)
from google.protobuf.message import Message

# Reference instant of all samples: 2025-06-15T15:06:40Z in ns since the Unix epoch.
T0_NS = 1_750_000_000_000_000_000
# Detection ids referenced by the action sample.
DETECTION_ID_1 = "0b9e4a52-6d1f-4c8e-9a37-5f2d1c0e8a01"
DETECTION_ID_2 = "0b9e4a52-6d1f-4c8e-9a37-5f2d1c0e8a02"
ACTION_ID = "7c41d0e2-93ab-4f6e-8d15-2a6b9e3f4c10"
ROLLED_BACK_ACTION_ID = "7c41d0e2-93ab-4f6e-8d15-2a6b9e3f4c0f"


def _header(source_id: str, sequence: int, timestamp_ns: int) -> common_pb2.RecordHeader:
    return common_pb2.RecordHeader(
        schema_version=SCHEMA_VERSION,
        source_id=source_id,
        sequence=sequence,
        timestamp_ns=timestamp_ns,
    )


def gaming_five_tuple() -> common_pb2.FiveTuple:
    """A downstream cloud-gaming media flow: 198.51.100.7:49004 -> 192.0.2.10:51000/UDP."""
    return common_pb2.FiveTuple(
        src_addr=bytes([198, 51, 100, 7]),
        dst_addr=bytes([192, 0, 2, 10]),
        src_port=49_004,
        dst_port=51_000,
        ip_protocol=17,
    )


def sample_flow_record_batch() -> flow_pb2.FlowRecordBatch:
    record = flow_pb2.FlowRecord(
        header=_header("node-a/flow-probe", 42, T0_NS + 100_000_000),
        five_tuple=gaming_five_tuple(),
        direction=common_pb2.DIRECTION_EGRESS,
        vlan_id=100,
        ifindex=7,
        interface_name="veth-gw0",
        interval_start_ns=T0_NS,
        interval_end_ns=T0_NS + 100_000_000,
        is_final=True,
        packets=3_000,
        bytes=3_600_000,
        first_seen_ns=T0_NS - 5_000_000_000,
        last_seen_ns=T0_NS + 99_000_000,
        size_min_bytes=60,
        size_max_bytes=1_400,
        size_sum_bytes=3_600_000,
        size_sum_squares_bytes2=4_500_000_000,
        size_histogram_bytes=common_pb2.Log2Histogram(
            buckets=[0, 0, 0, 0, 0, 12, 3, 0, 0, 0, 2_985]
        ),
        inter_arrival_histogram_ns=common_pb2.Log2Histogram(
            buckets=[0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 100, 0, 400, 0, 1_500, 900, 99]
        ),
        max_burst_packets=24,
        burst_count=110,
        ecn_not_ect_packets=2_990,
        ecn_ect0_packets=4,
        ecn_ect1_packets=5,
        ecn_ce_packets=1,
        last_dscp=46,
        tcp_flags_seen=0x18,
        rtp=flow_pb2.RtpStats(
            ssrc=0x1234_ABCD,
            payload_type=96,
            clock_rate_hz=90_000,
            jitter_ns=1_500_000,
            lost_packets=3,
            reordered_packets=2,
            sequence_gaps=2,
            duplicate_packets=1,
            marker_packets=180,
            extended_highest_sequence=70_000,
        ),
    )
    return flow_pb2.FlowRecordBatch(records=[record])


def _int_hop(
    switch_id: int, ingress_port: int, egress_port: int, hop_latency_ns: int
) -> int_pb2.IntHop:
    ingress_timestamp_ns = T0_NS + switch_id * 1_000
    return int_pb2.IntHop(
        switch_id=switch_id,
        ingress_port=ingress_port,
        egress_port=egress_port,
        hop_latency_ns=hop_latency_ns,
        queue_id=1,
        queue_occupancy_cells=120 * switch_id,
        egress_tx_utilization=0.5,
        ingress_timestamp_ns=ingress_timestamp_ns,
        egress_timestamp_ns=ingress_timestamp_ns + hop_latency_ns,
        l2_ingress_port=1_000 + ingress_port,
        l2_egress_port=1_000 + egress_port,
        buffer_id=2,
        buffer_occupancy_cells=300 * switch_id,
        egress_tx_utilization_raw=5_000,
    )


def sample_int_record_batch() -> int_pb2.IntRecordBatch:
    """One record of each of the four INT kinds, in oneof field order."""
    source = "int-collector-1"
    hop = int_pb2.IntHopRecord(
        header=_header(source, 7, T0_NS + 1_000_000),
        five_tuple=gaming_five_tuple(),
        hop_index=1,
        hop=_int_hop(2, 1, 3, 850),
    )
    flow = int_pb2.IntFlowRecord(
        header=_header(source, 8, T0_NS + 1_000_000),
        five_tuple=gaming_five_tuple(),
        path_switch_ids=[1, 2],
        hops=[_int_hop(1, 5, 2, 1_250), _int_hop(2, 1, 3, 850)],
        end_to_end_latency_ns=2_100,
        reason=int_pb2.INT_EVENT_REASON_LATENCY_CHANGE,
        report_sequence=9_001,
        reporter_switch_id=2,
        report_count=42,
    )
    queue = int_pb2.IntQueueRecord(
        header=_header(source, 9, T0_NS + 2_000_000),
        switch_id=2,
        egress_port=3,
        queue_id=1,
        queue_occupancy_cells=4_096,
        queue_latency_ns=3_000_000,
        congested=True,
        egress_tx_utilization=0.875,
    )
    drop = int_pb2.IntDropRecord(
        header=_header(source, 10, T0_NS + 3_000_000),
        switch_id=3,
        ingress_port=2,
        egress_port=4,
        queue_id=1,
        drop_reason=71,
        drop_count=17,
        five_tuple=gaming_five_tuple(),
    )
    return int_pb2.IntRecordBatch(
        records=[
            int_pb2.IntRecord(hop=hop),
            int_pb2.IntRecord(flow=flow),
            int_pb2.IntRecord(queue=queue),
            int_pb2.IntRecord(drop=drop),
        ]
    )


def sample_probe_record_batch() -> probe_pb2.ProbeRecordBatch:
    """A TWAMP-light probe over IPv6 (2001:db8::1 -> 2001:db8::2), to cover 16-byte addresses."""
    prefix = bytes([0x20, 0x01, 0x0D, 0xB8]) + bytes(11)
    record = probe_pb2.ProbeRecord(
        header=_header("node-a/prober", 5, T0_NS + 2_350_000),
        probe_id="gfn-edge-rtt",
        method=probe_pb2.PROBE_METHOD_TWAMP_LIGHT,
        source_addr=prefix + b"\x01",
        target_addr=prefix + b"\x02",
        source_port=40_000,
        target_port=862,
        dscp=46,
        ecn=1,
        probe_sequence=1_234,
        packet_bytes=128,
        sent_ns=T0_NS + 2_000_000,
        received_ns=T0_NS + 2_350_000,
        rtt_ns=340_000,
        lost=True,
        overdue=True,
        reply_ttl=61,
        forward_delay_ns=180_000,
        reverse_delay_ns=160_000,
        reply_ecn=3,
    )
    return probe_pb2.ProbeRecordBatch(records=[record])


def sample_node_sample_batch() -> node_pb2.NodeSampleBatch:
    def core(
        core: int, frequency_khz: int, governor: str, utilization: float
    ) -> node_pb2.CoreSample:
        return node_pb2.CoreSample(
            core=core,
            frequency_khz=frequency_khz,
            min_frequency_khz=800_000,
            max_frequency_khz=3_000_000,
            governor=governor,
            utilization=utilization,
        )

    def function(name: str, core: int, packets: int) -> node_pb2.FunctionCounters:
        return node_pb2.FunctionCounters(
            function_name=name,
            core=core,
            packets=packets,
            forwarded_packets=packets - 10,
            last_packet_ns=T0_NS + 3_000_000 + core,
        )

    # The second instance of a user-space function, with its load, ring losses and a stall.
    second_instance = function("nat", 1, 999_000)
    second_instance.instance, second_instance.busy_ratio, second_instance.rx_dropped = 1, 0.625, 12
    second_instance.rx_waiting, second_instance.stalled_ns = 40, 75_000_000
    sample = node_pb2.NodeSample(
        header=_header("node-a/agent", 11, T0_NS + 5_000_000),
        node_id="node-a",
        cores=[core(0, 2_400_000, "userspace", 0.75), core(1, 1_200_000, "performance", 0.25)],
        functions=[function("router", 0, 1_000_000), second_instance],
        power_watts=42.5,
        energy_joules=12_345.25,
        queues=[
            node_pb2.QueueSample(
                interface_name="cpe",
                class_id=0x10040,
                class_name="l4s",
                backlog_bytes=3_000,
                backlog_packets=2,
                max_backlog_bytes=15_000,
                drops=7,
                overlimits=120,
                sent_packets=50_000,
                sent_bytes=60_000_000,
                sojourn_packets=900,
                sojourn_p50_ns=150_000,
                sojourn_p99_ns=1_100_000,
                sojourn_max_ns=2_300_000,
                qprot_sanctioned_packets=1_200,
                ce_marked_packets=35,
            )
        ],
        micro_loop=node_pb2.MicroLoopStatus(
            acting=True,
            reason="1 of 3 queue readers failing: cpe (netlink: No such device)",
            queue_sample_age_ns=900_000,
            protected_flows=2,
        ),
    )
    return node_pb2.NodeSampleBatch(records=[sample])


def sample_detection_batch() -> detection_pb2.DetectionBatch:
    """One detection per subject variant, in oneof field order."""
    subjects = [
        (detection_pb2.DETECTION_KIND_L4S_UNRESPONSIVE_ECN, {"flow": gaming_five_tuple()}),
        (
            detection_pb2.DETECTION_KIND_QUEUE_CONGESTION,
            {
                "queue": detection_pb2.QueueRef(
                    node_id="node-a", interface_name="veth-gw0", queue_id=1
                )
            },
        ),
        (detection_pb2.DETECTION_KIND_NODE_OVERLOAD, {"node_id": "node-b"}),
        (detection_pb2.DETECTION_KIND_FUNCTION_OVERLOAD, {"function_name": "nat"}),
        (
            detection_pb2.DETECTION_KIND_PATH_CHANGE,
            {
                "link": detection_pb2.LinkRef(
                    src_device_id="device:leaf1",
                    src_port=3,
                    dst_device_id="device:spine1",
                    dst_port=1,
                )
            },
        ),
    ]
    records = []
    for n, (kind, subject) in enumerate(subjects, start=1):
        records.append(
            detection_pb2.Detection(
                header=_header("analytics-1", 20 + n, T0_NS + n * 1_000_000),
                id=f"0b9e4a52-6d1f-4c8e-9a37-5f2d1c0e8a{n:02x}",
                kind=kind,
                severity=detection_pb2.SEVERITY_MAJOR,
                confidence=0.875,
                evidence=[
                    detection_pb2.Evidence(
                        name="ce_fraction", value=0.5, threshold=0.25, baseline=0.0625, unit="ratio"
                    ),
                    detection_pb2.Evidence(
                        name="victim_p99_rtt_ns",
                        value=30_000_000.0,
                        threshold=20_000_000.0,
                        baseline=15_000_000.0,
                        unit="ns",
                    ),
                ],
                detector="l4s-abuse",
                model_version="2025.06.1",
                window_start_ns=T0_NS - 1_000_000_000,
                window_end_ns=T0_NS,
                labels={"platform": "GFN", "scenario": "unresponsive-ecn"},
                **subject,
            )
        )
    return detection_pb2.DetectionBatch(records=records)


def _latency_summary(scale_ns: int) -> common_pb2.LatencySummary:
    return common_pb2.LatencySummary(
        samples=1_200,
        p50_ns=scale_ns,
        p90_ns=scale_ns * 2,
        p99_ns=scale_ns * 3,
        p999_ns=scale_ns * 4,
        max_ns=scale_ns * 5,
    )


def sample_action_batch() -> action_pb2.ActionBatch:
    """One Action (proposed, dry run, itself a rollback) and one ActionResult (verified) as
    engines wrote them before typed actions (parameter maps: old records still read), then one
    typed Action per member of Action.spec and one ActionResult per member of PreviousState."""
    action = action_pb2.Action(
        header=_header("policy-engine", 3, T0_NS + 10_000_000),
        id=ACTION_ID,
        reason_detection_ids=[DETECTION_ID_1, DETECTION_ID_2],
        policy_id="l4s-abuse-demote",
        level=action_pb2.ACTION_LEVEL_MICRO,
        target=action_pb2.ActionTarget(
            node_id="node-a",
            interface_name="veth-gw0",
            flow=gaming_five_tuple(),
            switch_id=2,
            device_id="device:leaf1",
            queue_id=1,
        ),
        operation=action_pb2.ACTION_OPERATION_REPRIORITISE_FLOW,
        parameters={"class_id": "0x00010030", "rewrite_dscp": "0"},
        expected_effect=action_pb2.ExpectedEffect(
            metric="victim.p99_rtt_ns",
            comparator=action_pb2.COMPARATOR_LESS_THAN,
            value=20_000_000.0,
            within_ns=500_000_000,
        ),
        deadline_ns=T0_NS + 200_000_000,
        state=action_pb2.ACTION_STATE_PROPOSED,
        dry_run=True,
        rollback_of_action_id=ROLLED_BACK_ACTION_ID,
    )
    result = action_pb2.ActionResult(
        header=_header("policy-engine", 4, T0_NS + 600_000_000),
        action_id=ACTION_ID,
        state=action_pb2.ACTION_STATE_VERIFIED,
        verification=action_pb2.Verification(
            verdict=action_pb2.VERDICT_IMPROVED,
            metric="victim.p99_rtt_ns",
            before_value=30_000_000.0,
            after_value=16_000_000.0,
            latency_before=_latency_summary(10_000_000),
            latency_after=_latency_summary(4_000_000),
            detail="p99 RTT back under the SLO",
        ),
        message="applied by node-a agent",
        applied_ns=T0_NS + 45_000_000,
        apply_latency_ns=180_000,
        detection_to_apply_ns=45_000_000,
        verified_ns=T0_NS + 545_000_000,
        previous_parameters={"class_id": "0x00010010", "rewrite_dscp": "46"},
    )
    events = [action_pb2.ActionEvent(action=action), action_pb2.ActionEvent(result=result)]
    events += [action_pb2.ActionEvent(action=a) for a in _typed_actions()]
    events += [action_pb2.ActionEvent(result=r) for r in _typed_results()]
    return action_pb2.ActionBatch(events=events)


def _sample_chain_functions() -> list[node_agent_pb2.ChainFunction]:
    """Every function of the catalogue once (two Dpi for both members of each oneof)."""
    na = node_agent_pb2
    return [
        na.ChainFunction(forward=na.Forward(), kind=na.FUNCTION_KIND_ELEMENTARY),
        na.ChainFunction(
            acl=na.Acl(proto=17, dst_port=49005, src_port=5004),
            kind=na.FUNCTION_KIND_BASIC,
            core=1,
            packets=1_000,
            dropped_packets=3,
        ),
        na.ChainFunction(mark=na.Mark(dscp=46, ecn=1), kind=na.FUNCTION_KIND_BASIC),
        na.ChainFunction(rate_limit=na.RateLimit(rate_bps=50_000_000, burst_bytes=15_000)),
        na.ChainFunction(mirror=na.Mirror(interface="veth-tap")),
        na.ChainFunction(  # Natif's scale-out: two instances, one per core
            dpi=na.Dpi(text="GFN", depth=64, mark_dscp=34),
            kind=na.FUNCTION_KIND_ADVANCED,
            core=2,
            instances=2,
            instance_cores=[2, 3],
        ),
        na.ChainFunction(dpi=na.Dpi(hex="4746", drop=na.DpiDrop()), core=3),
    ]


def _typed_actions() -> list[action_pb2.Action]:
    """One action per member of Action.spec, the operation's typed parameters."""
    na = node_agent_pb2
    a = action_pb2
    op = a.ActionOperation
    specs = [
        ("reprioritise_flow", a.ReprioritiseFlowAction(class_id=0x10010, rewrite_dscp=46)),
        (
            "set_class_rate",
            a.SetClassRateAction(class_id=0x10030, rate_bps=50_000_000, ceil_bps=80_000_000),
        ),
        (
            "set_chain",
            a.SetChainAction(
                chain_id="gaming-edge",
                traffic_class="gaming",
                functions=_sample_chain_functions(),
                base_rtt_us=190,
                free_cores=[2, 3],
                processing_us=[0.0, 0.5, 0.5, 0.5, 0.5, 7.0, 7.5],
            ),
        ),
        (
            "set_power_policy",
            a.SetPowerPolicyAction(
                cores=[2, 3],
                min_frequency_khz=800_000,
                max_frequency_khz=2_400_000,
                governor="userspace",
                xman_mode=na.XMAN_MODE_LOAD,
                latency_critical=[2],
            ),
        ),
        (
            "onos_flow_rule",
            a.OnosFlowRuleAction(
                priority=40_000, queue_id=1, output_port="2", timeout_s=600, app_id="org.cgloop"
            ),
        ),
        (
            "onos_queue",
            a.OnosQueueAction(
                port="3", queue_id=1, min_rate_bps=10_000_000, max_rate_bps=90_000_000, priority=7
            ),
        ),
        ("notify", a.NotifyAction(message="switch queue congested")),
        (
            "onos_meter",
            a.OnosMeterAction(
                unit=a.METER_UNIT_KB_PER_SEC,
                burst=True,
                bands=[
                    a.MeterBand(type=a.METER_BAND_TYPE_REMARK, rate=10_000, burst_size=64, prec=1)
                ],
            ),
        ),
        (
            "onos_intent",
            a.OnosIntentAction(
                app_id="org.cgloop",
                priority=200,
                ingress=a.OnosConnectPoint(device_id="of:0000000000000001", port=1),
                egress=a.OnosConnectPoint(device_id="of:0000000000000002", port=2),
            ),
        ),
    ]
    out = []
    for i, (name, spec) in enumerate(specs):
        action = a.Action(
            header=_header("policy-engine", 10 + i, T0_NS + 700_000_000 + i),
            id=f"{ACTION_ID[:-2]}{20 + i}",
            operation=op.Value(f"ACTION_OPERATION_{name.upper()}"),
            state=a.ACTION_STATE_PROPOSED,
        )
        getattr(action, name).CopyFrom(spec)
        out.append(action)
    rollback = a.Action(
        header=_header("policy-engine", 19, T0_NS + 800_000_000),
        id=f"{ACTION_ID[:-2]}30",
        operation=op.ACTION_OPERATION_REPRIORITISE_FLOW,
        state=a.ACTION_STATE_PROPOSED,
        rollback_of_action_id=f"{ACTION_ID[:-2]}20",
        rollback=a.PreviousState(flow_class=a.PreviousFlowClass()),
    )
    return [*out, rollback, *_node_level_actions()]


def _node_level_actions() -> list[action_pb2.Action]:
    """The operations only the node micro loop records (and the engine's protect_flow)."""
    a = action_pb2
    op = a.ActionOperation
    specs = [
        (
            "protect_flow",
            a.ProtectFlowAction(
                latency_slo_ns=20_000_000, class_id=0x10020, rewrite_dscp=46, ttl_ns=30_000_000_000
            ),
        ),
        (
            "queue_protection_sanction",
            a.QueueProtectionSanction(
                from_class_id=0x10040,
                to_class_id=0x10010,
                sanctioned_packets=1_200,
                sanctioned_bytes=1_440_000,
                interval_start_ns=T0_NS + 1_000_000_000,
                interval_end_ns=T0_NS + 1_100_000_000,
                max_score_us=5_250.5,
                max_queue_delay_ns=2_400_000,
            ),
        ),
        (
            "set_core_frequency",
            a.SetCoreFrequencyAction(
                core=2,
                min_frequency_khz=2_400_000,
                max_frequency_khz=3_000_000,
                previous_min_frequency_khz=800_000,
                previous_max_frequency_khz=3_000_000,
                xman_mode="load",
            ),
        ),
    ]
    out = []
    for i, (name, spec) in enumerate(specs):
        action = a.Action(
            header=_header("node-a/agent", 40 + i, T0_NS + 1_100_000_000 + i),
            id=f"{ACTION_ID[:-2]}{40 + i}",
            level=a.ACTION_LEVEL_NODE,
            operation=op.Value(f"ACTION_OPERATION_{name.upper()}"),
            state=a.ACTION_STATE_APPLIED,
            cause="class 1:40 queue delay 2.4 ms >= 1.0 ms, bucket score 5250 us >= 4000 us",
        )
        getattr(action, name).CopyFrom(spec)
        out.append(action)
    return out


def _typed_results() -> list[action_pb2.ActionResult]:
    """One applied result per member of PreviousState, the typed rollback state."""
    na = node_agent_pb2
    a = action_pb2
    previous = [
        a.PreviousState(flow_class=a.PreviousFlowClass(class_id=0x10030, rewrite_dscp=0)),
        a.PreviousState(
            class_rate=a.PreviousClassRate(
                class_id=0x10030, rate_bps=250_000_000, ceil_bps=1_000_000_000
            )
        ),
        a.PreviousState(
            chain=a.PreviousChain(
                chain_id="gaming-edge",
                traffic_class="gaming",
                chain=na.ServiceChain(
                    chain_id="gaming-old",
                    traffic_class="gaming",
                    functions=[na.ChainFunction(forward=na.Forward())],
                ),
            )
        ),
        a.PreviousState(
            power_policies=a.PreviousPowerPolicies(
                policies=[
                    na.PowerPolicy(
                        cores=[2, 3],
                        governor="schedutil",
                        min_frequency_khz=400_000,
                        max_frequency_khz=3_000_000,
                        xman_mode=na.XMAN_MODE_FEEDBACK,
                        forbid_cstates=True,
                    )
                ]
            )
        ),
        a.PreviousState(
            onos_flow_rule=a.InstalledFlowRule(
                device_id="of:0000000000000001", flow_id="49539596143441920"
            )
        ),
        a.PreviousState(
            onos_meter=a.InstalledMeter(device_id="of:0000000000000001", meter_id="5")
        ),
        a.PreviousState(onos_intent=a.InstalledIntent(app_id="org.cgloop", key="0x12")),
        a.PreviousState(
            protections=a.PreviousProtections(
                flows=[
                    na.ProtectedFlow(
                        interface_name="cpe",
                        flow=gaming_five_tuple(),
                        latency_slo_ns=20_000_000,
                        class_id=0x10020,
                        rewrite_dscp=46,
                        ttl_ns=30_000_000_000,
                        expires_ns=T0_NS + 30_000_000_000,
                        promoted=True,
                        promotions=3,
                    )
                ]
            )
        ),
    ]
    return [
        a.ActionResult(
            header=_header("policy-engine", 20 + i, T0_NS + 900_000_000 + i),
            action_id=f"{ACTION_ID[:-2]}{20 + i}",
            state=a.ACTION_STATE_APPLIED,
            previous=p,
        )
        for i, p in enumerate(previous)
    ]


def sample_dead_letter() -> deadletter_pb2.DeadLetter:
    """A poison message from the flow topic: its value is not a valid FlowRecordBatch."""
    return deadletter_pb2.DeadLetter(
        header=_header("flow-sink", 77, T0_NS + 7_000_000),
        topic="cgloop.flows",
        partition=3,
        offset=123_456,
        key=b"node-a",
        value=bytes([0x0A, 0x05]) + b"junk" + bytes([0xFF]),
        reason="decode error: buffer underflow in FlowRecordBatch.records",
        consumer_group="cgloop-flow-sink",
        original_timestamp_ms=1_750_000_000_000,
    )


# Keyed like the vector files (<name>.bin) and the Rust crate's vectors::VECTORS.
SAMPLES: dict[str, Callable[[], Message]] = {
    "flow_record_batch": sample_flow_record_batch,
    "int_record_batch": sample_int_record_batch,
    "probe_record_batch": sample_probe_record_batch,
    "node_sample_batch": sample_node_sample_batch,
    "detection_batch": sample_detection_batch,
    "action_batch": sample_action_batch,
    "dead_letter": sample_dead_letter,
}


def _sample_name(batch_type: str) -> str:
    """cgloop.v1.FlowRecordBatch -> flow_record_batch (the SAMPLES key of that type)."""
    short = batch_type.rsplit(".", 1)[-1]
    return "".join(f"_{c.lower()}" if c.isupper() else c for c in short).lstrip("_")


# The sample carried by each topic (the bus table, cgloop.contracts.bus), for tests that fill
# every topic.
SAMPLE_FOR_TOPIC: dict[str, str] = {
    spec.name: _sample_name(spec.batch_type) for spec in topic_specs().values()
}
