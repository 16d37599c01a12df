"""Rollback restores what was there: every node operation, checked on the state the agent
reports (GetState), not on call names. A rollback that re-applied the action, or sent the
flow anywhere but its previous class, leaves a state that differs from the one before."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest
from cgloop.policy import model, parameters
from cgloop.policy.actuators import NodeAgentActuator, Router
from cgloop.policy.engine import Engine
from cgloop.policy.journal import Entry, Journal
from cgloop.policy.telemetry import Reading
from cgloop.policy.testing import (
    AgentBounds,
    AgentServer,
    ManualClock,
    MemoryNodeAgent,
    detection,
    flow,
)
from cgloop.v1 import action_pb2 as apb
from cgloop.v1 import detection_pb2 as dpb
from cgloop.v1 import node_agent_pb2 as na
from cgloop.v1.detection_pb2 import QueueRef
from cgloop.v1.node_agent_pb2_grpc import NodeAgentServiceStub

MS = 1_000_000
OLD_VECTOR = Path(__file__).parent / "data" / "action_batch_v1_parameters.bin"


class Worse:
    """Telemetry where every action made the metric worse (40 ms before, 80 ms after)."""

    def read(self, metric, action, start_ns, end_ns, phase="after") -> Reading:
        return Reading(40 * MS if phase == "before" else 80 * MS, 20)


EXPECT = "  expect: {metric: probe.p99_rtt_ns, comparator: less_than, value: 1000000, within: 1s}\n"


def policy(text: str) -> model.Policy:
    (p,) = model.parse_policies(text + EXPECT + "  rollback_on: [worse]\n")
    return p


FLOW = policy("""
id: flow
match: {kinds: [slo_latency], subject: flow}
action:
  operation: reprioritise_flow
  target: {node_id: "{label:node_id}", interface_name: "{label:interface}"}
  parameters: {class_id: 0x10010, rewrite_dscp: 46}
""")
RATE = policy("""
id: rate
match: {kinds: [classic_queue_burst], subject: queue}
action:
  operation: set_class_rate
  parameters: {class_id: 0x10030, rate_bps: 50000000, ceil_bps: 80000000}
""")
CHAIN = policy("""
id: chain
level: global
match: {kinds: [function_overload], subject: function}
action:
  operation: set_chain
  target: {node_id: "{label:node_id}"}
  parameters:
    chain_id: gaming-edge
    traffic_class: gaming
    functions: [{acl: {proto: 17}}, {mark: {dscp: 46}}]
    base_rtt_us: 190
""")
POWER = policy("""
id: power
match: {kinds: [node_overload], subject: node}
action:
  operation: set_power_policy
  target: {node_id: "{subject}"}
  parameters:
    cores: [2, 3]
    latency_critical: [2]
    min_frequency_khz: 800000
    max_frequency_khz: 2400000
""")
PROTECT = policy("""
id: protect
match: {kinds: [slo_latency], subject: flow}
action:
  operation: protect_flow
  target: {node_id: "{label:node_id}", interface_name: "{label:interface}"}
  parameters: {latency_slo_ns: 20000000, class_id: 0x10010, rewrite_dscp: 46, ttl_ns: 30000000000}
""")


def flow_det(now: int) -> dpb.Detection:
    return detection(now)


def rate_det(now: int) -> dpb.Detection:
    q = QueueRef(node_id="node-a", interface_name="veth0", queue_id=3)
    return detection(now, kind=dpb.DETECTION_KIND_CLASSIC_QUEUE_BURST, queue=q)


def chain_det(now: int) -> dpb.Detection:
    return detection(
        now,
        kind=dpb.DETECTION_KIND_FUNCTION_OVERLOAD,
        function_name="mark",
        labels={"node_id": "node-a"},
    )


def power_det(now: int) -> dpb.Detection:
    return detection(now, kind=dpb.DETECTION_KIND_NODE_OVERLOAD, node_id="node-a")


@pytest.fixture
def agent() -> Iterator[AgentServer]:
    with AgentServer(MemoryNodeAgent("node-a", bounds=AgentBounds(online_cpus=[0, 1, 2, 3]))) as s:
        yield s


def node_state(agent: AgentServer) -> na.NodeState:
    """What the agent reports, without the fields every change moves."""
    with grpc.insecure_channel(agent.address) as ch:
        state = NodeAgentServiceStub(ch).GetState(na.GetStateRequest(), timeout=5).state
    state.generation = 0
    state.timestamp_ns = 0
    for p in state.protected_flows:
        # A restored protection runs out when it did (to the clock's tick): for the rest of it.
        p.expires_ns = p.ttl_ns = 0
    return state


def seed(agent: AgentServer, method: str, request) -> None:
    """Something in place before the policy acts (set through the agent's own API)."""
    with grpc.insecure_channel(agent.address) as ch:
        getattr(NodeAgentServiceStub(ch), method)(request, timeout=5)


def _seed_rule(agent: AgentServer) -> None:
    rule = na.FlowClassRule(interface_name="veth0", flow=flow(), class_id=0x10020, rewrite_dscp=10)
    seed(agent, "SetFlowClass", na.SetFlowClassRequest(action_id="seed", rule=rule))


def _seed_protection(agent: AgentServer) -> None:
    p = na.ProtectedFlow(
        interface_name="veth0", flow=flow(), latency_slo_ns=60_000_000, class_id=0x10020,
        ttl_ns=600_000_000_000,
    )
    seed(agent, "ProtectFlows", na.ProtectFlowsRequest(action_id="seed", flows=[p]))


def _seed_chain(agent: AgentServer) -> None:
    chain = na.ServiceChain(chain_id="before", traffic_class="gaming")
    chain.functions.add(mark=na.Mark(dscp=10), kind=na.FUNCTION_KIND_BASIC)
    seed(agent, "SetChain", na.SetChainRequest(action_id="seed", chain=chain))


def _seed_power(agent: AgentServer) -> None:
    pol = na.PowerPolicy(
        cores=[2, 3],
        governor="userspace",
        min_frequency_khz=1_000_000,
        max_frequency_khz=2_000_000,
        xman_mode=na.XMAN_MODE_FEEDBACK,
    )
    seed(agent, "SetPowerPolicy", na.SetPowerPolicyRequest(action_id="seed", policy=pol))


CASES: dict[str, tuple[model.Policy, Callable, Callable | None, str]] = {
    "flow, previous rule": (FLOW, flow_det, _seed_rule, "flow_class"),
    "flow, no rule before": (FLOW, flow_det, None, "flow_class"),
    "class rate": (RATE, rate_det, None, "class_rate"),
    "chain, previous chain": (CHAIN, chain_det, _seed_chain, "chain"),
    "chain, none before": (CHAIN, chain_det, None, "chain"),
    "power": (POWER, power_det, _seed_power, "power_policies"),
    "protect, previous protection": (PROTECT, flow_det, _seed_protection, "protections"),
    "protect, none before": (PROTECT, flow_det, None, "protections"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_rollback_restores_the_state_the_agent_had(agent: AgentServer, case: str) -> None:
    p, make_det, before_fn, previous_kind = CASES[case]
    if before_fn is not None:
        before_fn(agent)
    before = node_state(agent)
    clock = ManualClock()
    node = NodeAgentActuator({"node-a": agent.address})
    engine = Engine([p], Router(node), telemetry=Worse(), journal=Journal(None), clock=clock)
    events = engine.handle(dpb.DetectionBatch(records=[make_det(clock())]))
    assert [e.WhichOneof("event") for e in events] == ["action", "result"], events
    action, applied = events[0].action, events[1].result
    assert applied.state == apb.ACTION_STATE_APPLIED, applied.message
    assert action.WhichOneof("spec") == p.action.operation.value
    assert applied.previous.WhichOneof("state") == previous_kind
    after_apply = node_state(agent)
    assert after_apply != before  # the action changed something the agent reports

    clock.now_ns = applied.applied_ns + 2_000 * MS
    engine.tick()
    rb_action, rb_result, result = (e for e in engine.drain())
    assert result.result.state == apb.ACTION_STATE_ROLLED_BACK
    assert rb_result.result.state == apb.ACTION_STATE_VERIFIED, rb_result.result.message
    # The rollback's own record carries the state it restored, typed.
    assert rb_action.action.rollback_of_action_id == action.id
    assert rb_action.action.rollback == applied.previous
    assert node_state(agent) == before
    node.close()


def test_rollback_to_the_previous_class_not_the_default(agent: AgentServer) -> None:
    """The flow was in 1:20 (DSCP 10) before; the interface's default class is 1:30."""
    _seed_rule(agent)
    p, make_det, _, _ = CASES["flow, previous rule"]
    clock = ManualClock()
    node = NodeAgentActuator({"node-a": agent.address})
    engine = Engine([p], Router(node), telemetry=Worse(), journal=Journal(None), clock=clock)
    applied = engine.handle(dpb.DetectionBatch(records=[make_det(clock())]))[1].result
    assert applied.previous.flow_class == apb.PreviousFlowClass(class_id=0x10020, rewrite_dscp=10)
    clock.now_ns = applied.applied_ns + 2_000 * MS
    engine.tick()
    engine.drain()
    (rule,) = node_state(agent).flow_classes
    assert (rule.class_id, rule.rewrite_dscp) == (0x10020, 10)
    node.close()


# --- old records --------------------------------------------------------------------------


def _old_entries() -> tuple[apb.Action, apb.ActionResult]:
    """An action and result as engines wrote them before typed actions (the golden vector of
    that time): parameters and previous_parameters maps."""
    batch = apb.ActionBatch.FromString(OLD_VECTOR.read_bytes())
    return batch.events[0].action, batch.events[1].result


def test_old_records_still_read_as_typed_operations() -> None:
    action, result = _old_entries()
    assert dict(action.parameters) and action.WhichOneof("spec") is None
    assert parameters.spec_of(action) == apb.ReprioritiseFlowAction(
        class_id=0x10030, rewrite_dscp=0
    )
    previous = parameters.previous_of(result, action.operation)
    assert previous.flow_class == apb.PreviousFlowClass(class_id=0x10010, rewrite_dscp=46)


def test_a_journaled_old_action_is_applied_and_rolled_back_after_a_restart(
    agent: AgentServer, tmp_path: Path
) -> None:
    """The journal of an engine from before typed actions holds an applied action with maps:
    the restarted engine verifies it and rolls it back from its old previous_parameters."""
    _seed_rule(agent)
    before = node_state(agent)
    clock = ManualClock()
    old, _ = _old_entries()
    action = apb.Action()
    action.CopyFrom(old)
    action.policy_id = FLOW.id
    action.dry_run = False
    action.rollback_of_action_id = ""
    action.target.interface_name = "veth0"
    action.target.flow.CopyFrom(flow())
    action.parameters["class_id"] = str(0x10010)
    node = NodeAgentActuator({"node-a": agent.address})
    applied = node.apply(action)  # what the old engine did before it stopped
    old_result = apb.ActionResult(
        action_id=action.id,
        state=apb.ACTION_STATE_APPLIED,
        applied_ns=clock(),
        previous_parameters={"class_id": str(0x10020), "rewrite_dscp": "10"},
    )
    old_result.header.sequence = 9
    assert applied.previous.flow_class.class_id == 0x10020
    path = tmp_path / "journal.jsonl"
    journal = Journal(path, fsync=False)
    journal.record(Entry(action, old_result, "node=node-a"))
    journal.close()

    engine = Engine(
        [FLOW], Router(node), telemetry=Worse(), journal=Journal(path, fsync=False), clock=clock
    )
    engine.drain()
    clock.now_ns = old_result.applied_ns + 2_000 * MS
    engine.tick()
    states = [e.result.state for e in engine.drain() if e.WhichOneof("event") == "result"]
    assert states == [apb.ACTION_STATE_VERIFIED, apb.ACTION_STATE_ROLLED_BACK]
    assert node_state(agent) == before
    engine.journal.close()
    node.close()


def test_an_old_chain_record_without_parameters_fails_its_rollback_by_name() -> None:
    result = apb.ActionResult(
        previous_parameters={"chain_id": "c", "traffic_class": "gaming", "functions": "acl:2:0"}
    )
    with pytest.raises(parameters.ParameterError, match="without its functions' parameters"):
        parameters.previous_of(result, apb.ACTION_OPERATION_SET_CHAIN)
