"""Journal group commit and compaction; the engine's asynchronous applies."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from cgloop.policy import model
from cgloop.policy.actuators import NodeAgentActuator, Router
from cgloop.policy.engine import Engine
from cgloop.policy.journal import Entry, Journal
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


def entry(i: int, state: int = apb.ACTION_STATE_PROPOSED, seq: int = 0) -> Entry:
    action = apb.Action(id=f"a{i:05d}", policy_id="p", state=apb.ACTION_STATE_PROPOSED)
    result = None
    if state != apb.ACTION_STATE_PROPOSED:
        result = apb.ActionResult(action_id=action.id, state=state, message=f"m{seq}")
    return Entry(action, result, f"t{i}")


def snapshot(j: Journal) -> list[tuple[str, int, str]]:
    return [
        (i, j.entries[i].state, j.entries[i].result.message if j.entries[i].result else "")
        for i in j.order
    ]


def test_group_commit_keeps_every_row_in_order_with_few_fsyncs(tmp_path: Path) -> None:
    path = tmp_path / "j.jsonl"
    j = Journal(path, fsync=True, commit_delay_s=0.02)
    for i in range(2000):
        j.record(entry(i))
    for i in range(0, 2000, 2):
        j.record(entry(i, apb.ACTION_STATE_APPLIED, seq=i))
    assert j.seq == 3000
    j.sync()
    assert j.durable_seq == 3000
    assert j.commits < 300, f"{j.commits} commits for 3000 rows"
    before = snapshot(j)
    j.close()
    again = Journal(path)
    assert snapshot(again) == before
    assert [i for i in again.order] == [f"a{i:05d}" for i in range(2000)]
    again.close()


def test_rows_recorded_after_the_last_durable_point_are_all_there_after_close(
    tmp_path: Path,
) -> None:
    path = tmp_path / "j.jsonl"
    j = Journal(path, commit_delay_s=5.0)  # a window far longer than the test
    j.record(entry(1))
    assert j.durable_seq == 0, "nothing is durable before the commit"
    assert not j.wait_durable(1, timeout=0.05)
    j.close()  # an orderly stop commits at once
    assert Journal(path).order == ["a00001"]


def test_compaction_keeps_the_latest_state_of_every_action_in_order(tmp_path: Path) -> None:
    path = tmp_path / "j.jsonl"
    j = Journal(path, commit_delay_s=0.0, compact_factor=2, compact_min_rows=50)
    states = [apb.ACTION_STATE_APPLIED, apb.ACTION_STATE_VERIFIED]
    for i in range(40):
        j.record(entry(i))
        j.sync()
    for rnd in range(6):
        for i in range(40):
            j.record(entry(i, states[rnd % 2], seq=rnd))
            j.sync()
    assert j.compactions >= 1
    before = snapshot(j)
    j.close()
    rows = path.read_text().splitlines()
    assert len(rows) <= 40 * 2 + 1, f"{len(rows)} rows for 40 actions"
    again = Journal(path)
    assert snapshot(again) == before
    # Final actions are known as final (guards), open ones as open.
    assert [e.action.id for e in again.open_entries()] == []
    again.close()


def test_explicit_compaction_then_more_records(tmp_path: Path) -> None:
    path = tmp_path / "j.jsonl"
    j = Journal(path, commit_delay_s=0.0)
    for i in range(10):
        j.record(entry(i))
        j.record(entry(i, apb.ACTION_STATE_APPLIED, seq=1))
    j.compact()
    assert len(path.read_text().splitlines()) == 10
    j.record(entry(10))
    j.close()
    again = Journal(path)
    assert again.order == [f"a{i:05d}" for i in range(11)]
    assert again.entries["a00003"].state == apb.ACTION_STATE_APPLIED
    again.close()


@pytest.fixture
def agent() -> Iterator[AgentServer]:
    with AgentServer(MemoryNodeAgent("node-a"), workers=4) as server:
        yield server


def test_async_applies_leave_the_decision_thread_and_events_wait_for_the_journal(
    agent: AgentServer, tmp_path: Path
) -> None:
    (p,) = model.parse_policies(POLICY)
    clock = ManualClock()
    journal = Journal(tmp_path / "j.jsonl", fsync=True, commit_delay_s=0.3)
    engine = Engine(
        [p], Router(NodeAgentActuator({"node-a": agent.address})), journal=journal,
        clock=clock, apply_async=True,
    )
    dets = [detection(clock(), client=f"10.1.0.{i}") for i in range(1, 21)]
    for d in dets:
        d.id = str(uuid.uuid4())
    out = engine.handle(dpb.DetectionBatch(records=dets), wait=False)
    # Decided (20 targets, 20 actions), announced only once durable: the 0.3 s window is open.
    # Applies that already finished on a slow machine add their results behind the proposals.
    assert out == [] and 20 <= engine.undrained <= 40
    assert journal.wait_durable(journal.seq, timeout=10)
    engine.finish_applies()
    events = engine.drain(wait=False) + engine.drain(wait=True)
    kinds = [ev.WhichOneof("event") for ev in events]
    assert kinds.count("action") == 20
    applied = [ev.result for ev in events if ev.WhichOneof("event") == "result"
               and ev.result.state == apb.ACTION_STATE_APPLIED]
    assert len(applied) == 20
    # Each action's events stay in order: PROPOSED before its result.
    seen: set[str] = set()
    for ev in events:
        if ev.WhichOneof("event") == "action":
            seen.add(ev.action.id)
        else:
            assert ev.result.action_id in seen
    assert sorted(c[1] for c in agent.agent.calls) == sorted(
        ev.action.id for ev in events if ev.WhichOneof("event") == "action")
    # A redelivered batch after all that decides nothing new.
    assert engine.handle(dpb.DetectionBatch(records=dets)) == []
    journal.close()

