"""The audit trail survives a crash: every journaled event reaches the bus, once acknowledged.

The journal learns from the publisher which events Kafka acknowledged; a restarted engine
republishes, for every action whose latest event was not acknowledged, its action and its
latest result. Here the "publisher" is the test: it confirms some events and not others, as a
crash between the journal's commit and the producer's flush leaves them.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from cgloop.policy import model
from cgloop.policy.actuators import NodeAgentActuator, Router
from cgloop.policy.engine import Engine
from cgloop.policy.journal import Journal, event_sequence
from cgloop.policy.testing import AgentServer, ManualClock, MemoryNodeAgent, detection
from cgloop.v1 import action_pb2 as apb
from cgloop.v1 import detection_pb2 as dpb

POLICY = """
id: gaming
match: {kinds: [slo_latency], severity_at_least: major, subject: flow}
action:
  operation: reprioritise_flow
  target: {node_id: "{label:node_id}", interface_name: "{label:interface}"}
  parameters: {class_id: 0x10010, rewrite_dscp: 46}
  deadline: 5s
guards: {hold_time: 1s}
"""


@pytest.fixture
def agent() -> Iterator[AgentServer]:
    with AgentServer(MemoryNodeAgent("node-a"), workers=4) as server:
        yield server


def _engine(agent: AgentServer, path: Path, clock: ManualClock, **journal: object) -> Engine:
    (p,) = model.parse_policies(POLICY)
    return Engine(
        [p],
        Router(NodeAgentActuator({"node-a": agent.address})),
        journal=Journal(path, fsync=False, **journal),  # type: ignore[arg-type]
        clock=clock,
    )


def _of(events: list[apb.ActionEvent], action_id: str) -> list[apb.ActionEvent]:
    return [ev for ev in events if event_sequence(ev)[0] == action_id]


def test_results_journaled_but_never_acknowledged_are_published_after_a_restart(
    agent: AgentServer, tmp_path: Path
) -> None:
    clock = ManualClock()
    path = tmp_path / "journal.jsonl"
    engine = _engine(agent, path, clock)
    dets = [detection(clock(), client=f"10.9.0.{i}") for i in range(1, 11)]
    events = engine.handle(dpb.DetectionBatch(records=dets))
    ids = [ev.action.id for ev in events if ev.WhichOneof("event") == "action"]
    assert len(ids) == 10 and len(events) == 30  # PROPOSED, APPLIED, VERIFIED each
    # Kafka acknowledged everything of actions 0-3, and action 4's proposal and apply; the
    # process died before the rest was acknowledged (their journal rows are durable).
    engine.delivered([ev for i in ids[:4] for ev in _of(events, i)])
    engine.delivered(_of(events, ids[4])[:2])
    engine.journal.close()

    restarted = _engine(agent, path, clock)
    again = restarted.drain()
    # Exactly what the journal holds and the bus lacks: action 4's verification, and the
    # proposal and final result of actions 5-9 (the final result carries the apply's fields).
    expected = _of(events, ids[4])[2:]
    for i in ids[5:]:
        mine = _of(events, i)
        expected += [mine[0], mine[-1]]
    assert again == expected
    for i in ids:
        final = restarted.journal.get(i)
        assert final is not None and final.state == apb.ACTION_STATE_VERIFIED
    # Kafka redelivers the detections (their offsets were not committed): nothing decided,
    # applied or announced twice.
    assert restarted.handle(dpb.DetectionBatch(records=dets)) == []
    assert agent.agent.changes == 10
    # Once those are acknowledged, a further restart owes the bus nothing.
    restarted.delivered(again)
    restarted.journal.close()
    third = _engine(agent, path, clock)
    assert third.drain() == []
    third.journal.close()


def test_delivery_marks_survive_compaction_and_a_torn_last_row(
    agent: AgentServer, tmp_path: Path
) -> None:
    clock = ManualClock()
    path = tmp_path / "journal.jsonl"
    engine = _engine(agent, path, clock, compact_min_rows=1, compact_factor=100)
    dets = [detection(clock(), client=f"10.9.1.{i}") for i in range(1, 7)]
    events = engine.handle(dpb.DetectionBatch(records=dets))
    ids = [ev.action.id for ev in events if ev.WhichOneof("event") == "action"]
    engine.delivered([ev for i in ids[:3] for ev in _of(events, i)])
    engine.journal.compact()
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(rows) == 6 and all("action" in r for r in rows)  # marks folded into the rows
    engine.delivered(_of(events, ids[3]))  # a mark after the compaction, as its own row
    engine.journal.close()
    with path.open("a") as fh:
        fh.write('{"delivered": {"')  # the crash tore the last row
    restarted = _engine(agent, path, clock)
    again = restarted.drain()
    assert {event_sequence(ev)[0] for ev in again} == set(ids[4:])
    assert len(again) == 4
    restarted.journal.close()


def test_a_journal_without_marks_republishes_every_action_once(
    agent: AgentServer, tmp_path: Path
) -> None:
    """A journal written before delivery marks existed: nothing is known delivered, so every
    action and its latest result go out once more (duplicates the store keeps once)."""
    clock = ManualClock()
    path = tmp_path / "journal.jsonl"
    engine = _engine(agent, path, clock)
    events = engine.handle(dpb.DetectionBatch(records=[detection(clock(), client="10.9.2.1")]))
    engine.journal.close()
    restarted = _engine(agent, path, clock)
    assert restarted.drain() == [events[0], events[-1]]
    restarted.journal.close()
