"""The lab's levers policy template (loop/…/policies/levers.yaml), rendered as the loop renders it,
drives every lever of the policy engine on lab v2's nodes: the detections shaped as the
analytics emit them (cgloop.analytics.detectors.overload, the classifier), the node samples the
agents send, in-memory agents with the loop's own queue hierarchies (cgloop.loop.edge,
cgloop.loop.core), and the ONOS contract server. No root, no Kafka: what the template asks of
the engine, checked before a lab run finds out."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from cgloop.lab.scenario import load_scenario
from cgloop.lab.topology import load_topology
from cgloop.loop.closed_loop import default_scenario, write_levers
from cgloop.loop.core import CorePlan
from cgloop.loop.edge import edge_plans
from cgloop.policy.actuators import NodeAgentActuator, OnosActuator, Router
from cgloop.policy.engine import Engine
from cgloop.policy.journal import Journal
from cgloop.policy.model import load_policies
from cgloop.policy.nodes import NodeBook
from cgloop.policy.testing import (
    AgentBounds,
    AgentServer,
    Fn,
    ManualClock,
    MemoryNodeAgent,
    classified,
    detection,
    node_samples,
)
from cgloop.v1 import action_pb2 as apb
from cgloop.v1 import detection_pb2 as dpb
from cgloop.v1.detection_pb2 import QueueRef

onos = pytest.importorskip("cgloop.actuators.onos")
from cgloop.actuators.onos.contract import OnosContractServer  # noqa: E402

LAB_KHZ = (1_200_000, 3_000_000)  # the loop's emulated cpufreq tree (cgloop.loop.power)


@pytest.fixture
def lab(tmp_path: Path) -> Iterator[tuple[Engine, dict[str, AgentServer], OnosContractServer]]:
    topo = load_topology()
    edges = edge_plans(topo, load_scenario(default_scenario()))
    core = CorePlan.from_lab(topo)
    assert core is not None
    policies = load_policies([write_levers(tmp_path, core, 20.0)])
    agents: dict[str, AgentServer] = {}
    for plan in edges:
        agent = MemoryNodeAgent(
            plan.node, bounds=AgentBounds(online_cpus=[0, 1], cpuinfo_khz=LAB_KHZ)
        )
        agent.seed_hierarchy(plan.hierarchy())
        agents[plan.node] = AgentServer(agent).__enter__()
    agent = MemoryNodeAgent(core.node, bounds=AgentBounds(online_cpus=[0, 1]))
    for h in core.hierarchies():
        agent.seed_hierarchy(h)
    agents[core.node] = AgentServer(agent).__enter__()
    server = OnosContractServer().__enter__()
    server.add_device(core.device_id)
    client = onos.OnosClient(onos.OnosSettings(url=server.url))
    node = NodeAgentActuator({n: s.address for n, s in agents.items()})
    engine = Engine(
        policies,
        Router(node, onos=OnosActuator(client)),
        journal=Journal(None),
        clock=ManualClock(),
        nodes=NodeBook(),
    )
    yield engine, agents, server
    node.close()
    client.close()
    server.close()
    for s in agents.values():
        s.__exit__(None, None, None)


def results(
    events: list[apb.ActionEvent], state: int | None = None
) -> dict[str, apb.ActionResult]:
    """The latest result per policy (of that state, if given)."""
    policy = {e.action.id: e.action.policy_id for e in events if e.WhichOneof("event") == "action"}
    return {
        policy[e.result.action_id]: e.result
        for e in events
        if e.HasField("result") and (state is None or e.result.state == state)
    }


def test_every_lever_of_the_lab_template_acts(lab) -> None:
    engine, agents, server = lab
    now = engine.clock()
    # edge1: a CPU hog holds core 1, where its dpi worker runs; edge2: both cores busy; the
    # core router: quiet.
    engine.observe_nodes(
        node_samples("edge1", now, {0: 0.3, 1: 1.0}, (Fn("dpi", 1, 5_000, 0.1, 300),),
                     frequency_khz=LAB_KHZ)
    )
    engine.observe_nodes(
        node_samples("edge2", now, {0: 0.95, 1: 0.97}, (Fn("dpi", 1, 5_000, 0.4),),
                     frequency_khz=LAB_KHZ)
    )
    engine.observe_nodes(node_samples("core", now, {0: 0.3, 1: 0.3}))
    detections = [
        detection(now, kind=dpb.DETECTION_KIND_FUNCTION_OVERLOAD, function_name="dpi",
                  labels={"node_id": "edge1", "function_name": "dpi", "instance": "0",
                          "core": "1"}),
        detection(now, kind=dpb.DETECTION_KIND_NODE_OVERLOAD, node_id="edge2",
                  labels={"node_id": "edge2", "core": "1"}),
        detection(now, kind=dpb.DETECTION_KIND_NODE_OVERLOAD, node_id="core",
                  labels={"node_id": "core", "core": "0"}),
        detection(now, kind=dpb.DETECTION_KIND_QUEUE_CONGESTION,
                  queue=QueueRef(node_id="1", interface_name="3", queue_id=0x10010),
                  labels={"switch_id": "1", "egress_port": "3", "queue_id": str(0x10010),
                          "node_id": "core", "interface": "edge2"}),
        classified(now, node_id="edge2", interface="cpe2", platform="psn"),
    ]
    events = engine.handle(dpb.DetectionBatch(records=detections))
    got = results(events)
    applied = {k: v.message for k, v in results(events, apb.ACTION_STATE_APPLIED).items()}
    messages = {k: v.message for k, v in got.items()}

    # function_overload → the dpi worker leaves the hogged core (no scale-out fits on 2 cores).
    assert got["lab-function-overload-scale-out"].state == apb.ACTION_STATE_VERIFIED, messages
    assert applied["lab-function-overload-scale-out"].startswith(
        "planned re-placement (no scale-out fits): dpi: 1 instance(s) on core(s) 0"
    ), applied
    dpi = agents["edge1"].agent.state.chains["gaming"].functions[-1]
    assert dpi.WhichOneof("function") == "dpi" and dpi.core == 0  # 0: not pinned to core 1

    # node_overload → X-MAN on edge2, read back; the core router's agent has no power module.
    power = got["lab-node-overload-xman"]
    assert power.verification.verdict == apb.VERDICT_IMPROVED, power.verification.detail
    pinned = agents["edge2"].agent.state.power[1]
    assert pinned.min_frequency_khz == pinned.max_frequency_khz == LAB_KHZ[1]
    assert pinned.forbid_cstates
    refused = [e.result.message for e in events if e.HasField("result")
               and e.result.message.startswith("guard blacklist: node core")]
    assert refused, messages

    # INT congestion on the core → ONOS (recorded by the contract server) and the core's queue.
    assert got["lab-core-congestion-onos"].state == apb.ACTION_STATE_VERIFIED, messages
    (rule,) = server.state.flows.values()
    assert rule["deviceId"] == "of:0000000000000001"
    hierarchy = agents["core"].agent.state.hierarchies["edge2"]
    (best_effort,) = [c for c in hierarchy.classes if c.class_id == 0x10010]
    assert (best_effort.rate_bps, best_effort.ceil_bps) == (100_000_000, 150_000_000)

    # A new session behind edge2 (both its cores busy) → its chain on the idle core router.
    placed = got["lab-gaming-session-placement"]
    assert placed.state == apb.ACTION_STATE_VERIFIED, messages
    assert applied["lab-gaming-session-placement"].startswith("placed by LBLC on core"), applied
    assert "gaming" in agents["core"].agent.state.chains
    assert agents["core"].agent.state.chains["gaming"].chain_id == "edge2-gaming"
    # ... and the core's agent guards it, on its egress towards edge2 (lab-gaming-protect-core)
    assert got["lab-gaming-protect-core"].state in (
        apb.ACTION_STATE_APPLIED, apb.ACTION_STATE_VERIFIED), messages
    (guarded,) = agents["core"].agent.state.protections.values()
    assert guarded.interface_name == "edge2" and guarded.class_id == 0x10020
