"""The core router's part of the loop: the router that carries the game servers' traffic to the
edges. Its node agent shapes each core→edge link (an HTB hierarchy the global loop can act on:
best effort, where every flow starts, and a gaming class served first) and is the lab's INT
source (`[int_export]`: Telemetry Report v2.0 postcards over UDP to the INT collector beside it
on 127.0.0.1:32766, switch id 1); the ONOS driver addresses it as a switch (`device_id`).

`CorePlan.from_lab` finds it in the topology: the router the edges (cgloop.loop.edge) reach
other than their home routers.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from cgloop.lab.topology import Role, Topology
from cgloop.loop.edge import (
    DEFAULT_CLASS,
    GAMING_CLASS,
    LINK_CLASS,
    NODE_SAMPLE_MS,
    cpu_accounting_toml,
    guard_toml,
    home_routers,
)
from cgloop.v1 import node_agent_pb2 as na

# The collector's default listener (docs/int-collector.md), in the core's namespace.
INT_COLLECTOR = "127.0.0.1:32766"
# The INT switch id of the core (Telemetry Report group header Node ID); exported as "1".
INT_NODE_ID = 1
# One packet in this many is reported (a postcard per sampled packet); a packet that waited
# past the agent's report_over_ns (1 ms) is reported anyway: congestion is never sampled away.
INT_SAMPLE_EVERY = 32
# core→edge links the lab declares unshaped get this rate in the core's hierarchy.
DEFAULT_CORE_MBIT = 200.0
# The ONOS device id of the core "switch" (the contract server registers it).
CORE_DEVICE_ID = "of:0000000000000001"


@dataclass
class CorePlan:
    node: str
    # {interface (named after the edge): its rate, Mbit/s}
    edges: dict[str, float]
    interfaces: list[str] = field(default_factory=list)
    device_id: str = CORE_DEVICE_ID
    # {ifindex: interface} of the INT-reported interfaces in the core's namespace (postcards
    # name an egress port by its ifindex); read from the lab once it is up
    int_ports: dict[int, str] = field(default_factory=dict)
    # the lab's cgroup of the core node (cgloop.loop.edge.cpu_accounting_toml)
    cgroup: Path | None = None

    def analytics_args(self) -> list[str]:
        """The analytics worker's map from INT ids to lab names: switch 1 is this node, and
        each egress port its interface (the switch-queue detections' node_id and interface
        labels, which the levers' policies match)."""
        args = ["--int-switch", f"{INT_NODE_ID}={self.node}"]
        for index, name in sorted(self.int_ports.items()):
            args += ["--int-port", f"{INT_NODE_ID}:{index}={name}"]
        return args

    @classmethod
    def from_lab(cls, topo: Topology) -> CorePlan | None:
        """The core router of the lab, or None for a lab without one (a single edge whose
        servers attach to it directly)."""
        homes = home_routers(topo)
        cores: dict[str, dict[str, float]] = {}
        for edge in homes:
            for peer in topo.neighbours(edge):
                if peer == homes[edge] or topo.node(peer).role != Role.router:
                    continue
                link = topo.link_between(peer, edge)
                mbit = DEFAULT_CORE_MBIT
                if link.bottleneck is not None:
                    mbit = link.bottleneck.down_mbit if link.a == peer else link.bottleneck.up_mbit
                cores.setdefault(peer, {})[edge] = mbit
        if not cores:
            return None
        if len(cores) > 1:
            raise ValueError(f"topology {topo.name!r}: more than one core router: {sorted(cores)}")
        ((node, edges),) = cores.items()
        return cls(node=node, edges=dict(sorted(edges.items())),
                   interfaces=sorted(topo.neighbours(node)))

    def hierarchies(self) -> list[na.QueueHierarchy]:
        """One per core→edge interface, under the lab's link class 1:1: best effort 1:10 (the
        default, half the link guaranteed) and gaming 1:20 (half, priority 0: served first),
        both may borrow up to the link."""
        out = []
        burst = 64 * 1024
        for interface, mbit in self.edges.items():
            bps = int(mbit * 1e6)

            def cls(name: str, cid: int, parent: int, rate: int, prio: int, bps=bps):
                return na.HtbClass(
                    name=name, class_id=cid, parent_class_id=parent, rate_bps=rate,
                    ceil_bps=bps, priority=prio, burst_bytes=burst, cburst_bytes=burst,
                )

            out.append(na.QueueHierarchy(
                interface_name=interface,
                default_class_id=DEFAULT_CLASS,
                classes=[
                    cls("link", LINK_CLASS, 0, bps, 0),
                    cls("best-effort", DEFAULT_CLASS, LINK_CLASS, bps // 2, 2),
                    cls("gaming", GAMING_CLASS, LINK_CLASS, bps - bps // 2, 0),
                ],
            ))
        return out


def core_agent_toml(
    plan: CorePlan, journal: str, kafka_bootstrap: str, micro_loop: bool = True
) -> str:
    """The core's agent: bounds to its core→edge interfaces, the 1 ms queue monitor (what INT
    reports as hop latency and queue occupancy), the latency guard of the gaming flows the
    engine protects there (no queue protection: no L4S class on the core), and `[int_export]`
    to the collector beside it. `micro_loop=False`: the guard off, as on the edges."""
    q = json.dumps
    lines = [
        f"node_id = {q(plan.node)}",
        f"journal_path = {q(journal)}",
        f"kafka_bootstrap = {q(kafka_bootstrap)}",
        f"node_sample_interval_ms = {NODE_SAMPLE_MS}",
        # its own AF_XDP port name (the edges' agents keep the default in their namespaces)
        "[bounds]",
        f"interfaces = [{', '.join(q(i) for i in plan.edges)}]",
        "[queues]",
        "sample_interval_us = 1000",
        "stale_after_us = 5000",
        "[queue_protection]",
        "enabled = false",
        # the latency guard of the gaming flows the engine protects on the core too
        # (lab-gaming-protect-core in the levers' policies)
        *guard_toml(micro_loop),
        "[int_export]",
        f"collector = {q(INT_COLLECTOR)}",
        f"node_id = {INT_NODE_ID}",
        f"interfaces = [{', '.join(q(i) for i in plan.edges)}]",
        f"sample_every = {INT_SAMPLE_EVERY}",
        *cpu_accounting_toml(plan.cgroup),
    ]
    return "\n".join([*lines, ""])


def int_collector_argv(binary: str, kafka_bootstrap: str, source_id: str) -> list[str]:
    """The INT collector in the core's namespace: loopback listener (the core's agent is its
    only sender), one worker (2-core lab VM), records to Kafka through the bridge there."""
    return [
        binary, "run", "--listen", INT_COLLECTOR, "--workers", "1",
        "--kafka", kafka_bootstrap, "--source-id", source_id,
    ]
