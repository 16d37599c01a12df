"""Protections: the shipped policy protects a classified gaming flow on its node, renews the
protection while the classifier sees the flow (never letting it lapse, never refused by the
change guards or the budget), and a protection never holds back the flow's reprioritise."""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import pytest
from cgloop.policy import model, testing
from cgloop.policy.actuators import NodeAgentActuator, Router
from cgloop.policy.engine import Engine
from cgloop.policy.guards import Budget
from cgloop.policy.journal import Journal
from cgloop.policy.testing import (
    AgentServer,
    ManualClock,
    MemoryNodeAgent,
    detection,
    flow,
    reprioritise_policy,
)
from cgloop.v1 import action_pb2 as apb
from cgloop.v1 import detection_pb2 as dpb
from cgloop.v1 import node_agent_pb2 as na
from cgloop.v1.node_agent_pb2_grpc import NodeAgentServiceStub

S = 1_000_000_000
REPRIORITISE = reprioritise_policy(guards="{hold_time: 10s, cooldown: 5s}")


@pytest.fixture
def agent() -> Iterator[AgentServer]:
    with AgentServer(MemoryNodeAgent("node-a")) as server:
        yield server


def shipped() -> list[model.Policy]:
    return [p for p in model.default_policies() if p.id.startswith("gaming-protect-")]


def classified(now: int, port: int = 40000, **labels: str) -> dpb.Detection:
    return testing.classified(now, port=port, **labels)


def engine_for(agent: AgentServer, policies, clock, **kw) -> Engine:
    actuator = Router(NodeAgentActuator({"node-a": agent.address}))
    return Engine(policies, actuator, journal=Journal(None), clock=clock, **kw)


def protections(agent: AgentServer) -> list[na.ProtectedFlow]:
    with grpc.insecure_channel(agent.address) as ch:
        stub = NodeAgentServiceStub(ch)
        return list(stub.GetState(na.GetStateRequest(), timeout=5).state.protected_flows)


def results(events, state: int) -> list[apb.ActionResult]:
    return [
        e.result for e in events if e.WhichOneof("event") == "result" and e.result.state == state
    ]


def test_a_classified_flow_is_protected_with_its_platforms_slo(agent: AgentServer) -> None:
    clock = ManualClock()
    engine = engine_for(agent, shipped(), clock)
    events = engine.handle(dpb.DetectionBatch(records=[classified(clock())]))
    (action,) = [e.action for e in events if e.WhichOneof("event") == "action"]
    assert action.policy_id == "gaming-protect-std"
    assert action.operation == apb.ACTION_OPERATION_PROTECT_FLOW
    spec = action.protect_flow
    assert (spec.latency_slo_ns, spec.class_id, spec.ttl_ns) == (60_000_000, 0x10010, 30 * S)
    (applied,) = results(events, apb.ACTION_STATE_APPLIED)
    assert applied.previous.WhichOneof("state") == "protections"
    (p,) = protections(agent)
    assert (p.interface_name, p.flow, p.latency_slo_ns) == ("veth0", flow(), 60_000_000)
    assert p.rewrite_dscp == 46
    assert p.ttl_ns == 30 * S


def test_renewed_while_seen_and_never_refused(agent: AgentServer) -> None:
    """A detection every 0.5 s for 2 minutes, with a global budget of 3 actions a minute: a
    renewal after every 15 s (half the 30 s ttl), nothing in between, nothing refused, and the
    protection never lapses between two renewals."""
    clock = ManualClock()
    engine = engine_for(agent, shipped(), clock, budget=Budget(limit=3, window_s=60))
    start = clock()
    applied_at: list[int] = []
    for _ in range(240):
        events = engine.handle(dpb.DetectionBatch(records=[classified(clock())]))
        assert not results(events, apb.ACTION_STATE_REFUSED), events
        applied_at += [clock()] * len(results(events, apb.ACTION_STATE_APPLIED))
        clock.advance(0.5)
    assert len(applied_at) == 8, applied_at  # t = 0, 15, 30 ... 105 s
    assert engine.stats.renewals == 7 and engine.stats.renewals_skipped == 240 - 8
    gaps = [b - a for a, b in zip([start, *applied_at], [*applied_at, clock()], strict=True)]
    assert max(gaps) < 30 * S  # each renewal came before the previous one lapsed
    # The budget is for changes: another flow's first protection still gets through.
    events = engine.handle(dpb.DetectionBatch(records=[classified(clock(), port=40001)]))
    assert results(events, apb.ACTION_STATE_APPLIED)


def test_new_terms_are_a_change_and_a_lapsed_protection_is_protected_anew(agent) -> None:
    clock = ManualClock()
    engine = engine_for(agent, shipped(), clock)
    engine.handle(dpb.DetectionBatch(records=[classified(clock())]))
    clock.advance(3)  # past the 2 s hold: another platform's SLO is a change, sent at once
    events = engine.handle(dpb.DetectionBatch(records=[classified(clock(), platform="gfn")]))
    (applied,) = results(events, apb.ACTION_STATE_APPLIED)
    assert applied.previous.protections.flows[0].latency_slo_ns == 60_000_000
    assert protections(agent)[0].latency_slo_ns == 100_000_000
    clock.advance(31)  # no detection for longer than the ttl: lapsed, protected anew
    events = engine.handle(dpb.DetectionBatch(records=[classified(clock(), platform="gfn")]))
    assert results(events, apb.ACTION_STATE_APPLIED)
    assert engine.stats.renewals == 0


def test_a_protection_never_holds_back_the_flows_reprioritise(agent: AgentServer) -> None:
    clock = ManualClock()
    (reprioritise,) = model.parse_policies(REPRIORITISE)
    engine = engine_for(agent, [*shipped(), reprioritise], clock)
    engine.handle(dpb.DetectionBatch(records=[classified(clock())]))
    clock.advance(0.5)
    slo = detection(clock(), labels={"node_id": "node-a", "interface": "veth0"})
    events = engine.handle(dpb.DetectionBatch(records=[slo]))
    (applied,) = results(events, apb.ACTION_STATE_APPLIED)  # no cooldown, no in-flight refusal
    assert applied.previous.WhichOneof("state") == "flow_class"


def test_a_lease_survives_a_restart(agent: AgentServer, tmp_path) -> None:
    clock = ManualClock()
    path = tmp_path / "journal.jsonl"
    engine = engine_for(agent, shipped(), clock)
    engine.journal = Journal(path)
    engine.handle(dpb.DetectionBatch(records=[classified(clock())]))
    engine.journal.close()
    clock.advance(1)
    again = Engine(
        shipped(), Router(NodeAgentActuator({"node-a": agent.address})), journal=Journal(path),
        clock=clock,
    )
    again.handle(dpb.DetectionBatch(records=[classified(clock())]))
    assert again.stats.renewals_skipped == 1
    assert [m for m, _ in agent.agent.calls if m == "ProtectFlows"] == ["ProtectFlows"]
    again.journal.close()


def test_a_failed_protection_is_retried_after_a_pause_not_on_every_detection() -> None:
    agent = MemoryNodeAgent("node-a", hierarchies=())  # no queues: the agent refuses
    with AgentServer(agent) as server:
        clock = ManualClock()
        engine = engine_for(server, shipped(), clock)
        states = []
        for _ in range(12):  # 6 s of detections, every 0.5 s
            events = engine.handle(dpb.DetectionBatch(records=[classified(clock())]))
            states += [e.result.state for e in events if e.WhichOneof("event") == "result"]
            clock.advance(0.5)
        # One attempt at 0 s, the next at 5 s (retry_after_s), nothing refused in between.
        assert states == [apb.ACTION_STATE_FAILED, apb.ACTION_STATE_FAILED]
        assert engine.stats.protect_backoff == 10
        assert [m for m, _ in agent.calls] == ["ProtectFlows", "ProtectFlows"]


def test_lapsed_leases_are_swept() -> None:
    from cgloop.policy.leases import Leases

    leases = Leases(sweep_every=2)
    spec = apb.ProtectFlowAction(latency_slo_ns=20_000_000, class_id=0x10010, ttl_ns=30 * S)
    leases.applied("a", "x", spec, 0)
    leases.failed("b", 0)
    leases.standing("c", spec, 10 * S)
    assert set(leases.by_target) == {"a"} and set(leases.failed_at) == {"b"}
    leases.standing("c", spec, 10 * S)  # second call: swept at 10 s, the failure has aged
    assert set(leases.by_target) == {"a"} and leases.failed_at == {}
    leases.standing("c", spec, 31 * S)
    leases.standing("c", spec, 31 * S)
    assert leases.by_target == {}


def test_a_dry_run_policy_records_what_it_would_send(agent: AgentServer) -> None:
    clock = ManualClock()
    dry = [p.model_copy(update={"mode": model.Mode.DRY_RUN}) for p in shipped()]
    engine = engine_for(agent, dry, clock)
    states = []
    for _ in range(40):  # 20 s of detections
        events = engine.handle(dpb.DetectionBatch(records=[classified(clock())]))
        states += [e.result.state for e in events if e.WhichOneof("event") == "result"]
        clock.advance(0.5)
    # What enforcement would do: the protection at 0 s, its renewal at 15 s; nothing refused.
    assert states == [apb.ACTION_STATE_APPLIED, apb.ACTION_STATE_VERIFIED] * 2
    assert protections(agent) == []  # a dry run protects nothing
    (key,) = engine.leases.by_target
    assert engine.leases.live(key, clock()) is None


def test_a_protection_in_flight_is_not_sent_again() -> None:
    """A slow agent: a protection (the first, or its renewal) takes longer than the
    classifier's next check; the detections meanwhile are dropped, not refused as in_flight."""
    agent = MemoryNodeAgent("node-a")
    with AgentServer(agent) as server:
        clock = ManualClock()
        engine = engine_for(server, shipped(), clock, apply_async=True)
        agent.apply_delay_s = 0.5
        for at in (0, 16):  # the first protection, then its renewal (past half the ttl)
            clock.now_ns += at * S
            for _ in range(3):
                events = engine.handle(dpb.DetectionBatch(records=[classified(clock())]))
                assert not [e for e in events if e.HasField("result")
                            and e.result.state == apb.ACTION_STATE_REFUSED], events
                clock.advance(0.1)
            engine.finish_applies()
        assert [m for m, _ in agent.calls].count("ProtectFlows") == 2
        assert engine.stats.renewals == 1
