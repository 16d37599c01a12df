"""A standby engine's takeover without Kafka: what it adopts from the actions topic (`adopt`),
and that the journal's resume then repeats and loses nothing (real gRPC to an in-memory agent).
The lease and the failover on the real broker: test_standby_kafka.py."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from cgloop.bus.topics import topic
from cgloop.policy import model
from cgloop.policy.actuators import NodeAgentActuator, Router
from cgloop.policy.engine import Engine
from cgloop.policy.journal import Journal
from cgloop.policy.standby import LEASE_TOPIC, Lease, adopt
from cgloop.policy.telemetry import WindowStore
from cgloop.policy.testing import (
    AgentServer,
    ManualClock,
    MemoryNodeAgent,
    detection,
    flow,
    node_flow_move,
    probes,
    reprioritise_policy,
)
from cgloop.v1 import action_pb2 as apb
from cgloop.v1 import detection_pb2 as dpb

MS = 1_000_000

# The engine's gaming policy: a move verified against the probes, rolled back if worse.
POLICY = reprioritise_policy(
    severity="major", guards="{hold_time: 10s}",
    action="deadline: 5s, rollback_on: [worse], expect: {metric: probe.p99_rtt_ns, "
    "comparator: less_than, value: 30000000, within: 2s}",
)


def policy(text: str = POLICY) -> model.Policy:
    (p,) = model.parse_policies(text)
    return p


@pytest.fixture
def agent() -> Iterator[AgentServer]:
    with AgentServer(MemoryNodeAgent("node-a")) as server:
        yield server


def engine(
    agent: AgentServer, source: str, journal: Path, clock: ManualClock, store: WindowStore
) -> Engine:
    return Engine(
        [policy()],
        Router(NodeAgentActuator({"node-a": agent.address})),
        telemetry=store,
        journal=Journal(journal, fsync=False),
        clock=clock,
        source_id=source,
    )


def applies(agent: AgentServer) -> Counter[str]:
    return Counter(a for m, a in agent.agent.calls if m == "SetFlowClass")


def test_takeover_adopts_the_bus_and_neither_repeats_nor_loses(
    agent: AgentServer, tmp_path: Path
) -> None:
    clock = ManualClock()
    store = WindowStore()
    old = engine(agent, "engine-a", tmp_path / "a.jsonl", clock, store)
    dets = [detection(clock(), flow=flow(port=40001 + i)) for i in range(3)]
    events = old.handle(dpb.DetectionBatch(records=dets))
    ids = [e.action.id for e in events if e.WhichOneof("event") == "action"]
    assert len(ids) == 3 and len(set(ids)) == 3
    assert agent.agent.changes == 3
    # The old leader dies having published: detection 0's action and its APPLIED result;
    # detection 1's action only; nothing of detection 2 (decided and applied all the same).
    # Another deployment's policy, a node's own action and one of the new leader's own
    # events are on the topic too.
    published = [e for e in events if _action_id(e) == ids[0]]
    published += [e for e in events if e.WhichOneof("event") == "action" and e.action.id == ids[1]]
    other = apb.Action()
    other.CopyFrom(events[0].action)
    other.id, other.policy_id = "another-deployment", "not-ours"
    node_move = node_flow_move(0x10010, 46, None, clock(), flow(port=40009))
    mine = apb.Action()
    mine.CopyFrom(events[0].action)
    mine.id, mine.header.source_id = "mine", "engine-b"
    bus = apb.ActionBatch(events=published)
    bus.events.add(action=other)
    bus.events.extend(node_move.events)
    bus.events.add(action=mine)

    new_journal = Journal(tmp_path / "b.jsonl", fsync=False)
    got = adopt(new_journal, bus, "engine-b", [policy()])
    assert (got.actions, got.results) == (2, 1)
    assert new_journal.order == ids[:2]
    # Read again (a mirror's replay), an older result changes nothing.
    older = apb.ActionBatch()
    older.events.add(action=events[0].action)
    assert adopt(new_journal, older, "engine-b", [policy()]).actions == 0
    # What the journal adopted is on the bus already: not republished.
    assert new_journal.undelivered_events() == []
    new_journal.close()

    # The new leader starts on that journal (the journal's resume).
    new = engine(agent, "engine-b", tmp_path / "b.jsonl", clock, store)
    # Detection 1's action (PROPOSED on the bus) is applied again: the agent replays it.
    resumed = new.drain()
    assert [(_action_id(e), e.result.state) for e in resumed] == [
        (ids[1], apb.ACTION_STATE_APPLIED)
    ]
    assert "replayed" in resumed[0].result.message
    # Its events continue above every sequence of the old leader's it adopted.
    assert resumed[0].result.header.source_id == "engine-b"
    assert resumed[0].result.header.sequence > max(_sequence(e) for e in published)
    # The old leader's detections come again (never committed): two are known, the third
    # is decided again under the old leader's id, and its apply is a replay.
    again = new.handle(dpb.DetectionBatch(records=dets))
    assert new.stats.skipped_known == 2
    assert [e.action.id for e in again if e.WhichOneof("event") == "action"] == [ids[2]]
    assert "replayed" in again[-1].result.message
    # Every action applied once at the agent (one change each); the replays are answers.
    assert agent.agent.changes == 3
    assert set(applies(agent)) == set(ids)
    # The old leader's applied-but-unverified action is verified by the new leader.
    applied_ns = max(e.result.applied_ns for e in events if e.WhichOneof("event") == "result")
    store.ingest_probes(probes(applied_ns, applied_ns + 2_000 * MS, rtt_ns=10 * MS))
    clock.now_ns = applied_ns + 2_000 * MS
    new.tick()
    verified = {e.result.action_id: e.result for e in new.drain()}
    assert verified[ids[0]].state == apb.ACTION_STATE_VERIFIED
    assert verified[ids[0]].header.source_id == "engine-b"
    # The guards know the adopted actions: a new detection of flow 0 inside the hold time
    # is refused.
    refused = new.handle(dpb.DetectionBatch(records=[detection(clock(), flow=flow(port=40001))]))
    assert [e.result.state for e in refused if e.WhichOneof("event") == "result"] == [
        apb.ACTION_STATE_REFUSED
    ]
    new.journal.close()
    old.journal.close()


def test_adopt_keeps_final_states_and_skips_what_is_not_its(tmp_path: Path) -> None:
    clock = ManualClock()
    with AgentServer(MemoryNodeAgent("node-a")) as agent:
        old = engine(agent, "engine-a", tmp_path / "a.jsonl", clock, WindowStore())
        events = old.handle(dpb.DetectionBatch(records=[detection(clock())]))
        old.journal.close()
    action, applied = events[0], events[1]
    final = apb.ActionEvent()
    final.result.CopyFrom(applied.result)
    final.result.state = apb.ACTION_STATE_VERIFIED
    final.result.header.sequence += 1
    journal = Journal(None)
    adopt(journal, apb.ActionBatch(events=[action, applied, final]), "engine-b", [policy()])
    assert journal.get(action.action.id).state == apb.ACTION_STATE_VERIFIED
    # A non-final result arriving after the final one (another engine's late event) does
    # not reopen the action.
    late = apb.ActionEvent()
    late.result.CopyFrom(applied.result)
    late.result.header.source_id = "engine-c"
    assert adopt(journal, apb.ActionBatch(events=[late]), "engine-b", [policy()]).results == 0
    assert journal.get(action.action.id).state == apb.ACTION_STATE_VERIFIED
    # Under approval, an adopted proposal waits for its operator (never applied by the
    # resume).
    approve = policy().model_copy(update={"mode": model.Mode.APPROVE})
    j2 = Journal(None)
    adopt(j2, apb.ActionBatch(events=[action]), "engine-b", [approve])
    assert j2.get(action.action.id).awaiting_approval
    # Its own events and unknown results are not adopted.
    j3 = Journal(None)
    got = adopt(j3, apb.ActionBatch(events=[action, applied]), "engine-a", [policy()])
    assert (got.actions, got.results, j3.order) == (0, 0, [])


def _action_id(e: apb.ActionEvent) -> str:
    return e.action.id if e.WhichOneof("event") == "action" else e.result.action_id


def _sequence(e: apb.ActionEvent) -> int:
    header = e.action.header if e.WhichOneof("event") == "action" else e.result.header
    return header.sequence


def test_the_lease_topic_has_one_partition() -> None:
    # With one partition the cooperative-sticky assignor never moves the lease from a live
    # leader when a standby joins (docs/scale.md, "A standby policy engine").
    assert topic(LEASE_TOPIC).partitions == 1


def test_standby_needs_a_source_id_of_its_own(run_cgloop) -> None:
    res = run_cgloop("policy", "run", "--standby", "--metrics-addr", "off")
    assert res.returncode == 2
    assert "--standby: give each engine of the group its own --source-id" in " ".join(
        res.stderr.split()
    )
    shown = " ".join(run_cgloop("policy", "run", "--help").stdout.split())
    assert "--standby" in shown and "--lease-timeout" in shown


class FakeGroupConsumer:
    """Stands in for the lease's librdkafka consumer: the coordinator's answer to a commit."""

    def __init__(self) -> None:
        self.refusal: int | None = None  # KafkaError code of the next commits, None: accepted
        self.commits = 0
        self.paused: list = []

    def poll(self, timeout: float) -> None:
        return None

    def get_watermark_offsets(self, tp, timeout: float) -> tuple[int, int]:
        return 0, 7

    def commit(self, offsets, asynchronous: bool) -> None:
        from confluent_kafka import KafkaError, KafkaException

        self.commits += 1
        if self.refusal is not None:
            raise KafkaException(KafkaError(self.refusal))

    def incremental_assign(self, partitions) -> None:
        pass

    def incremental_unassign(self, partitions) -> None:
        pass

    def pause(self, partitions) -> None:
        self.paused.extend(partitions)

    def close(self) -> None:
        pass


def test_the_lease_decides_only_on_a_fresh_confirmation() -> None:
    from confluent_kafka import KafkaError, TopicPartition

    now = [100.0]
    lease = Lease("127.0.0.1:9", "g", "engine-a", session_timeout_s=6, clock=lambda: now[0])
    lease._consumer.close()
    fake = lease._consumer = FakeGroupConsumer()  # type: ignore[assignment]
    assert not lease.hold() and fake.commits == 0  # no partition 0: a standby
    lease._on_assign(fake, [TopicPartition(LEASE_TOPIC, 0)])  # type: ignore[arg-type]
    assert fake.paused  # membership only: nothing fetched
    assert lease.hold() and fake.commits == 1  # confirmed before the first decision
    now[0] += 0.5
    assert lease.hold() and fake.commits == 1  # a young confirmation is trusted
    # The coordinator stops answering: decisions go on only while the last yes is younger
    # than a third of the session timeout (2 s), counted from when it was asked.
    fake.refusal = KafkaError._TIMED_OUT
    now[0] += 0.6
    assert lease.hold() and fake.commits == 2
    now[0] += 1.0
    assert not lease.hold() and lease.held  # stale: no decision, still the assignee
    # A long pause, then the coordinator refuses a member it evicted: deposed.
    fake.refusal = KafkaError.UNKNOWN_MEMBER_ID
    now[0] += 30
    assert not lease.hold() and not lease.held
    # Assigned again (a new generation) and confirmed: it leads again.
    fake.refusal = None
    lease._on_assign(fake, [TopicPartition(LEASE_TOPIC, 0)])  # type: ignore[arg-type]
    assert lease.hold() and lease.terms == 2
    lease._on_revoke(fake, [TopicPartition(LEASE_TOPIC, 0)])  # type: ignore[arg-type]
    assert not lease.hold()
