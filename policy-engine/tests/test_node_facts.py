"""Node-level actions as facts: what a node's micro loop did is not ordered again while it
holds, is verified like the engine's own actions (and rolled back on a worse verdict), is
overridden by a later decision of the engine, and survives a restart."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from cgloop.policy import model
from cgloop.policy.actuators import NodeAgentActuator, Router
from cgloop.policy.engine import Engine
from cgloop.policy.journal import Journal
from cgloop.policy.telemetry import Reading
from cgloop.policy.testing import (
    AgentServer,
    ManualClock,
    MemoryNodeAgent,
    detection,
    flow,
    node_flow_move,
    reprioritise_policy,
)
from cgloop.v1 import action_pb2 as apb
from cgloop.v1 import detection_pb2 as dpb
from cgloop.v1 import node_agent_pb2 as na
from cgloop.v1.node_agent_pb2_grpc import NodeAgentServiceStub

MS = 1_000_000
S = 1_000_000_000
GAMING, BEST_EFFORT, DEMOTED = 0x10010, 0x10030, 0x10020
REPRIORITISE = reprioritise_policy()
DEMOTE = reprioritise_policy("demote", "l4s_unresponsive_ecn", DEMOTED, 0)
PROTECT = """
id: protect
match: {kinds: [gaming_flow_classified], subject: flow, severity_at_least: info}
action:
  operation: protect_flow
  target: {node_id: "{label:node_id}", interface_name: "{label:interface}"}
  parameters: {latency_slo_ns: 20000000, class_id: 0x10010, rewrite_dscp: 46, ttl_ns: 30000000000}
"""


class Fixed:
    """Telemetry: `before` then `after` for every metric."""

    def __init__(self, before: float, after: float) -> None:
        self.before, self.after = before, after

    def read(self, metric, action, start_ns, end_ns, phase="after") -> Reading:
        return Reading(self.before if phase == "before" else self.after, 20)


def policies(*texts: str) -> list[model.Policy]:
    return [p for t in texts for p in model.parse_policies(t)]


@pytest.fixture
def agent() -> Iterator[AgentServer]:
    with AgentServer(MemoryNodeAgent("node-a")) as server:
        yield server


def stub(agent: AgentServer) -> NodeAgentServiceStub:
    return NodeAgentServiceStub(grpc.insecure_channel(agent.address))


def rules(agent: AgentServer) -> list[tuple[int, int]]:
    state = stub(agent).GetState(na.GetStateRequest(), timeout=5).state
    return [(r.class_id, r.rewrite_dscp) for r in state.flow_classes]


def node_move(
    agent: AgentServer | None, class_id: int, dscp: int, previous: int | None, at_ns: int
) -> apb.ActionBatch:
    """What the node's latency guard announces when it moves the flow (and, given the agent,
    the rule it writes)."""
    batch = node_flow_move(class_id, dscp, previous, at_ns)
    if agent is not None:
        rule = na.FlowClassRule(
            interface_name="veth0", flow=flow(), class_id=class_id, rewrite_dscp=dscp
        )
        req = na.SetFlowClassRequest(action_id=batch.events[0].action.id, rule=rule)
        stub(agent).SetFlowClass(req, timeout=5)
    return batch


def make(agent: AgentServer, ps, clock, telemetry=None, journal=None) -> Engine:
    actuator = Router(NodeAgentActuator({"node-a": agent.address}))
    return Engine(
        ps, actuator, telemetry=telemetry, journal=journal or Journal(None), clock=clock
    )


def slo(clock: ManualClock) -> dpb.DetectionBatch:
    return dpb.DetectionBatch(records=[detection(clock())])


def of(events, kind: str) -> list:
    return [getattr(e, kind) for e in events if e.WhichOneof("event") == kind]


def test_the_same_change_is_not_ordered_again_while_the_nodes_holds(agent) -> None:
    clock = ManualClock()
    engine = make(agent, policies(REPRIORITISE), clock)
    engine.observe(node_move(agent, GAMING, 46, None, clock()))
    (verified,) = of(engine.drain(), "result")  # nothing to expect: not checked, like its own
    assert verified.state == apb.ACTION_STATE_VERIFIED and "not checked" in verified.message
    assert verified.header.source_id == "policy-engine"
    calls = len(agent.agent.calls)
    clock.advance(1)
    assert engine.handle(slo(clock)) == []  # nothing ordered, nothing recorded
    assert engine.facts.stats.node_held == 1
    assert len(agent.agent.calls) == calls  # nothing sent to the agent
    # The node releases the flow (back to best effort): the engine's decision goes through.
    clock.advance(1)
    engine.observe(node_move(agent, BEST_EFFORT, 0, GAMING, clock()))
    clock.advance(1)
    events = engine.handle(slo(clock))
    assert [r.state for r in of(events, "result")] == [
        apb.ACTION_STATE_VERIFIED,  # the release, not checked
        apb.ACTION_STATE_APPLIED,
        apb.ACTION_STATE_VERIFIED,
    ]
    assert rules(agent) == [(GAMING, 46)]


def test_a_later_decision_of_the_engine_overrides_the_node(agent) -> None:
    clock = ManualClock()
    engine = make(agent, policies(REPRIORITISE, DEMOTE), clock)
    engine.observe(node_move(agent, GAMING, 46, None, clock()))
    det = detection(clock(), kind=dpb.DETECTION_KIND_L4S_UNRESPONSIVE_ECN)
    events = engine.handle(dpb.DetectionBatch(records=[det]))
    applied = [r for r in of(events, "result") if r.state == apb.ACTION_STATE_APPLIED]
    assert applied and applied[0].previous.flow_class.class_id == GAMING
    assert rules(agent) == [(DEMOTED, 0)]
    # The node's fact is over: the engine may move the flow to gaming itself again.
    events = engine.handle(slo(clock))
    assert apb.ACTION_STATE_APPLIED in [r.state for r in of(events, "result")]


def test_a_promotion_of_a_protected_flow_is_verified_against_its_slo(agent) -> None:
    clock = ManualClock()
    engine = make(agent, policies(PROTECT), clock, telemetry=Fixed(30 * MS, 12 * MS))
    labels = {"node_id": "node-a", "interface": "veth0"}
    det = detection(clock(), kind=dpb.DETECTION_KIND_GAMING_FLOW_CLASSIFIED,
                    severity=dpb.SEVERITY_INFO, labels=labels)
    engine.handle(dpb.DetectionBatch(records=[det]))
    promotion = node_move(agent, GAMING, 46, None, clock())
    engine.observe(promotion)
    assert of(engine.drain(), "result") == []  # due after 1 s
    clock.now_ns = time.time_ns() + 2 * S
    engine.tick()
    (verified,) = of(engine.drain(), "result")
    assert verified.action_id == promotion.events[0].action.id
    assert verified.state == apb.ACTION_STATE_VERIFIED
    assert verified.verification.verdict == apb.VERDICT_IMPROVED
    assert "expected 2e+07" in verified.verification.detail  # the protection's 20 ms SLO
    assert verified.applied_ns == promotion.events[1].result.applied_ns


def test_a_worse_node_change_is_rolled_back_to_the_rule_before(agent) -> None:
    clock = ManualClock()
    engine = make(agent, policies(PROTECT), clock, telemetry=Fixed(12 * MS, 40 * MS))
    engine.observe(node_move(agent, GAMING, 46, None, clock()))  # expects nothing: no protection
    engine.drain()
    labels = {"node_id": "node-a", "interface": "veth0"}
    det = detection(clock(), kind=dpb.DETECTION_KIND_GAMING_FLOW_CLASSIFIED,
                    severity=dpb.SEVERITY_INFO, labels=labels)
    engine.handle(dpb.DetectionBatch(records=[det]))
    promotion = node_move(agent, GAMING, 46, None, clock())
    engine.observe(promotion)
    assert rules(agent) == [(GAMING, 46)]
    clock.now_ns = time.time_ns() + 2 * S
    engine.tick()
    rb, rb_result, result = engine.drain()
    assert rb.action.rollback_of_action_id == promotion.events[0].action.id
    assert rb.action.level == apb.ACTION_LEVEL_MICRO  # the engine's decision, on the node
    assert rb_result.result.state == apb.ACTION_STATE_VERIFIED
    assert result.result.state == apb.ACTION_STATE_ROLLED_BACK
    assert result.result.verification.verdict == apb.VERDICT_WORSE
    assert rules(agent) == []  # no rule before the node's promotion
    # The node's promotion is undone: no longer a fact that would refuse the same move.
    assert engine.facts.classes == {}


class Onset:
    """Telemetry of a fault the node's guard met at its onset: before the move all queues were
    quiet (3 ms); after it the queue the flow left is at 80 ms, the flow's new queue at 25 ms
    (over the 20 ms SLO, far better than staying)."""

    def __init__(self, applied_ns: int) -> None:
        self.applied_ns = applied_ns

    def read(self, metric, action, start_ns, end_ns, phase="after") -> Reading:
        if phase == "after":
            return Reading(25 * MS, 20)
        return Reading(3 * MS if end_ns <= self.applied_ns else 80 * MS, 20)


def test_a_promotion_at_a_faults_onset_is_judged_against_the_queue_it_left(agent) -> None:
    """Compared with the quiet time before the fault, the promoted flow's 25 ms reads WORSE and
    the engine would put it back into the 80 ms queue; against the queue it left, over the same
    window, the move helped: no rollback."""
    clock = ManualClock()
    labels = {"node_id": "node-a", "interface": "veth0"}
    det = detection(clock(), kind=dpb.DETECTION_KIND_GAMING_FLOW_CLASSIFIED,
                    severity=dpb.SEVERITY_INFO, labels=labels)
    promotion = node_flow_move(GAMING, 46, None, clock())
    engine = make(agent, policies(PROTECT), clock,
                  telemetry=Onset(promotion.events[1].result.applied_ns))
    engine.handle(dpb.DetectionBatch(records=[det]))
    engine.drain()
    engine.observe(node_move(agent, GAMING, 46, None, clock()))
    clock.now_ns = time.time_ns() + 2 * S
    engine.tick()
    (verified,) = of(engine.drain(), "result")
    assert verified.state == apb.ACTION_STATE_VERIFIED
    assert verified.verification.verdict == apb.VERDICT_NO_EFFECT  # 25 ms: over the SLO still
    assert verified.verification.before_value == 80 * MS
    assert rules(agent) == [(GAMING, 46)]  # kept


def test_other_records_are_counted_or_ignored(agent) -> None:
    clock = ManualClock()
    engine = make(agent, policies(REPRIORITISE), clock)
    own = engine.handle(slo(clock))  # the engine's own events come back on the topic
    batch = apb.ActionBatch(events=own)
    sanction = node_move(None, GAMING, 46, None, clock())
    a = sanction.events[0].action
    a.operation = apb.ACTION_OPERATION_QUEUE_PROTECTION_SANCTION
    a.queue_protection_sanction.sanctioned_packets = 12
    failed = node_move(None, GAMING, 46, None, clock())
    failed.events[1].result.state = apb.ACTION_STATE_FAILED
    old = node_move(None, GAMING, 46, None, clock() - 61 * S)  # history, not a standing fact
    dry = node_move(None, GAMING, 46, None, clock())
    dry.events[0].action.dry_run = True  # the guard's dry run changed nothing
    for b in (batch, sanction, failed, old, dry):
        engine.observe(b)
    assert engine.drain() == []
    s = engine.facts.stats
    counts = (s.node_actions, s.node_other, s.node_not_applied, s.node_stale, s.node_flow_classes)
    assert counts == (4, 1, 2, 1, 0)
    clock.advance(1)
    events = engine.handle(slo(clock))
    assert not [r for r in of(events, "result") if r.state == apb.ACTION_STATE_REFUSED]


def test_facts_survive_a_restart_and_are_never_republished(agent, tmp_path: Path) -> None:
    clock = ManualClock()
    path = tmp_path / "journal.jsonl"
    engine = make(agent, policies(REPRIORITISE), clock, journal=Journal(path))
    move = node_move(agent, GAMING, 46, None, clock())
    for ev in move.events:  # a node's own numbering, far from the engine's
        (ev.action if ev.HasField("action") else ev.result).header.sequence = 10**9
    engine.observe(move)
    engine.observe(move)  # redelivered
    published = engine.drain()
    assert len(published) == 1
    engine.journal.close()
    again = make(agent, policies(REPRIORITISE), clock, journal=Journal(path))
    # The engine numbers its records on from its own (the node's numbers are the node's).
    assert again._sequence == published[0].result.header.sequence
    # The engine's verification was not acknowledged: only it is announced again.
    assert again.drain() == published
    again.observe(move)  # redelivered after the restart: known
    assert again.drain() == []
    clock.advance(1)
    assert again.handle(slo(clock)) == []
    assert again.facts.stats.node_held == 1
    again.journal.close()


def test_a_nodes_change_counts_for_the_cooldown_on_the_flow(agent) -> None:
    clock = ManualClock()
    cooling = reprioritise_policy(
        "demote", "l4s_unresponsive_ecn", DEMOTED, 0, "{hold_time: 0s, cooldown: 5s}"
    )
    engine = make(agent, policies(cooling), clock)
    engine.observe(node_move(agent, GAMING, 46, None, clock()))  # verified at once
    clock.advance(1)
    det = detection(clock(), kind=dpb.DETECTION_KIND_L4S_UNRESPONSIVE_ECN)
    (refused,) = [r for r in of(engine.handle(dpb.DetectionBatch(records=[det])), "result")
                  if r.state == apb.ACTION_STATE_REFUSED]
    assert "guard cooldown" in refused.message
    clock.advance(5)
    det = detection(clock(), kind=dpb.DETECTION_KIND_L4S_UNRESPONSIVE_ECN)
    events = engine.handle(dpb.DetectionBatch(records=[det]))
    assert apb.ACTION_STATE_APPLIED in [r.state for r in of(events, "result")]


def test_a_delivered_verification_is_not_republished_after_compaction(agent, tmp_path) -> None:
    clock = ManualClock()
    path = tmp_path / "journal.jsonl"
    engine = make(agent, policies(REPRIORITISE), clock, journal=Journal(path))
    engine.observe(node_move(agent, GAMING, 46, None, clock()))
    published = engine.drain()
    engine.delivered(published)  # Kafka acknowledged the engine's verification
    engine.journal.compact()
    engine.journal.close()
    again = make(agent, policies(REPRIORITISE), clock, journal=Journal(path))
    assert again.drain() == []
    assert len(again.journal.entries) == 1  # the fact, still known
    again.journal.close()
