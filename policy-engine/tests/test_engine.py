"""The engine end to end without Kafka: real gRPC to an in-memory node agent, real records."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from cgloop.policy import model
from cgloop.policy.actuators import NodeAgentActuator, Router
from cgloop.policy.engine import Engine
from cgloop.policy.journal import Journal
from cgloop.policy.telemetry import WindowStore
from cgloop.policy.testing import (
    AgentBounds,
    AgentServer,
    ManualClock,
    MemoryNodeAgent,
    detection,
    probes,
)
from cgloop.v1 import action_pb2 as apb
from cgloop.v1 import detection_pb2 as dpb
from cgloop.v1 import node_agent_pb2 as na

MS = 1_000_000
# the in-memory agent's cpuinfo range (AgentBounds.cpuinfo_khz)
LO_KHZ, HI_KHZ = 400_000, 5_000_000

POLICY = """
id: gaming
match:
  kinds: [slo_latency]
  severity_at_least: major
  subject: flow
action:
  operation: reprioritise_flow
  target: {node_id: "{label:node_id}", interface_name: "{label:interface}"}
  parameters: {class_id: 0x10010, rewrite_dscp: 46}
  deadline: 500ms
  expect: {metric: probe.p99_rtt_ns, comparator: less_than, value: 30000000, within: 2s}
  rollback_on: [worse]
guards:
  hold_time: 1s
"""


def policy(text: str = POLICY, **override: object) -> model.Policy:
    (p,) = model.parse_policies(text)
    return p.model_copy(update=override) if override else p


@pytest.fixture
def agent() -> Iterator[AgentServer]:
    # A 4-core node: the shipped power and chain policies name cores 2 and 3.
    node = MemoryNodeAgent("node-a", bounds=AgentBounds(online_cpus=[0, 1, 2, 3]))
    with AgentServer(node) as server:
        yield server


def make_engine(
    agent: AgentServer,
    policies: list[model.Policy],
    clock: ManualClock,
    store: WindowStore | None = None,
    journal: Path | None = None,
) -> tuple[Engine, NodeAgentActuator]:
    node = NodeAgentActuator({"node-a": agent.address})
    engine = Engine(
        policies,
        Router(node),
        telemetry=store,
        journal=Journal(journal, fsync=False),
        clock=clock,
    )
    return engine, node


def states(events: list[apb.ActionEvent]) -> list[str]:
    out = []
    for ev in events:
        if ev.WhichOneof("event") == "action":
            out.append(
                "action:" + apb.ActionState.Name(ev.action.state).removeprefix("ACTION_STATE_")
            )
        else:
            out.append(apb.ActionState.Name(ev.result.state).removeprefix("ACTION_STATE_"))
    return out


def test_detection_becomes_a_grpc_call_and_an_audit_trail(agent: AgentServer) -> None:
    clock = ManualClock()
    engine, _ = make_engine(agent, [policy()], clock)
    det = detection(clock())
    events = engine.handle(dpb.DetectionBatch(records=[det]))
    # No telemetry reader: applied, then verified as "not checked".
    assert states(events) == ["action:PROPOSED", "APPLIED", "VERIFIED"]
    action = events[0].action
    assert action.reason_detection_ids == [det.id]
    assert action.policy_id == "gaming" and action.level == apb.ACTION_LEVEL_MICRO
    assert action.target.node_id == "node-a" and action.target.interface_name == "veth0"
    assert action.target.flow == det.flow
    assert action.WhichOneof("spec") == "reprioritise_flow" and not action.parameters
    assert action.reprioritise_flow == apb.ReprioritiseFlowAction(class_id=0x10010, rewrite_dscp=46)
    assert action.expected_effect.metric == "probe.p99_rtt_ns"
    applied = events[1].result
    assert applied.applied_ns > 0 and applied.detection_to_apply_ns > 0
    # The flow had no rule: the typed previous state says so (no class).
    assert applied.previous == apb.PreviousState(flow_class=apb.PreviousFlowClass())
    assert not applied.previous_parameters
    # What reached the agent over gRPC:
    assert agent.agent.calls == [("SetFlowClass", action.id)]
    (rule,) = agent.agent.state.flow_rules.values()
    assert rule.class_id == 0x10010 and rule.rewrite_dscp == 46 and rule.interface_name == "veth0"


def test_flapping_detections_cause_at_most_one_action_per_hold_time(agent: AgentServer) -> None:
    clock = ManualClock()
    engine, _ = make_engine(agent, [policy()], clock)
    for i in range(100):  # 10 s of detections alternating bad / recovered every 100 ms
        sev = dpb.SEVERITY_MAJOR if i % 2 == 0 else dpb.SEVERITY_INFO
        engine.handle(dpb.DetectionBatch(records=[detection(clock(), severity=sev)]))
        clock.advance(0.1)
    # hold time 1 s over 10 s: at most 10 actions applied, one per hold time.
    assert 1 <= engine.stats.applied <= 10
    assert agent.agent.changes == 1  # the same rule each time: applying it again changes nothing
    # With hysteresis (two bad windows in a row), alternating input never triggers.
    quiet = policy(trigger=model.Trigger(consecutive=2, within=1.0), id="gaming2")
    engine2, _ = make_engine(agent, [quiet], clock)
    for i in range(100):
        sev = dpb.SEVERITY_MAJOR if i % 2 == 0 else dpb.SEVERITY_INFO
        engine2.handle(dpb.DetectionBatch(records=[detection(clock(), severity=sev)]))
        clock.advance(0.1)
    assert engine2.stats.applied == 0 and engine2.stats.pending_trigger == 50


def test_hold_time_bounds_actions_on_a_steady_problem(agent: AgentServer) -> None:
    clock = ManualClock()
    engine, _ = make_engine(agent, [policy()], clock)
    for _ in range(50):  # 5 s of bad detections every 100 ms
        engine.handle(dpb.DetectionBatch(records=[detection(clock())]))
        clock.advance(0.1)
    assert engine.stats.applied == 5  # one per 1 s hold time
    assert engine.stats.refused == 45


def test_verification_rolls_back_an_action_that_made_latency_worse(agent: AgentServer) -> None:
    clock = ManualClock()
    store = WindowStore()
    engine, _ = make_engine(agent, [policy()], clock, store)
    t0 = clock()
    store.ingest_probes(probes(t0 - 2_000 * MS, t0, rtt_ns=40 * MS))  # before: 40 ms
    events = engine.handle(dpb.DetectionBatch(records=[detection(t0)]))
    assert states(events) == ["action:PROPOSED", "APPLIED"]
    action_id = events[0].action.id
    applied_ns = events[1].result.applied_ns
    store.ingest_probes(probes(applied_ns, applied_ns + 2_000 * MS, rtt_ns=80 * MS))  # worse
    clock.now_ns = applied_ns + 2_000 * MS
    engine.tick()
    events = engine.drain()
    assert states(events) == ["action:PROPOSED", "VERIFIED", "ROLLED_BACK"]
    rollback, rb_result, result = (events[0].action, events[1].result, events[2].result)
    assert rollback.rollback_of_action_id == action_id
    assert result.verification.verdict == apb.VERDICT_WORSE
    assert result.verification.before_value == 40 * MS
    assert result.verification.after_value == 80 * MS
    assert result.verification.latency_after.p99_ns == 80 * MS
    assert "worse" in result.message
    assert rb_result.action_id == rollback.id
    # The flow had no rule: the rollback removed the one the action added (class 0).
    assert [m for m, _ in agent.agent.calls] == ["SetFlowClass", "SetFlowClass"]
    assert agent.agent.calls[-1][1] == rollback.id
    assert rollback.rollback == apb.PreviousState(flow_class=apb.PreviousFlowClass())
    assert agent.agent.state.flow_rules == {}
    assert engine.stats.rolled_back == 1


def test_verification_keeps_an_action_that_helped(agent: AgentServer) -> None:
    clock = ManualClock()
    store = WindowStore()
    engine, _ = make_engine(agent, [policy()], clock, store)
    t0 = clock()
    store.ingest_probes(probes(t0 - 2_000 * MS, t0, rtt_ns=45 * MS))
    events = engine.handle(dpb.DetectionBatch(records=[detection(t0)]))
    applied_ns = events[1].result.applied_ns
    store.ingest_probes(probes(applied_ns, applied_ns + 2_000 * MS, rtt_ns=12 * MS))
    clock.now_ns = applied_ns + 2_000 * MS
    engine.tick()
    (ev,) = engine.drain()
    assert ev.result.state == apb.ACTION_STATE_VERIFIED
    assert ev.result.verification.verdict == apb.VERDICT_IMPROVED
    assert ev.result.verified_ns == clock()


def test_restart_mid_action_neither_loses_nor_repeats_it(
    agent: AgentServer, tmp_path: Path
) -> None:
    clock = ManualClock()
    store = WindowStore()
    journal = tmp_path / "journal.jsonl"
    engine, node = make_engine(agent, [policy()], clock, store, journal)
    det = detection(clock())
    events = engine.handle(dpb.DetectionBatch(records=[det]))
    assert states(events) == ["action:PROPOSED", "APPLIED"]
    action_id = events[0].action.id
    applied_ns = events[1].result.applied_ns
    engine.journal.close()
    node.close()  # the engine dies before verifying; Kafka will redeliver the detection
    restarted, _ = make_engine(agent, [policy()], clock, store, journal)
    # Nothing re-applied on start; the events nobody confirmed on the bus (no publisher here)
    # are announced again, unchanged.
    assert restarted.drain() == events
    redelivered = restarted.handle(dpb.DetectionBatch(records=[det]))
    assert restarted.stats.skipped_known == 1
    assert redelivered == []  # already announced at the start: not twice
    assert [c for c in agent.agent.calls if c[0] == "SetFlowClass"] == [("SetFlowClass", action_id)]
    # ... and it is still verified after the restart.
    store.ingest_probes(probes(applied_ns, applied_ns + 2_000 * MS, rtt_ns=10 * MS))
    clock.now_ns = applied_ns + 2_000 * MS
    restarted.tick()
    (ev,) = restarted.drain()
    assert ev.result.action_id == action_id and ev.result.state == apb.ACTION_STATE_VERIFIED
    # The guards remember the action: a new detection inside the hold time is refused.
    clock.now_ns = events[0].action.header.timestamp_ns + 500 * MS
    refused = restarted.handle(dpb.DetectionBatch(records=[detection(clock())]))
    assert states(refused) == ["action:REFUSED", "REFUSED"]


class Crash(BaseException):
    """Simulates the process dying (not an error the engine would handle)."""


def test_crash_between_apply_and_journal_replays_not_repeats(
    agent: AgentServer, tmp_path: Path
) -> None:
    clock = ManualClock()
    journal = tmp_path / "journal.jsonl"
    engine, node = make_engine(agent, [policy()], clock, None, journal)
    real_apply = node.apply

    def apply_then_die(action: apb.Action):
        real_apply(action)
        raise Crash

    node.apply = apply_then_die  # type: ignore[method-assign]
    with pytest.raises(Crash):
        engine.handle(dpb.DetectionBatch(records=[detection(clock())]))
    engine.journal.close()
    assert agent.agent.changes == 1
    restarted, _ = make_engine(agent, [policy()], clock, None, journal)
    events = restarted.drain()
    # The proposal never reached the bus before the crash: announced first, then the results.
    assert states(events) == ["action:PROPOSED", "APPLIED", "VERIFIED"]
    assert "replayed" in events[1].result.message
    assert agent.agent.changes == 1  # the agent saw the same action id and did not redo it


def test_dry_run_and_approval_modes(agent: AgentServer) -> None:
    clock = ManualClock()
    dry = policy(id="dry", mode=model.Mode.DRY_RUN)
    engine, _ = make_engine(agent, [dry], clock)
    events = engine.handle(dpb.DetectionBatch(records=[detection(clock())]))
    assert events[0].action.dry_run and states(events) == ["action:PROPOSED", "APPLIED", "VERIFIED"]
    assert agent.agent.changes == 0 and agent.agent.state.flow_rules == {}

    approve = policy(id="approve", mode=model.Mode.APPROVE)
    engine, _ = make_engine(agent, [approve], clock)
    events = engine.handle(dpb.DetectionBatch(records=[detection(clock())]))
    assert states(events) == ["action:PROPOSED"]
    (pending,) = engine.pending_approvals()
    assert agent.agent.changes == 0
    engine.approve(pending.id)
    assert states(engine.drain()) == ["APPLIED", "VERIFIED"]
    assert agent.agent.changes == 1
    # Another one is rejected; a third expires unapproved.
    clock.advance(2)
    engine.handle(dpb.DetectionBatch(records=[detection(clock(), client="10.0.0.3")]))
    (pending,) = engine.pending_approvals()
    engine.reject(pending.id, "not during the tournament")
    (ev,) = engine.drain()
    assert ev.result.state == apb.ACTION_STATE_REFUSED and "tournament" in ev.result.message
    engine.handle(dpb.DetectionBatch(records=[detection(clock(), client="10.0.0.4")]))
    clock.advance(engine.approval_timeout_s + 1)
    engine.tick()
    (ev,) = engine.drain()
    assert ev.result.state == apb.ACTION_STATE_EXPIRED


def test_actuator_errors_fail_the_action_with_the_reason(agent: AgentServer) -> None:
    clock = ManualClock()
    rate = policy(
        """
id: rate
match: {kinds: [classic_queue_burst], subject: queue}
action:
  operation: set_class_rate
  parameters: {class_id: 0x10090, rate_bps: 50000000}
"""
    )
    engine, _ = make_engine(agent, [rate], clock)
    from cgloop.v1.detection_pb2 import QueueRef

    det = detection(
        clock(),
        kind=dpb.DETECTION_KIND_CLASSIC_QUEUE_BURST,
        queue=QueueRef(node_id="node-a", interface_name="veth0", queue_id=3),
    )
    events = engine.handle(dpb.DetectionBatch(records=[det]))
    assert states(events) == ["action:PROPOSED", "FAILED"]
    assert "NOT_FOUND" in events[1].result.message and "1:90" in events[1].result.message
    # Unknown node: failed, naming the node.
    det2 = detection(
        clock(),
        kind=dpb.DETECTION_KIND_CLASSIC_QUEUE_BURST,
        queue=QueueRef(node_id="node-z", interface_name="veth0", queue_id=3),
    )
    events = engine.handle(dpb.DetectionBatch(records=[det2]))
    assert "no node agent address for node 'node-z'" in events[1].result.message


def test_expired_before_apply(agent: AgentServer) -> None:
    clock = ManualClock()
    slow = policy(id="slow", mode=model.Mode.APPROVE)
    engine, _ = make_engine(agent, [slow], clock)
    engine.handle(dpb.DetectionBatch(records=[detection(clock())]))
    (pending,) = engine.pending_approvals()
    clock.advance(engine.approval_timeout_s + 1)
    with pytest.raises(KeyError):
        engine.tick()
        engine.approve(pending.id)
    assert agent.agent.changes == 0


def test_missing_label_is_refused_not_crashed(agent: AgentServer) -> None:
    clock = ManualClock()
    engine, _ = make_engine(agent, [policy()], clock)
    events = engine.handle(dpb.DetectionBatch(records=[detection(clock(), labels={})]))
    assert states(events) == ["action:REFUSED", "REFUSED"]
    assert "no label 'node_id'" in events[1].result.message


def test_shipped_power_and_chain_policies_reach_the_agent(agent: AgentServer) -> None:
    clock = ManualClock()
    policies = [p for p in model.default_policies() if p.id.startswith(("node-", "function-"))]
    engine, _ = make_engine(agent, policies, clock)
    events = engine.handle(
        dpb.DetectionBatch(
            records=[detection(clock(), kind=dpb.DETECTION_KIND_NODE_OVERLOAD, node_id="node-a")]
        )
    )
    assert states(events) == ["action:PROPOSED", "APPLIED", "VERIFIED"]
    pinned = agent.agent.state.power[2]
    assert pinned.xman_mode == 4 and pinned.min_frequency_khz == pinned.max_frequency_khz
    # Latency-critical cores stay in C0 (X-MAN: C1 costs +137 % latency).
    assert all(c.forbid_cstates for c in agent.agent.state.power.values())
    # Coordination: the power action blocks chain changes on the node during its hold.
    det = detection(
        clock(),
        kind=dpb.DETECTION_KIND_FUNCTION_OVERLOAD,
        function_name="fec",
        labels={"node_id": "node-a"},
    )
    events = engine.handle(dpb.DetectionBatch(records=[det]))
    assert states(events) == ["action:REFUSED", "REFUSED"]
    assert "coordination" in events[1].result.message
    # After the hold, the chain change waits for approval, then is CALVIN-placed.
    clock.advance(61)
    det = detection(
        clock(),
        kind=dpb.DETECTION_KIND_FUNCTION_OVERLOAD,
        function_name="fec",
        labels={"node_id": "node-a"},
    )
    events = engine.handle(dpb.DetectionBatch(records=[det]))
    assert states(events) == ["action:PROPOSED"]
    engine.approve(events[0].action.id)
    assert states(engine.drain()) == ["APPLIED", "VERIFIED"]
    chain = agent.agent.state.chains["gaming"]
    # CALVIN-placed: basic functions in BPF, the advanced one on a free core of its own.
    assert [(f.WhichOneof("function"), f.kind, f.core) for f in chain.functions] == [
        ("acl", na.FUNCTION_KIND_BASIC, 0),
        ("mark", na.FUNCTION_KIND_BASIC, 0),
        ("dpi", na.FUNCTION_KIND_ADVANCED, 2),
    ]


def test_connect_opens_reachable_agents_and_names_the_others(agent: AgentServer) -> None:
    actuator = NodeAgentActuator({"node-a": agent.address, "node-b": "unix:/nonexistent/agent"})
    try:
        problems = actuator.connect(timeout_s=0.5)
        assert list(problems) == ["node-b"]
        assert "unix:/nonexistent/agent" in problems["node-b"]
    finally:
        actuator.close()


def test_parameter_templates_are_filled_from_the_detection(agent: AgentServer) -> None:
    clock = ManualClock()
    note = policy(
        """
id: note
match: {kinds: [node_overload], subject: node}
action:
  operation: notify
  parameters: {message: "node {subject} overloaded on {label:interface}"}
"""
    )
    engine, _ = make_engine(agent, [note], clock)
    det = detection(clock(), kind=dpb.DETECTION_KIND_NODE_OVERLOAD, node_id="node-a")
    action = engine.handle(dpb.DetectionBatch(records=[det]))[0].action
    assert action.notify == apb.NotifyAction(message="node node-a overloaded on veth0")
    # A label the detection lacks refuses the action, naming it.
    det = detection(
        clock(), kind=dpb.DETECTION_KIND_NODE_OVERLOAD, node_id="node-b", labels={"x": "y"}
    )
    events = engine.handle(dpb.DetectionBatch(records=[det]))
    assert states(events) == ["action:REFUSED", "REFUSED"]
    assert "no label 'interface'" in events[1].result.message


def test_a_decision_held_by_an_action_in_flight_is_decided_once_it_ends(
    agent: AgentServer,
) -> None:
    """Two policies answer one detection on one target: the second waits for the first's
    verification (guard in_flight) and is then decided, not refused; detectors alert once
    per episode, so a refusal would lose its lever for the whole episode."""
    clock = ManualClock()
    store = WindowStore()
    second = policy(POLICY.replace("id: gaming", "id: gaming-ef").replace("0x10010", "0x10020"))
    engine, _ = make_engine(agent, [policy(), second], clock, store)
    t0 = clock()
    store.ingest_probes(probes(t0 - 2_000 * MS, t0, rtt_ns=45 * MS))
    events = engine.handle(dpb.DetectionBatch(records=[detection(t0)]))
    assert states(events) == ["action:PROPOSED", "APPLIED"]  # the second is parked, no record
    assert engine.stats.parked == 1 and engine.stats.refused == 0 and len(engine._parked) == 1
    applied_ns = events[1].result.applied_ns
    store.ingest_probes(probes(applied_ns, applied_ns + 2_000 * MS, rtt_ns=12 * MS))
    clock.now_ns = applied_ns + 2_000 * MS
    engine.tick()  # the first verifies, which frees the target: the second is decided
    events = engine.drain()
    assert states(events) == ["VERIFIED", "action:PROPOSED", "APPLIED"], states(events)
    assert events[1].action.policy_id == "gaming-ef"
    assert [c for c, _ in agent.agent.calls] == ["SetFlowClass", "SetFlowClass"]
    assert not engine._parked


def test_a_parked_decision_is_refused_when_the_target_stays_busy(agent: AgentServer) -> None:
    clock = ManualClock()
    store = WindowStore()
    second = policy(POLICY.replace("id: gaming", "id: gaming-ef").replace("0x10010", "0x10020"))
    engine, _ = make_engine(agent, [policy(), second], clock, store)
    engine.park_s = 1.0
    engine.handle(dpb.DetectionBatch(records=[detection(clock())]))
    clock.advance(1.1)  # the first is still being verified (within 2 s)
    engine.tick()
    events = engine.drain()
    assert states(events) == ["action:REFUSED", "REFUSED"]
    assert "in_flight" in events[1].result.message and "waited 1 s" in events[1].result.message
    assert engine.stats.refused == 1 and not engine._parked


def test_x_man_moving_its_latency_critical_core_releases_the_old_one_first() -> None:
    """The agent keeps at most all cores but one out of C-states, counting what earlier policies
    forbade: X-MAN on core 1, then on core 0 (the hog moved) must allow core 1's C-states again
    before it forbids core 0's. The in-memory agent refuses as the real one does."""
    node = MemoryNodeAgent("node-a", bounds=AgentBounds(online_cpus=[0, 1]))
    with AgentServer(node) as server:
        actuator = NodeAgentActuator({"node-a": server.address})
        for i, critical in enumerate(([1], [0])):
            action = apb.Action(
                id=f"xman-{i}", operation=apb.ACTION_OPERATION_SET_POWER_POLICY,
                target=apb.ActionTarget(node_id="node-a"),
                set_power_policy=apb.SetPowerPolicyAction(
                    cores=[0, 1], latency_critical=critical, xman_mode=na.XMAN_MODE_LOAD,
                    min_frequency_khz=LO_KHZ, max_frequency_khz=HI_KHZ,
                ),
            )
            actuator.apply(action)
        assert [c for c, p in sorted(node.state.power.items()) if p.forbid_cstates] == [0]
        # forbidding both at once is what the agent refuses
        with pytest.raises(Exception, match="max_cstate_forbidden_cores"):
            actuator.apply(apb.Action(
                id="both", operation=apb.ACTION_OPERATION_SET_POWER_POLICY,
                target=apb.ActionTarget(node_id="node-a"),
                set_power_policy=apb.SetPowerPolicyAction(
                    cores=[0, 1], latency_critical=[0, 1], xman_mode=na.XMAN_MODE_LOAD,
                    min_frequency_khz=LO_KHZ, max_frequency_khz=HI_KHZ,
                ),
            ))
