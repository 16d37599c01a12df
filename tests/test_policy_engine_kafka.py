"""The policy engine on the real Kafka broker: detections in, gRPC actions, audit trail out.

Detections, probe results and actions travel through the session's real broker; the engine
drives a NodeAgentService served over real gRPC on loopback by an in-memory backend (the Rust
agent itself is exercised by the end-to-end issue's tests).
"""

from __future__ import annotations

import threading
import time
import uuid
from pathlib import Path

import pytest
from cgloop.bus.kafka import BatchConsumer, BatchProducer
from cgloop.policy import model, service
from cgloop.policy.actuators import NodeAgentActuator, Router
from cgloop.policy.engine import Engine
from cgloop.policy.journal import Journal
from cgloop.policy.telemetry import KafkaTelemetryFeed, WindowStore
from cgloop.policy.testing import AgentServer, MemoryNodeAgent, detection, probes
from cgloop.v1 import action_pb2 as apb
from cgloop.v1 import detection_pb2 as dpb

pytestmark = pytest.mark.kafka
MS = 1_000_000


def _policy(run: str) -> model.Policy:
    (p,) = model.parse_policies(
        f"""
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
    within: 1s
    baseline_window: 60s  # the feed may take seconds to join its group
  rollback_on: [worse]
guards:
  hold_time: 10s
"""
    )
    return p


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
                "cgloop.probes.v1", probes(now - 2_000 * MS, now, 40 * MS, target=client), key=run
            )
            producer.flush()
            _wait(lambda: store.ingested >= 40, 60, "the telemetry feed")
            producer.send_raw("cgloop.detections.v1", b"\x0a\x40\x01", key=run)  # poison
            det = detection(now, client=client, labels=labels)
            producer.send("cgloop.detections.v1", dpb.DetectionBatch(records=[det]), key=run)
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
                "cgloop.probes.v1",
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
        assert [m for m, _ in agent.agent.calls] == ["SetFlowClass", "GetState", "SetFlowClass"]

    # The audit trail on the actions topic, in order, for this run's engine.
    consumer = BatchConsumer(bootstrap, f"policy-audit-{run}", ["cgloop.actions.v1"])
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
    from confluent_kafka import ConsumerGroupTopicPartitions, TopicPartition
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": bootstrap})
    request = ConsumerGroupTopicPartitions(
        group, [TopicPartition("cgloop.detections.v1", partition)]
    )
    (future,) = admin.list_consumer_group_offsets([request]).values()
    (tp,) = future.result(10).topic_partitions
    return tp.offset


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
            producer.produce(
                "cgloop.detections.v1",
                dpb.DetectionBatch(records=[det]).SerializeToString(),
                key=run,
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
            producer.produce(
                "cgloop.detections.v1",
                dpb.DetectionBatch(records=[second]).SerializeToString(),
                key=run,
            )
            producer.flush(10)
            _wait(lambda: agent.agent.changes == 2, 1.5, "the second SetFlowClass call", engine)
            assert _committed(bootstrap, group, partition) <= offset
            assert engine.journal.durable_seq < engine.journal.seq
            # One group commit makes both rounds durable: the offset moves past both.
            _wait(
                lambda: _committed(bootstrap, group, partition) == offset + 2,
                30,
                "the offset commit after the group commit",
                engine,
            )
            assert engine.journal.durable_seq == engine.journal.seq
            assert engine.stats.applied == 2
        finally:
            stop.set()
            worker.join(30)
        assert not worker.is_alive()
