"""Test support: detection and probe builders, a manual clock, and the in-memory node agent
(`cgloop.policy.fake_agent`: it refuses what the real agent refuses, checked against it by
tests/test_node_agent_netns.py). The real Rust agent is exercised against the engine by the
end-to-end tests.
"""

from __future__ import annotations

import ipaddress
import itertools
import time
import uuid
from dataclasses import dataclass, field

from cgloop.contracts import SCHEMA_VERSION
from cgloop.policy.fake_agent import (  # noqa: F401  (re-exported for the tests)
    AgentBounds,
    AgentServer,
    MemoryAgentState,
    MemoryNodeAgent,
    Refused,
    hierarchy,
)
from cgloop.v1 import action_pb2 as apb
from cgloop.v1 import detection_pb2 as dpb
from cgloop.v1.common_pb2 import FiveTuple, RecordHeader
from cgloop.v1.node_pb2 import NodeSampleBatch
from cgloop.v1.probe_pb2 import ProbeRecordBatch

SERVER = "10.0.0.1"
CLIENT = "10.0.0.2"
_seq = itertools.count(1)


@dataclass
class ManualClock:
    # Starts at the wall clock: actuators stamp applied_ns with theirs.
    now_ns: int = field(default_factory=time.time_ns)

    def __call__(self) -> int:
        return self.now_ns

    def advance(self, seconds: float) -> None:
        self.now_ns += int(seconds * 1e9)


def flow(client: str = CLIENT, port: int = 40000) -> FiveTuple:
    return FiveTuple(
        src_addr=ipaddress.ip_address(SERVER).packed,
        dst_addr=ipaddress.ip_address(client).packed,
        src_port=5004,
        dst_port=port,
        ip_protocol=17,
    )


def detection(
    now_ns: int,
    kind: int = dpb.DETECTION_KIND_SLO_LATENCY,
    severity: int = dpb.SEVERITY_MAJOR,
    client: str = CLIENT,
    labels: dict[str, str] | None = None,
    **subject: object,
) -> dpb.Detection:
    det = dpb.Detection(
        header=RecordHeader(
            schema_version=SCHEMA_VERSION,
            source_id="analytics/test",
            sequence=next(_seq),
            timestamp_ns=now_ns,
        ),
        id=str(uuid.uuid4()),
        kind=kind,
        severity=severity,
        confidence=0.9,
        detector="test@1",
        window_start_ns=now_ns - 1_000_000_000,
        window_end_ns=now_ns - 5_000_000,
        labels=labels
        if labels is not None
        else {"node_id": "node-a", "interface": "veth0", "platform": "GFN"},
    )
    det.evidence.add(name="p99_latency_ns", value=48e6, threshold=30e6, baseline=12e6, unit="ns")
    if subject:
        for k, v in subject.items():
            if k in ("queue", "flow", "link"):  # message fields
                getattr(det, k).CopyFrom(v)
            else:
                setattr(det, k, v)
    else:
        det.flow.CopyFrom(flow(client))
    return det


def probes(
    start_ns: int,
    end_ns: int,
    rtt_ns: int,
    target: str = CLIENT,
    every_ns: int = 50_000_000,
    dscp: int = 0,
    source_id: str = "node-a/prober",
) -> ProbeRecordBatch:
    batch = ProbeRecordBatch()
    for i, t in enumerate(range(start_ns, end_ns, every_ns)):
        batch.records.add(
            header=RecordHeader(
                schema_version=SCHEMA_VERSION,
                source_id=source_id,
                sequence=next(_seq),
                timestamp_ns=t,
            ),
            probe_id="p1",
            method=3,
            source_addr=ipaddress.ip_address(SERVER).packed,
            target_addr=ipaddress.ip_address(target).packed,
            probe_sequence=i,
            packet_bytes=64,
            sent_ns=t,
            received_ns=t + rtt_ns,
            rtt_ns=rtt_ns,
            dscp=dscp,
        )
    return batch


def node_flow_move(
    class_id: int,
    dscp: int,
    previous: int | None,
    at_ns: int,
    ft: FiveTuple | None = None,
    node_id: str = "node-a",
    interface: str = "veth0",
    action_id: str | None = None,
) -> apb.ActionBatch:
    """What a node agent's latency guard announces when it moves a flow on its own: a
    node-level reprioritise_flow and its APPLIED result (previous: the flow's class before,
    None for no rule)."""
    action_id = action_id or str(uuid.uuid4())
    source = f"{node_id}/node-agent"
    action = apb.Action(
        header=_header(source, at_ns),
        id=action_id,
        level=apb.ACTION_LEVEL_NODE,
        operation=apb.ACTION_OPERATION_REPRIORITISE_FLOW,
        target=apb.ActionTarget(node_id=node_id, interface_name=interface, flow=ft or flow()),
        state=apb.ACTION_STATE_PROPOSED,
        cause="class 1:30 queue delay 6.1 ms >= guard 5.0 ms",
    )
    action.reprioritise_flow.class_id = class_id
    action.reprioritise_flow.rewrite_dscp = dscp
    prev = apb.PreviousFlowClass()
    if previous is not None:
        prev.class_id = previous
    result = apb.ActionResult(
        header=_header(source, at_ns),
        action_id=action_id,
        state=apb.ACTION_STATE_APPLIED,
        applied_ns=at_ns,
        apply_latency_ns=40_000,
        previous=apb.PreviousState(flow_class=prev),
    )
    batch = apb.ActionBatch()
    batch.events.add(action=action)
    batch.events.add(result=result)
    return batch


def _header(source_id: str, at_ns: int) -> RecordHeader:
    return RecordHeader(
        schema_version=SCHEMA_VERSION, source_id=source_id, sequence=next(_seq), timestamp_ns=at_ns
    )


GAMING_LABELS = {
    "node_id": "node-a", "interface": "veth0", "class": "cloud_gaming", "platform": "std",
}


def classified(now_ns: int, client: str = CLIENT, port: int = 40000, **labels: str):
    """The classifier's detection of a cloud-gaming flow (every check while it is seen)."""
    return detection(
        now_ns,
        kind=dpb.DETECTION_KIND_GAMING_FLOW_CLASSIFIED,
        severity=dpb.SEVERITY_INFO,
        labels={**GAMING_LABELS, **labels},
        flow=flow(client, port),
    )


def reprioritise_policy(
    policy_id: str = "gaming",
    kind: str = "slo_latency",
    class_id: int = 0x10010,
    dscp: int = 46,
    guards: str = "{hold_time: 0s}",
    severity: str | None = None,
    action: str = "",
) -> str:
    """A reprioritise_flow policy on the node and interface the detection labels name;
    `severity` its match's severity_at_least, `action` more keys of its action (YAML flow
    mappings, e.g. "deadline: 5s, rollback_on: [worse]")."""
    at_least = f", severity_at_least: {severity}" if severity else ""
    more = f", {action}" if action else ""
    return f"""
id: {policy_id}
match: {{kinds: [{kind}]{at_least}, subject: flow}}
action: {{operation: reprioritise_flow,
  target: {{node_id: "{{label:node_id}}", interface_name: "{{label:interface}}"}},
  parameters: {{class_id: {class_id:#x}, rewrite_dscp: {dscp}}}{more}}}
guards: {guards}
"""


@dataclass(frozen=True)
class Fn:
    """One function instance in `node_samples`: its rates over the samples' interval."""

    name: str
    core: int
    pps: float
    busy_ratio: float | None = None
    rx_dropped_per_s: float = 0.0
    instance: int = 0


def node_samples(
    node_id: str,
    end_ns: int,
    cores: dict[int, float],
    functions: tuple[Fn, ...] = (),
    count: int = 2,
    interval_s: float = 1.0,
    frequency_khz: tuple[int, int] = (1_200_000, 3_000_000),
    start_counters: dict[tuple[str, int], tuple[int, int]] | None = None,
) -> NodeSampleBatch:
    """`count` samples of a node, `interval_s` apart and ending at `end_ns`: each core at the
    given utilisation, each function instance's counters growing at its rates (from
    `start_counters[(name, instance)]` = (packets, rx_dropped), else zero)."""
    batch = NodeSampleBatch()
    step = int(interval_s * 1e9)
    for k in range(count):
        at = end_ns - (count - 1 - k) * step
        s = batch.records.add(header=_header(f"{node_id}/node-agent", at), node_id=node_id)
        for core, util in sorted(cores.items()):
            s.cores.add(
                core=core,
                utilization=util,
                frequency_khz=frequency_khz[1],
                min_frequency_khz=frequency_khz[0],
                max_frequency_khz=frequency_khz[1],
                governor="schedutil",
            )
        for f in functions:
            packets0, dropped0 = (start_counters or {}).get((f.name, f.instance), (0, 0))
            c = s.functions.add(
                function_name=f.name,
                core=f.core,
                instance=f.instance,
                packets=packets0 + int(f.pps * interval_s * k),
                forwarded_packets=packets0 + int(f.pps * interval_s * k),
                rx_dropped=dropped0 + int(f.rx_dropped_per_s * interval_s * k),
            )
            if f.busy_ratio is not None:
                c.busy_ratio = f.busy_ratio
    return batch
