"""The edge node's part of the loop: where the probe and the agent attach, and the queues and
active probes the agent sets up before the loop may act.

`EdgePlan` is read from the lab's topology and the scenario: the edge is the router on the
bottleneck link's sending side, its bottleneck interface is named after the peer (`cpe`), the
probe watches every edge interface at ingress (each packet is seen once: downstream where it
enters from a server, upstream where it enters from the access link), and the agent probes every
gaming client through the bottleneck, once per class (DSCP 0 = best effort, DSCP 46 = the
gaming class), so the loop can compare the queue a flow is in with the one it could move to.
"""

from __future__ import annotations

import ipaddress
import json
import socket
import time
from dataclasses import dataclass, field

import grpc
from cgloop.lab.scenario import Scenario
from cgloop.lab.sessions import GamingSpec
from cgloop.lab.topology import Topology
from cgloop.slo import LAB
from cgloop.slo import table as slo_table
from cgloop.v1 import node_agent_pb2 as na
from cgloop.v1 import probe_pb2
from cgloop.v1.node_agent_pb2_grpc import NodeAgentServiceStub

# HTB layout under the lab's link class 1:1 (the lab owns 1:, 1:1 and the default leaf 1:10).
LINK_CLASS = 0x00010001
DEFAULT_CLASS = 0x00010010  # best effort: the deep FIFO every flow starts in
GAMING_CLASS = 0x00010020  # cloud gaming: served first, up to the link
DEMOTED_CLASS = 0x00010030  # flows demoted by policy (L4S abusers): served last
L4S_CLASS = 0x00010040  # low latency (L4S): ECT(1)/CE packets, RFC 9957 queue protection
EF_DSCP = 46
# The agent's queue monitor: a tick every millisecond, none acted on once 5 ms old.
QUEUE_SAMPLE_US = 1000
QUEUE_STALE_US = 5000


@dataclass(frozen=True)
class ProbeTarget:
    client: str
    address: ipaddress.IPv4Address


@dataclass
class EdgePlan:
    node: str
    bottleneck: str  # the edge's interface towards the access link (named after the peer)
    interfaces: list[str]
    link_mbit: float
    targets: list[ProbeTarget] = field(default_factory=list)
    # The gaming latency SLO: a probe unanswered this long is reported at once (an overdue
    # notice), so the loop knows latency is over the SLO without waiting out the delay. The
    # lab's, from the SLO table (cgloop.slo); the closed loop sets its options' profile's.
    latency_slo_ms: float = field(default_factory=lambda: slo_table().latency_ms(LAB))

    @classmethod
    def from_lab(cls, topo: Topology, scenario: Scenario) -> EdgePlan:
        link = topo.bottleneck()
        assert link.bottleneck is not None
        clients = sorted({t.client for t in scenario.traffic if isinstance(t, GamingSpec)})
        return cls(
            node=link.a,
            bottleneck=link.b,
            interfaces=sorted(topo.neighbours(link.a)),
            link_mbit=link.bottleneck.down_mbit,
            targets=[ProbeTarget(c, topo.address(c)) for c in clients],
        )

    def hierarchy(self) -> na.QueueHierarchy:
        """Four classes whose guaranteed rates add up to the link (the lab's rate-cap fault
        scales them together); gaming is served first and may take the whole link, the L4S
        class next (its senders keep its queue short; one that does not is sent to best effort
        by the agent's queue protection), then best effort, then the demoted class."""
        bps = int(self.link_mbit * 1e6)
        burst = 64 * 1024

        def cls(
            name: str, cid: int, parent: int, rate: int, prio: int, ceil: int = bps
        ) -> na.HtbClass:
            return na.HtbClass(
                name=name, class_id=cid, parent_class_id=parent, rate_bps=rate, ceil_bps=ceil,
                priority=prio, burst_bytes=burst, cburst_bytes=burst,
            )

        return na.QueueHierarchy(
            interface_name=self.bottleneck,
            default_class_id=DEFAULT_CLASS,
            classes=[
                cls("link", LINK_CLASS, 0, bps, 0),
                # gaming is guaranteed enough for two 4K sessions (GeForce Now ~33 Mbit/s plus
                # Xbox Cloud ~13 Mbit/s on the lab's 100 Mbit/s): a class that must borrow to
                # carry them delays them by its borrowing, over a 20 ms SLO
                cls("best-effort", DEFAULT_CLASS, LINK_CLASS, bps * 25 // 100, 2),
                cls("gaming", GAMING_CLASS, LINK_CLASS, bps * 6 // 10, 0),
                cls("demoted", DEMOTED_CLASS, LINK_CLASS, bps * 5 // 100, 4),
                # HTB priority orders borrowing only: an L4S flow past its 10 % guarantee
                # borrows before best effort but after gaming, so an ECT(1) flood never takes
                # gaming's share. Its ceiling is half the link (as DualPI2 keeps a share for
                # the classic queue): best effort keeps the other half, and a flood beyond it
                # builds the L4S queue, which queue protection judges (with the link as ceiling
                # an unresponsive flood took best effort's bandwidth and never queued at all).
                cls("l4s", L4S_CLASS, LINK_CLASS, bps // 10, 1, ceil=bps // 2),
            ],
        )

    def probes(self) -> list[na.ProbeSpec]:
        specs = []
        for t in self.targets:
            for dscp, label in ((0, "be"), (EF_DSCP, "ef")):
                specs.append(
                    na.ProbeSpec(
                        probe_id=f"{self.node}-{t.client}-{label}",
                        method=probe_pb2.PROBE_METHOD_UDP_ECHO,
                        target_addr=socket.inet_aton(str(t.address)),
                        target_port=7799,
                        dscp=dscp,
                        interval_ns=10_000_000,
                        interval_jitter_ns=5_000_000,
                        packet_bytes=96,
                        timeout_ns=1_000_000_000,
                        overdue_after_ns=int(self.latency_slo_ms * 1e6),
                    )
                )
        return specs


def agent_toml(
    plan: EdgePlan, journal: str, kafka_bootstrap: str, micro_loop: bool = True
) -> str:
    """The node agent's configuration on the edge: its bounds, the 1 ms queue monitor on every
    class it manages, and the node micro loop (RFC 9957 queue protection of the L4S class 1:40,
    whose sanctioned packets go to best effort 1:10, with CE marking at a 1 ms step; the latency
    guard of the flows the policy engine protects, acting at half their SLO). `micro_loop=False`
    is today's global loop alone: the monitor still samples and exports, nothing acts on the
    node, and no ECN rule sends ECT(1) packets to 1:40 (queue protection owns that rule)."""
    on = "true" if micro_loop else "false"
    q = json.dumps  # a JSON string is a TOML basic string
    return "\n".join([
        f"node_id = {q(plan.node)}",
        f"journal_path = {q(journal)}",
        f"kafka_bootstrap = {q(kafka_bootstrap)}",
        "[bounds]",
        f"interfaces = [{q(plan.bottleneck)}]",
        "[queues]",
        f"sample_interval_us = {QUEUE_SAMPLE_US}",
        f"stale_after_us = {QUEUE_STALE_US}",
        "[queue_protection]",
        f"enabled = {on}",
        f"interfaces = [{q(plan.bottleneck)}]",
        f"ll_class_id = {L4S_CLASS}",
        f"classic_class_id = {DEFAULT_CLASS}",
        # RFC 9957's published defaults (CableLabs' model), the step of Linux DualPI2
        "critical_qdelay_us = 1000",
        "critical_score_us = 4000",
        "lg_aging = 19",
        "attempts = 2",
        "buckets = 32",
        "ce_step_us = 1000",
        "[guard]",
        f"enabled = {on}",
        # act at half a protected flow's SLO (10 ms of 20 ms), release below 5 % (1 ms). Not the
        # agent's default quarter (5 ms): a GeForce Now frame is ~57 packets sent back to back,
        # which take ~5.5 ms to drain through the lab's 100 Mbit/s, so the flow's own frames
        # would pass 5 ms and promote it with no fault at all (then release, and again)
        "guard_fraction = 0.5",
        "release_fraction = 0.05",
        # a promoted flow stays at least 5 s: the guard releases on one tick under 1 ms, and
        # a flood's queue read that low for an instant in the lab (then promoted 60 ms later)
        "hold_ms = 5000",
        "max_changes_per_s = 20",
        # sanctions are aggregated per flow over this interval: a finer one than the default
        # 100 ms, so the abuser's time to its first sanction is known within 20 ms
        "audit_interval_ms = 20",
        "",
    ])


def agent_channel(socket_path: str, credentials: grpc.ChannelCredentials) -> grpc.Channel:
    return grpc.secure_channel(
        f"unix:{socket_path}", credentials,
        options=[("grpc.ssl_target_name_override", "localhost")],
    )


def configure_agent(stub: NodeAgentServiceStub, plan: EdgePlan, run_id: str) -> None:
    """Queues, the EF rule and the active probes, each an idempotent action of this run."""
    stub.ApplyQueueHierarchy(
        na.ApplyQueueHierarchyRequest(action_id=f"{run_id}-queues", hierarchy=plan.hierarchy()),
        timeout=10,
    )
    stub.SetFlowClass(
        na.SetFlowClassRequest(
            action_id=f"{run_id}-ef",
            rule=na.FlowClassRule(
                interface_name=plan.bottleneck, class_id=GAMING_CLASS, match_dscp=EF_DSCP
            ),
        ),
        timeout=10,
    )
    for spec in plan.probes():
        stub.StartProbe(
            na.StartProbeRequest(action_id=f"{run_id}-probe-{spec.probe_id}", spec=spec),
            timeout=10,
        )


def wait_for_probe_records(stub: NodeAgentServiceStub, timeout_s: float = 10.0) -> None:
    """The probes answer: every session has RTT samples (the reflectors are up)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        state = stub.GetState(na.GetStateRequest(), timeout=5).state
        if state.probe_status and all(p.received_packets for p in state.probe_status):
            return
        time.sleep(0.2)
    raise TimeoutError("the agent's probes got no replies (reflectors not answering?)")
