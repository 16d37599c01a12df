"""The edge nodes' part of the loop: where each edge's probe and agent attach, and the queues,
active probes and service chain each agent sets up before the loop may act.

An `EdgePlan` per edge is read from the lab's topology and the scenario (`edge_plans`): an edge
is the router on the sending side of a home bottleneck (a shaped link towards a home router,
`cpeN`, behind which only hosts sit); its bottleneck interface is named after that peer, the
probe watches every edge interface at ingress (each packet is seen once: downstream where it
enters from the core, upstream where it enters from the access link), and the agent probes each
gaming client behind that edge through the bottleneck, once per class (DSCP 0 = best effort,
DSCP 46 = the gaming class), so the loop can compare the queue a flow is in with the one it
could move to. The gaming class runs a service chain (`EdgePlan.chain`): basic functions in BPF,
then `dpi` in user space behind AF_XDP, as CALVIN places them.
"""

from __future__ import annotations

import ipaddress
import json
import os
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path

import grpc
from cgloop.lab.scenario import Scenario
from cgloop.lab.sessions import GamingSpec
from cgloop.lab.topology import Role, Topology
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


def dpi_core(index: int) -> int:
    """The core the gaming chain's user-space function (dpi, AF_XDP) of the `index`-th edge is
    pinned to: the edges take the VM's cores in turn from core 1 (edge1 on 1, edge2 on 0 with
    two cores), so a hog on one edge's dpi core starves no other edge's worker. Core 0 is "not
    pinned" in the contract: the worker runs where the scheduler puts it."""
    return (index + 1) % (os.cpu_count() or 1)


# edge1's dpi core: the scenario's function-overload fault hogs it
# (loop/src/cgloop/loop/data/scenario.yaml).
DPI_CORE = dpi_core(0)
# SCHED_FIFO priority of the edges' AF_XDP workers (the agent's advanced_rt_priority): above
# the lab's ordinary load, below the function-overload fault's hog (which must starve it).
DPI_RT_PRIORITY = 10
# Node samples (CPU per core, chain function counters) every 200 ms: a starved chain function's
# ring overflow reaches the analytics within a fifth of a second (the agent's default is 1 s).
NODE_SAMPLE_MS = 200
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
    # The emulated sysfs trees the agent's power module writes (cgloop.loop.power; this VM has
    # no cpufreq); None: the agent's defaults (the kernel's).
    cpufreq_root: Path | None = None
    cpuidle_root: Path | None = None
    # Where this edge's flow probe pins its maps: X-MAN reads the per-function counters there
    # (`fn_stats`, `if_fn`); None: the agent's default (/sys/fs/bpf/cgloop).
    pin_dir: Path | None = None
    # the lab's cgroup of this node (cgloop.lab.cgroups): what its agent reads its CPU share
    # from; None on real interfaces (the agent reads the machine's /proc/stat)
    cgroup: Path | None = None
    # the core its gaming chain's dpi worker is pinned to (dpi_core)
    dpi_core: int = DPI_CORE

    @classmethod
    def from_lab(cls, topo: Topology, scenario: Scenario) -> EdgePlan:
        """The first edge of the lab (`edge_plans`)."""
        return edge_plans(topo, scenario)[0]

    @property
    def gaming_chain_id(self) -> str:
        return f"{self.node}-gaming"

    def chain(self) -> na.ServiceChain:
        """The gaming class's service chain: header functions in BPF (EF marking, a rate limit
        far above the class's demand that only a runaway flow meets), then `dpi` in user space
        behind AF_XDP (it tags the lab's gaming payload EF as well). CALVIN's order: basic first,
        the advanced one last (the agent refuses the opposite)."""
        bps = int(self.link_mbit * 1e6)
        return na.ServiceChain(
            chain_id=self.gaming_chain_id,
            traffic_class="gaming",
            functions=[
                na.ChainFunction(mark=na.Mark(dscp=EF_DSCP)),
                na.ChainFunction(rate_limit=na.RateLimit(rate_bps=bps, burst_bytes=256 * 1024)),
                na.ChainFunction(dpi=na.Dpi(depth=64, hex="00", mark_dscp=EF_DSCP),
                                 core=self.dpi_core, instances=1),
            ],
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


def home_routers(topo: Topology) -> dict[str, str]:
    """{edge: its home router} for every shaped link from a router to a home router: a router
    whose other neighbours are all hosts (`cpeN`, the clients behind it)."""
    out = {}
    for link in topo.bottlenecks():
        a, b = topo.node(link.a), topo.node(link.b)
        if a.role != Role.router or b.role != Role.router:
            continue
        behind = [n for n in topo.neighbours(b.name) if n != a.name]
        if behind and all(topo.node(n).role != Role.router for n in behind):
            out[a.name] = b.name
    return out


def edge_plans(topo: Topology, scenario: Scenario) -> list[EdgePlan]:
    """One plan per edge node of the lab, in name order: its home bottleneck, its interfaces
    and the gaming clients behind it (probed through it). A topology without a home bottleneck
    is an error naming the lab."""
    homes = home_routers(topo)
    if not homes:
        raise ValueError(
            f"topology {topo.name!r} has no edge: no shaped link from a router to a home router"
        )
    gaming = sorted({t.client for t in scenario.traffic if isinstance(t, GamingSpec)})
    plans = []
    for edge, home in sorted(homes.items()):
        link = topo.link_between(edge, home)
        assert link.bottleneck is not None
        # the link's `a` end sends its `down` rate: the edge's egress towards the home
        mbit = link.bottleneck.down_mbit if link.a == edge else link.bottleneck.up_mbit
        clients = [c for c in gaming if home in topo.neighbours(c)]
        plans.append(EdgePlan(
            node=edge,
            bottleneck=home,
            interfaces=sorted(topo.neighbours(edge)),
            link_mbit=mbit,
            targets=[ProbeTarget(c, topo.address(c)) for c in clients],
            dpi_core=dpi_core(len(plans)),
        ))
    return plans


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
        f"advanced_rt_priority = {DPI_RT_PRIORITY}",
        f"node_sample_interval_ms = {NODE_SAMPLE_MS}",
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
        *guard_toml(micro_loop),
        *power_toml(plan.cpufreq_root, plan.cpuidle_root, plan.pin_dir),
        *cpu_accounting_toml(plan.cgroup),
        "",
    ])


def guard_toml(enabled: bool) -> list[str]:
    """The agent's latency guard (`[guard]`) as the lab runs it, on the edges and the core."""
    return [
        "[guard]",
        f"enabled = {'true' if enabled else 'false'}",
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
    ]


def cpu_accounting_toml(cgroup: Path | None) -> list[str]:
    """The agent's `[cpu_accounting]`: in the lab every node shares the VM's cores, so each
    agent reads its node's cgroup (its share of every core), not the machine's /proc/stat."""
    return ["[cpu_accounting]", f"cgroup = {json.dumps(str(cgroup))}"] if cgroup else []


def power_toml(
    cpufreq_root: Path | None, cpuidle_root: Path | None, pin_dir: Path | None = None
) -> list[str]:
    """The agent's `[power]` section: an emulated sysfs tree, and the flow probe's pinned
    per-function counters X-MAN reads (nothing when neither is given)."""
    q = json.dumps
    lines = [
        f"{key} = {q(str(value))}"
        for key, value in (
            ("cpufreq_root", cpufreq_root), ("cpuidle_root", cpuidle_root),
            ("fn_stats_pin", pin_dir / "fn_stats" if pin_dir else None),
            ("if_fn_pin", pin_dir / "if_fn" if pin_dir else None),
        )
        if value is not None
    ]
    return ["[power]", *lines] if lines else []


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


def apply_chain(stub: NodeAgentServiceStub, plan: EdgePlan, run_id: str) -> na.ServiceChain:
    """The gaming class's chain (`EdgePlan.chain`) through the agent; what it applied. A chain
    the agent refuses is an error quoting its reason (nothing is half-applied: the agent swaps
    a chain whole)."""
    answer = stub.SetChain(
        na.SetChainRequest(action_id=f"{run_id}-chain-{plan.node}", chain=plan.chain()),
        timeout=20,
    )
    return answer.applied


def wait_for_probe_records(stub: NodeAgentServiceStub, timeout_s: float = 10.0) -> None:
    """The probes answer: every session has RTT samples (the reflectors are up)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        state = stub.GetState(na.GetStateRequest(), timeout=5).state
        if state.probe_status and all(p.received_packets for p in state.probe_status):
            return
        time.sleep(0.2)
    raise TimeoutError("the agent's probes got no replies (reflectors not answering?)")
