"""The policy engine on the real Kafka broker: detections in, gRPC actions, audit trail out.

Detections, probe results and actions travel through the session's real broker; the engine
drives a NodeAgentService served over real gRPC on loopback by an in-memory backend (the Rust
agent itself is exercised by the end-to-end issue's tests).
"""

from __future__ import annotations

import contextlib
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from cgloop.bus.codec import SCHEMA_HEADER, TYPE_HEADER, headers_for
from cgloop.bus.kafka import BatchConsumer, BatchProducer
from cgloop.bus.topics import ACTIONS, DEADLETTER, DETECTIONS, PROBES
from cgloop.policy import model, service
from cgloop.policy.actuators import NodeAgentActuator, Router
from cgloop.policy.engine import Engine
from cgloop.policy.journal import FINAL, Journal
from cgloop.policy.telemetry import KafkaTelemetryFeed, WindowStore
from cgloop.policy.testing import (
    AgentServer,
    MemoryNodeAgent,
    detection,
    flow,
    node_flow_move,
    probes,
)
from cgloop.testing import kafka_answer
from cgloop.v1 import action_pb2 as apb
from cgloop.v1 import detection_pb2 as dpb

pytestmark = pytest.mark.kafka
MS = 1_000_000


def _policy_text(run: str, within: str = "1s") -> str:
    return f"""
id: kafka-gaming
match:
  kinds: [slo_latency]
  severity_at_least: major
  subject: flow
  labels: {{run: "{run}"}}
action:
  operation: reprioritise_flow
  target: {{node_id: "{{label:node_id}}", interface_name: "{{label:interface}}"}}
  parameters: {{class_id: 0x10010, rewrite_dscp: 46}}
  deadline: 2s
  expect:
    metric: probe.p99_rtt_ns
    comparator: less_than
    value: 30000000
    within: {within}
    baseline_window: 60s  # the feed may take seconds to join its group
  rollback_on: [worse]
guards:
  hold_time: 10s
"""


def _policy(run: str) -> model.Policy:
    (p,) = model.parse_policies(_policy_text(run))
    return p


@contextlib.contextmanager
def _engine_running(
    agent: AgentServer, bootstrap: str, run: str, tmp_path: Path, group: str | None = None
) -> Iterator[Engine]:
    """This run's engine (its policy, source id and journal) in `service.run` on a thread, as
    `cgloop policy run` runs it; stopped, and checked stopped, on exit."""
    engine = Engine(
        [_policy(run)],
        Router(NodeAgentActuator({"node-a": agent.address})),
        journal=Journal(tmp_path / "journal.jsonl"),
        source_id=f"policy-engine-{run}",
        apply_async=True,
    )
    stop = threading.Event()
    worker = threading.Thread(
        target=service.run, args=(engine, bootstrap, stop, group or f"policy-{run}"), daemon=True
    )
    worker.start()
    try:
        yield engine
    finally:
        stop.set()
        worker.join(30)
    assert not worker.is_alive()


def _wait(condition, timeout_s: float, what: str, engine: Engine | None = None) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.05)
    state = f" (engine: {engine.stats})" if engine is not None else ""
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}{state}")


def test_engine_acts_verifies_and_rolls_back_through_kafka(stack_settings, tmp_path: Path) -> None:
    bootstrap = stack_settings.bootstrap_servers
    run = uuid.uuid4().hex
    client = "10.77.0.9"
    labels = {"node_id": "node-a", "interface": "veth0", "platform": "GFN", "run": run}
    producer = BatchProducer(bootstrap)
    store = WindowStore()
    feed = KafkaTelemetryFeed(bootstrap, store, group_id=f"policy-telemetry-{run}").start()
    stop = threading.Event()
    with AgentServer(MemoryNodeAgent("node-a")) as agent:
        engine = Engine(
            [_policy(run)],
            Router(NodeAgentActuator({"node-a": agent.address})),
            telemetry=store,
            journal=Journal(tmp_path / "journal.jsonl"),
            source_id=f"policy-engine-{run}",
            apply_async=True,  # as `cgloop policy run` does
        )
        worker = threading.Thread(
            target=service.run, args=(engine, bootstrap, stop, f"policy-{run}"), daemon=True
        )
        worker.start()
        try:
            now = time.time_ns()
            producer.send(
                PROBES.name, probes(now - 2_000 * MS, now, 40 * MS, target=client), key=run
            )
            producer.flush()
            _wait(lambda: store.ingested >= 40, 60, "the telemetry feed")
            producer.send_raw(DETECTIONS.name, b"\x0a\x40\x01", key=run)  # poison
            det = detection(now, client=client, labels=labels)
            producer.send(DETECTIONS.name, dpb.DetectionBatch(records=[det]), key=run)
            producer.flush()
            _wait(lambda: agent.agent.changes == 1, 60, "the SetFlowClass call")
            # Applies are asynchronous: the engine records the agent's answer on its next round.
            _wait(
                lambda: all(e.result for e in list(engine.journal.entries.values())),
                10,
                "the apply's result in the journal",
                engine,
            )
            (entry,) = engine.journal.entries.values()
            applied_ns = entry.result.applied_ns
            # The flow got worse after the change: the probes say so, through Kafka.
            producer.send(
                PROBES.name,
                probes(applied_ns, applied_ns + 1_000 * MS, 90 * MS, target=client),
                key=run,
            )
            producer.flush()
            _wait(lambda: engine.stats.rolled_back == 1, 30, "the rollback", engine)
        finally:
            stop.set()
            worker.join(30)
            feed.stop()
        assert not worker.is_alive()
        # The flow had no rule: the rollback removed the one the action added.
        assert [m for m, _ in agent.agent.calls] == ["SetFlowClass", "SetFlowClass"]
        assert agent.agent.state.flow_rules == {}

    # The audit trail on the actions topic, in order, for this run's engine.
    consumer = BatchConsumer(bootstrap, f"policy-audit-{run}", [ACTIONS.name])
    seen: list[apb.ActionEvent] = []
    deadline = time.monotonic() + 60
    try:
        while time.monotonic() < deadline and len(seen) < 5:
            item = consumer.poll(1.0)
            if item is None:
                continue
            for ev in item[1].events:
                header = ev.action.header if ev.HasField("action") else ev.result.header
                if header.source_id == f"policy-engine-{run}":
                    seen.append(ev)
    finally:
        consumer.close()
    by_action: dict[str, list[str]] = {}
    for ev in seen:
        if ev.HasField("action"):
            key, state = ev.action.id, "action:" + apb.ActionState.Name(ev.action.state)
        else:
            key, state = ev.result.action_id, apb.ActionState.Name(ev.result.state)
        by_action.setdefault(key, []).append(state)
    # Batches are keyed by action id, so each action's own events stay in order.
    assert sorted(by_action.values()) == [
        ["action:ACTION_STATE_PROPOSED", "ACTION_STATE_APPLIED", "ACTION_STATE_ROLLED_BACK"],
        ["action:ACTION_STATE_PROPOSED", "ACTION_STATE_VERIFIED"],  # the rollback action
    ]
    # The two actions' batches sit on different partitions (keyed by action id): their relative
    # order is not defined, so find the original action by what happened to it.
    rolled_back = [
        ev.result
        for ev in seen
        if ev.HasField("result") and ev.result.state == apb.ACTION_STATE_ROLLED_BACK
    ]
    assert len(rolled_back) == 1
    final = rolled_back[0]
    assert final.verification.verdict == apb.VERDICT_WORSE
    assert final.verification.after_value == 90 * MS
    assert final.detection_to_apply_ns > 0
    original = next(
        ev.action for ev in seen if ev.HasField("action") and ev.action.id == final.action_id
    )
    assert original.reason_detection_ids == [det.id]
    assert engine.stats.detections == 1  # the poison message was dead-lettered, not decided on


def _committed(bootstrap: str, group: str, partition: int) -> int:
    """The group's committed offset on a detections partition (read-only, no group join)."""
    from cgloop.bus.kafka import GroupOffsets

    offsets = GroupOffsets(bootstrap, group)
    try:
        key = (DETECTIONS.name, partition)
        return kafka_answer(lambda: offsets.committed([key]))[key]
    finally:
        offsets.close()


def test_service_commits_an_offset_only_once_its_decisions_are_durable(
    stack_settings, tmp_path: Path
) -> None:
    """The pipelined service applies at once but holds the offset and the audit events until
    the journal's group commit has made the decision durable (here held back for 4 s)."""
    from confluent_kafka import Producer

    bootstrap = stack_settings.bootstrap_servers
    run = uuid.uuid4().hex
    group = f"policy-{run}"
    labels = {"node_id": "node-a", "interface": "veth0", "platform": "GFN", "run": run}
    stop = threading.Event()
    with AgentServer(MemoryNodeAgent("node-a")) as agent:
        engine = Engine(
            [_policy(run)],
            Router(NodeAgentActuator({"node-a": agent.address})),
            journal=Journal(tmp_path / "journal.jsonl", commit_delay_s=4.0),
            source_id=f"policy-engine-{run}",
            apply_async=True,
        )
        worker = threading.Thread(
            target=service.run, args=(engine, bootstrap, stop, group), daemon=True
        )
        worker.start()
        try:
            delivered: list[tuple[int, int]] = []
            producer = Producer({"bootstrap.servers": bootstrap})
            det = detection(time.time_ns(), client="10.77.0.10", labels=labels)
            batch = dpb.DetectionBatch(records=[det])
            producer.produce(
                DETECTIONS.name,
                batch.SerializeToString(),
                key=run,
                headers=headers_for(batch),
                on_delivery=lambda err, msg: delivered.append((msg.partition(), msg.offset())),
            )
            producer.flush(10)
            ((partition, offset),) = delivered
            _wait(lambda: agent.agent.changes == 1, 60, "the SetFlowClass call", engine)
            # Applied, but the journal has not synced the decision: nothing committed yet.
            assert engine.journal.durable_seq < engine.journal.seq
            # The service keeps deciding meanwhile: a second flow's detection is applied
            # without waiting for the first one's commit (the previous loop waited for it).
            second = detection(time.time_ns(), client="10.77.0.11", labels=labels)
            batch = dpb.DetectionBatch(records=[second])
            producer.produce(
                DETECTIONS.name,
                batch.SerializeToString(),
                key=run,
                headers=headers_for(batch),
            )
            producer.flush(10)
            _wait(lambda: agent.agent.changes == 2, 1.5, "the second SetFlowClass call", engine)
            assert _committed(bootstrap, group, partition) <= offset
            decided = engine.journal.seq
            assert engine.journal.durable_seq < decided
            # One group commit makes both rounds durable: the offset moves past both.
            _wait(
                lambda: _committed(bootstrap, group, partition) == offset + 2,
                30,
                "the offset commit after the group commit",
                engine,
            )
            # (Rows after them, the delivery marks of the published events, may still wait.)
            assert engine.journal.durable_seq >= decided
            assert engine.stats.applied == 2
        finally:
            stop.set()
            worker.join(30)
        assert not worker.is_alive()


class Crash(BaseException):
    """The engine process dying (not an error the service would handle)."""


def _events_of(
    bootstrap: str, source_id: str, done, timeout_s: float = 60
) -> list[apb.ActionEvent]:
    """The events `source_id` published on the actions topic, read until `done(events)`."""
    consumer = BatchConsumer(bootstrap, f"audit-{uuid.uuid4().hex}", [ACTIONS.name])
    seen: list[apb.ActionEvent] = []
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline and not done(seen):
            item = consumer.poll(1.0)
            if item is None:
                continue
            for ev in item[1].events:
                header = ev.action.header if ev.HasField("action") else ev.result.header
                if header.source_id == source_id:
                    seen.append(ev)
    finally:
        consumer.close()
    return seen


def test_results_journaled_before_a_crash_reach_the_bus_after_the_restart(
    stack_settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The engine dies with verifications journaled (durable) but not yet acknowledged by
    Kafka, after the detections' offsets were committed (so Kafka redelivers nothing): the
    restarted engine publishes them from its journal, and every action's final result on the
    actions topic is the journal's."""
    from confluent_kafka import Producer

    bootstrap = stack_settings.bootstrap_servers
    run = uuid.uuid4().hex
    group = f"policy-{run}"
    source = f"policy-engine-{run}"
    labels = {"node_id": "node-a", "interface": "veth0", "platform": "GFN", "run": run}
    journal_path = tmp_path / "journal.jsonl"
    crashing = threading.Event()
    release = threading.Event()

    class DiesBeforeTheAck(BatchProducer):
        def send(self, topic_name, batch, key=None):  # type: ignore[override]
            if any(ev.HasField("result") and ev.result.state in FINAL for ev in batch.events):
                crashing.set()
                release.wait(60)  # until the test has seen the offsets committed
                raise Crash
            super().send(topic_name, batch, key)

    def serve(engine: Engine, stop: threading.Event) -> None:
        with contextlib.suppress(Crash):
            service.run(engine, bootstrap, stop, group)

    def make_engine(agent: AgentServer) -> Engine:
        return Engine(
            [_policy(run)],
            Router(NodeAgentActuator({"node-a": agent.address})),
            telemetry=WindowStore(),  # no probes: verified "not checked" after `within`
            journal=Journal(journal_path),
            source_id=source,
            apply_async=True,
            verify_grace_s=0.0,
        )

    with AgentServer(MemoryNodeAgent("node-a")) as agent:
        monkeypatch.setattr(service, "BatchProducer", DiesBeforeTheAck)
        engine = make_engine(agent)
        stop = threading.Event()
        worker = threading.Thread(target=serve, args=(engine, stop), daemon=True)
        worker.start()
        offsets: list[tuple[int, int]] = []
        producer = Producer({"bootstrap.servers": bootstrap})
        for i in range(5):
            batch = dpb.DetectionBatch(
                records=[detection(time.time_ns(), client=f"10.78.0.{i + 1}", labels=labels)]
            )
            producer.produce(
                DETECTIONS.name,
                batch.SerializeToString(),
                key=run,
                headers=headers_for(batch),
                on_delivery=lambda err, msg: offsets.append((msg.partition(), msg.offset())),
            )
        producer.flush(10)
        partition = offsets[0][0]
        last = max(o for _, o in offsets)
        try:
            _wait(crashing.is_set, 60, "the first verification's publication", engine)
            _wait(
                lambda: _committed(bootstrap, group, partition) == last + 1,
                30,
                "the detections' offsets committed",
                engine,
            )
        finally:
            release.set()
            worker.join(30)
        assert not worker.is_alive()
        engine.journal.close()  # what the dead process had made durable
        journaled = {i: e for i, e in Journal(journal_path).entries.items()}
        assert len(journaled) == 5 and agent.agent.changes == 5

        monkeypatch.setattr(service, "BatchProducer", BatchProducer)
        restarted = make_engine(agent)
        stop = threading.Event()
        worker = threading.Thread(target=serve, args=(restarted, stop), daemon=True)
        worker.start()
        try:

            def finals(events: list[apb.ActionEvent]) -> dict[str, apb.ActionResult]:
                return {
                    ev.result.action_id: ev.result
                    for ev in events
                    if ev.HasField("result") and ev.result.state in FINAL
                }

            _wait(
                lambda: all(e.state in FINAL for e in restarted.journal.entries.values()),
                30,
                "every action final",
                restarted,
            )
            want = {i: e.result for i, e in restarted.journal.entries.items()}
            seen = _events_of(bootstrap, source, lambda evs: finals(evs).keys() >= want.keys())
        finally:
            stop.set()
            worker.join(30)
            restarted.journal.close()
    assert restarted.stats.skipped_known == 0  # nothing redelivered: the offsets were committed
    assert agent.agent.changes == 5  # nothing applied twice
    # Every action's final result on the bus is exactly the journal's, and every action too.
    assert finals(seen) == want
    assert {ev.action.id for ev in seen if ev.HasField("action")} == set(want)


def test_the_engine_dead_letters_what_the_sink_refuses_and_acts_on_none_of_it(
    stack_settings, tmp_path: Path
) -> None:
    """A detection with schema-version header 99, a probe batch on the detections topic
    (with its own headers, with a lying type header, with none): each is dead-lettered with
    its reason by the engine's consumer, and only the one good detection becomes an action."""
    bootstrap = stack_settings.bootstrap_servers
    run = uuid.uuid4().hex
    group = f"policy-{run}"
    labels = {"node_id": "node-a", "interface": "veth0", "platform": "GFN", "run": run}
    future = dpb.DetectionBatch(
        records=[detection(time.time_ns(), client="10.79.0.1", labels=labels)]
    )
    probe_batch = probes(time.time_ns() - 1_000 * MS, time.time_ns(), 40 * MS)
    as_detections = [(TYPE_HEADER, b"cgloop.v1.DetectionBatch"), (SCHEMA_HEADER, b"1")]
    bad = {
        # value, headers -> the reason's words
        (
            future.SerializeToString(),
            ((TYPE_HEADER, b"cgloop.v1.DetectionBatch"), (SCHEMA_HEADER, b"99")),
        ): "cgloop-schema-version header 99 not readable",
        (
            probe_batch.SerializeToString(),
            tuple(headers_for(probe_batch)),
        ): "type header says 'cgloop.v1.ProbeRecordBatch'",
        (probe_batch.SerializeToString(), tuple(as_detections)): "not a cgloop.v1.DetectionBatch",
        (probe_batch.SerializeToString(), ()): "no cgloop-type header",
    }
    producer = BatchProducer(bootstrap)
    for (value, headers), _ in bad.items():
        producer.send_raw(DETECTIONS.name, value, key=run, headers=list(headers))
    good = detection(time.time_ns(), client="10.79.0.2", labels=labels)
    producer.send(DETECTIONS.name, dpb.DetectionBatch(records=[good]), key=run)
    producer.flush()
    with (
        AgentServer(MemoryNodeAgent("node-a")) as agent,
        _engine_running(agent, bootstrap, run, tmp_path, group) as engine,
    ):
        _wait(lambda: agent.agent.changes >= 1, 60, "the good detection's action", engine)
        _wait(lambda: not engine.busy, 10, "the engine idle", engine)
    assert agent.agent.changes == 1
    # (The group also reads other tests' detections on this module's broker: none match.)
    (entry,) = engine.journal.entries.values()
    assert list(entry.action.reason_detection_ids) == [good.id]

    letters = BatchConsumer(bootstrap, f"dl-{run}", [DEADLETTER.name])
    mine = []
    deadline = time.monotonic() + 60
    try:
        while time.monotonic() < deadline and len(mine) < len(bad):
            item = letters.poll(1.0)
            # (The group also reads, and refuses, other tests' poison on this module's broker.)
            if item is not None and item[1].consumer_group == group and item[1].key == run.encode():
                mine.append(item[1])
    finally:
        letters.close()
    assert sorted(x.offset for x in mine) == sorted({x.offset for x in mine})  # each once
    reasons = [x.reason for x in mine]
    for words in bad.values():
        assert any(words in r for r in reasons), (words, reasons)
    assert len(mine) == len(bad)
    assert all(x.topic == DETECTIONS.name for x in mine)


def _actions_topic_writable(bootstrap: str, writable: bool) -> None:
    """Kafka's own way to make the engine's writes fail without touching the engine: a topic
    whose largest accepted batch is 1 byte refuses every write (message too large, not
    retried), so nothing the engine sends meanwhile is appended."""
    from confluent_kafka.admin import (
        AdminClient,
        AlterConfigOpType,
        ConfigEntry,
        ConfigResource,
        ResourceType,
    )

    entry = ConfigEntry(
        "max.message.bytes",
        None if writable else "1",
        incremental_operation=AlterConfigOpType.DELETE if writable else AlterConfigOpType.SET,
    )
    resource = ConfigResource(ResourceType.TOPIC, ACTIONS.name, incremental_configs=[entry])
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.incremental_alter_configs([resource]).values():
        future.result(30)


def test_kill_9_of_cgloop_policy_run_loses_no_journaled_result(
    stack_settings, tmp_path: Path
) -> None:
    """The real process: `cgloop policy run` applies five actions, Kafka stops accepting its
    writes to the actions topic (after the detections' offsets are committed), it verifies the
    actions (journaled) and is killed with SIGKILL before any verification reached the bus.
    Restarted on its journal, it publishes every verification; nothing is applied twice.
    (Before the fix the verifications were lost: no detection is redelivered to bring them
    back.)"""
    import os
    import signal
    import subprocess

    from cgloop.testing import cgloop_cmd
    from confluent_kafka import Producer

    bootstrap = stack_settings.bootstrap_servers
    run = uuid.uuid4().hex
    group = f"policy-{run}"
    source = f"policy-engine-{run}"
    labels = {"node_id": "node-a", "interface": "veth0", "platform": "GFN", "run": run}
    policy_file = tmp_path / "policy.yaml"
    # Verified "not checked" (no probes) `within` + 3 s after the apply: time enough to make
    # the actions topic refuse writes first.
    policy_file.write_text(_policy_text(run, within="4s"))
    journal_path = tmp_path / "journal.jsonl"
    env = {
        **os.environ,
        "CGLOOP_STATE_DIR": str(tmp_path / "state"),
        "CGLOOP_KAFKA_BOOTSTRAP": bootstrap,
    }

    def journal_states() -> list[int]:
        entries: dict[str, int] = {}
        for entry in Journal._read(journal_path):
            entries[entry.action.id] = entry.state
        return list(entries.values())

    audit = BatchConsumer(bootstrap, f"audit-{run}", [ACTIONS.name])
    seen: list[apb.ActionEvent] = []

    def read_audit() -> list[apb.ActionEvent]:
        item = audit.poll(0.2)
        while item is not None:
            for ev in item[1].events:
                header = ev.action.header if ev.HasField("action") else ev.result.header
                if header.source_id == source:
                    seen.append(ev)
            item = audit.poll(0.05)
        return seen

    def published(state: int) -> int:
        read_audit()
        return sum(1 for ev in seen if ev.HasField("result") and ev.result.state == state)

    def engine() -> subprocess.Popen:
        cmd = cgloop_cmd(
            "policy", "run", str(policy_file),
            "--agent", f"node-a={agent.address}",
            "--journal", str(journal_path),
            "--group", group,
            "--source-id", source,
        )  # fmt: skip
        return subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    with AgentServer(MemoryNodeAgent("node-a")) as agent:
        first = engine()
        try:
            offsets: list[tuple[int, int]] = []
            producer = Producer({"bootstrap.servers": bootstrap})
            for i in range(5):
                batch = dpb.DetectionBatch(
                    records=[detection(time.time_ns(), client=f"10.80.0.{i + 1}", labels=labels)]
                )
                producer.produce(
                    DETECTIONS.name,
                    batch.SerializeToString(),
                    key=run,
                    headers=headers_for(batch),
                    on_delivery=lambda err, msg: offsets.append((msg.partition(), msg.offset())),
                )
            producer.flush(10)
            partition, last = offsets[0][0], max(o for _, o in offsets)
            _wait(
                lambda: published(apb.ACTION_STATE_APPLIED) == 5,
                90,
                "five actions applied and announced",
            )
            _wait(
                lambda: _committed(bootstrap, group, partition) == last + 1,
                30,
                "the detections' offsets committed",
            )
            _actions_topic_writable(bootstrap, False)
            try:
                _wait(
                    lambda: journal_states().count(apb.ACTION_STATE_VERIFIED) == 5,
                    60,
                    "five verifications in the journal",
                )
                first.send_signal(signal.SIGKILL)
                first.wait(30)
            finally:
                _actions_topic_writable(bootstrap, True)
            assert published(apb.ACTION_STATE_VERIFIED) == 0
        finally:
            if first.poll() is None:
                first.kill()
                first.wait(30)
        journaled = {e.action.id: e.result for e in Journal._read(journal_path) if e.result}
        second = engine()
        try:
            _wait(
                lambda: published(apb.ACTION_STATE_VERIFIED) >= 5,
                90,
                "the verifications on the actions topic after the restart",
            )
        finally:
            second.send_signal(signal.SIGTERM)
            second.wait(60)
            audit.close()
        assert agent.agent.changes == 5  # nothing applied twice
    on_bus = {
        ev.result.action_id: ev.result
        for ev in seen
        if ev.HasField("result") and ev.result.state == apb.ACTION_STATE_VERIFIED
    }
    assert len(journaled) == 5
    assert on_bus == journaled  # exactly as the journal says


def test_a_nodes_own_change_is_a_fact_the_engine_verifies_and_does_not_repeat(
    stack_settings, tmp_path: Path
) -> None:
    """The node's latency guard promoted the flow and said so on the actions topic: the engine
    (reading that topic beside the detections) verifies the promotion and, on the SLO breach
    that follows, orders nothing (the same move is done)."""
    bootstrap = stack_settings.bootstrap_servers
    run = uuid.uuid4().hex
    client = "10.77.0.12"
    labels = {"node_id": "node-a", "interface": "veth0", "platform": "GFN", "run": run}
    producer = BatchProducer(bootstrap)
    with (
        AgentServer(MemoryNodeAgent("node-a")) as agent,
        _engine_running(agent, bootstrap, run, tmp_path) as engine,
    ):
        move = node_flow_move(0x10010, 46, None, time.time_ns(), ft=flow(client))
        node_action = move.events[0].action
        producer.send(ACTIONS.name, move, key=node_action.id)
        producer.flush()
        _wait(lambda: engine.facts.stats.node_flow_classes == 1, 60, "the node's fact", engine)
        det = detection(time.time_ns(), client=client, labels=labels)
        producer.send(DETECTIONS.name, dpb.DetectionBatch(records=[det]), key=run)
        producer.flush()
        _wait(lambda: engine.facts.stats.node_held == 1, 60, "the engine's decision", engine)
    assert agent.agent.changes == 0  # the engine sent the agent nothing

    assert engine.stats.refused == 0

    def done(events: list[apb.ActionEvent]) -> bool:
        return any(e.HasField("result") for e in events)

    seen = _events_of(bootstrap, f"policy-engine-{run}", done)
    # The engine's only record: its verification of the node's action (it ordered nothing).
    (verified,) = [e.result for e in seen]
    assert verified.action_id == node_action.id
    assert verified.state == apb.ACTION_STATE_VERIFIED, verified
    assert verified.applied_ns == move.events[1].result.applied_ns
