"""Running the engine on Kafka: detections in, action batches out, offsets after the journal.

Order per detection batch: decide and act (journaled), publish the resulting events once their
journal rows are durable, flush, then commit the batch's offset. A crash anywhere before the
commit redelivers the batch; the journal makes the redelivery a no-op for actions already
decided. Events decided later (results of asynchronous applies, verifications, rollbacks)
follow no detection offset: the journal tracks which events Kafka acknowledged, and a
restarted engine republishes every journaled event that was not (Journal.undelivered_events),
so a crash between the journal's commit and the producer's flush loses none of them.

With `node_facts` the engine also reads cgloop.actions.v1 (its own group, from where it left
off): the node agents' own actions (level NODE) become facts (`Engine.observe`), journaled and
committed like detections; everything else on the topic, the engine's own events among them,
is skipped.

Detections come through the bus's strict decoder (`BatchConsumer` -> `codec.decode`): a
message without the right type and schema-version headers, of another batch type, or with a
record the decoder refuses goes to the dead-letter topic with the reason and decides nothing.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict, deque
from pathlib import Path

from cgloop.bus import topics
from cgloop.bus.kafka import BatchConsumer, BatchProducer
from cgloop.contracts.ops import Daemon
from cgloop.metrics import PipelineMetrics, histogram
from cgloop.policy.engine import Engine, events_by_key
from cgloop.policy.standby import Lease
from cgloop.v1 import action_pb2 as apb
from cgloop.v1 import detection_pb2 as dpb
from prometheus_client import Gauge

log = logging.getLogger(__name__)

DETECTIONS = topics.DETECTIONS.name
ACTIONS = topics.ACTIONS.name


class EngineMetrics(PipelineMetrics):
    """The engine's /metrics: the pipeline series (its consumers' records in, lag and dead
    letters; action events out) and the loop's two steps, timed from the records themselves:
    decision (a detection's timestamp to the action's) and apply (the action's timestamp to
    its result's applied_ns)."""

    REMEMBER = 100_000  # detections and actions awaiting their next step (oldest forgotten)

    def __init__(self) -> None:
        super().__init__(Daemon.DAEMON_POLICY_ENGINE)
        self.decision_latency = histogram(
            self.registry,
            "cgloop_policy_decision_latency_seconds",
            "from a detection (its record timestamp) to the action decided on it",
        )
        self.apply_latency = histogram(
            self.registry,
            "cgloop_policy_apply_latency_seconds",
            "from an action's decision to its result's applied_ns",
        )
        # 1 while this engine decides: always for a single engine; with `--standby`
        # (cgloop.policy.standby) while it holds the lease, 0 while it stands by.
        self.leader = Gauge(
            "cgloop_policy_leader",
            "1 while this engine decides (a standby group's leader), 0 while it stands by",
            registry=self.registry,
        )
        self._detections: OrderedDict[str, int] = OrderedDict()
        self._actions: OrderedDict[str, int] = OrderedDict()

    def _remember(self, table: OrderedDict[str, int], key: str, ns: int) -> None:
        table[key] = ns
        if len(table) > self.REMEMBER:
            table.popitem(last=False)

    def detections(self, batch: dpb.DetectionBatch) -> None:
        for d in batch.records:
            if d.id and d.header.timestamp_ns:
                self._remember(self._detections, d.id, d.header.timestamp_ns)

    def published(self, events: list[apb.ActionEvent]) -> None:
        self.records_out.labels(ACTIONS).inc(len(events))
        for e in events:
            if e.HasField("action"):
                a = e.action
                decided = a.header.timestamp_ns
                if not decided:
                    continue
                self._remember(self._actions, a.id, decided)
                seen = [self._detections.pop(i) for i in a.reason_detection_ids
                        if i in self._detections]  # fmt: skip
                if seen:
                    self.decision_latency.observe(max(0, decided - min(seen)) / 1e9)
            elif e.result.applied_ns and e.result.action_id in self._actions:
                decided = self._actions.pop(e.result.action_id)  # its first applied result
                self.apply_latency.observe(max(0, e.result.applied_ns - decided) / 1e9)


def publish(
    producer: BatchProducer, events: list[apb.ActionEvent], engine: Engine | None = None
) -> None:
    """Send the events and wait for Kafka's acknowledgement; then tell the engine's journal
    they are delivered. Raises RuntimeError when a delivery failed (nothing is marked)."""
    for key, batch in events_by_key(events).items():
        producer.send(ACTIONS, batch, key=key)
    if events:
        producer.flush()
        if engine is not None:
            engine.delivered(events)


def process_approvals(engine: Engine, folder: Path) -> None:
    """`<action id>.approve` / `<action id>.reject` files dropped by `cgloop policy approve`."""
    for f in sorted(folder.glob("*.approve")) + sorted(folder.glob("*.reject")):
        action_id = f.stem
        try:
            if f.suffix == ".approve":
                engine.approve(action_id)
            else:
                engine.reject(action_id, f.read_text().strip() or "rejected by an operator")
        except KeyError as exc:
            log.warning("approval file %s: %s", f.name, exc)
        f.unlink(missing_ok=True)


def run(
    engine: Engine,
    bootstrap: str,
    stop: threading.Event,
    group_id: str = "cgloop-policy-engine",
    approvals: Path | None = None,
    poll_s: float = 0.05,
    max_messages: int = 64,
    node_facts: bool = True,
    metrics: EngineMetrics | None = None,
    lease: Lease | None = None,
) -> bool:
    """Consume detections until `stop`, pipelined: decisions never wait for the disk.

    Each round takes what is waiting, decides (`handle(wait=False)`: the journal's writer
    thread group-commits the rows, applies run in the engine's pool when it has
    `apply_async`), publishes the events whose rows are already durable, and commits the
    offsets of every earlier round whose rows are durable and whose events are published.
    So an offset is never committed before the decisions it caused are on disk and (but for
    a failed delivery, which the journal still owes the bus) on the bus, and a crash
    redelivers only batches the journal may not know (it skips the ones it does); a decision
    taken but not yet applied is re-applied by the journal's resume, and an event never
    acknowledged by Kafka is republished.

    With a `lease` (cgloop.policy.standby: one of several engines), every round first asks
    `lease.hold()`; the first round it says no, the engine stops as a crash would: nothing of
    the round is decided, no offset is committed, nothing more is published or flushed, and
    the consumer leaves the group. Returns True when `stop` ended the run, False when the
    lease was lost.
    """
    inputs = [DETECTIONS, ACTIONS] if node_facts else [DETECTIONS]
    metrics = metrics or EngineMetrics()
    consumer = BatchConsumer(
        bootstrap,
        group_id,
        inputs,
        source_id=engine.source_id,
        metrics=metrics,
        **(lease.group_config() if lease is not None else {}),
    )
    producer = BatchProducer(bootstrap, client_id=engine.source_id, metrics=metrics)
    # Rounds decided but not committed yet: (journal sequence after the round, last message
    # per topic and partition), oldest first.
    uncommitted: deque[tuple[int, dict[tuple[str, int], object]]] = deque()

    def commit(upto_seq: int, asynchronous: bool = True) -> None:
        last: dict[tuple[str, int], object] = {}
        while uncommitted and uncommitted[0][0] <= upto_seq:
            last.update(uncommitted.popleft()[1])
        for msg in last.values():
            # Asynchronous: a later commit of the same partition supersedes it; a crash before
            # it lands redelivers batches the journal already knows.
            consumer.commit(msg, asynchronous=asynchronous)  # type: ignore[arg-type]

    # Events whose delivery failed (broker unreachable past the producer's timeouts): sent
    # again with the next round, ahead of newer ones. The journal still counts them as owed,
    # so even a crash meanwhile does not lose them.
    unsent: list[apb.ActionEvent] = []

    def announce(events: list[apb.ActionEvent]) -> None:
        nonlocal unsent
        events = unsent + events
        try:
            publish(producer, events, engine)
        except RuntimeError as exc:
            log.error("publishing %d action events failed (retried): %s", len(events), exc)
            unsent = events
        else:
            unsent = []
            metrics.published(events)

    lost = False
    try:
        # Whatever resuming from the journal produced, starting with the events of the
        # previous run that Kafka never acknowledged.
        if lease is not None and not lease.hold():
            lost = True
            return False
        announce(engine.drain())
        while not stop.is_set():
            # Take what is waiting (up to max_messages): one decision round, one flush.
            last: dict[tuple[str, int], object] = {}
            combined = dpb.DetectionBatch()
            taken = 0
            item = consumer.poll(0.001 if engine.busy else poll_s)
            while item is not None:
                t, batch, msg = item
                if t.name == ACTIONS:
                    engine.observe(batch)  # type: ignore[arg-type]
                else:
                    combined.records.extend(batch.records)  # type: ignore[attr-defined]
                    metrics.detections(batch)  # type: ignore[arg-type]
                last[(msg.topic(), msg.partition())] = msg
                taken += 1
                item = consumer.poll(0.001) if taken < max_messages else None
            if lease is not None and not lease.hold():
                # Deposed (or unconfirmed): decide, verify and publish nothing more; the
                # round's detections stay uncommitted for the next leader.
                lost = True
                return False
            durable = engine.journal.durable_seq
            # handle() returns the events whose rows are durable already (read just before).
            events = engine.handle(combined, wait=False) if taken else []  # also observed
            if taken:
                uncommitted.append((engine.journal.seq, last))
            engine.tick()
            if approvals is not None and approvals.is_dir():
                process_approvals(engine, approvals)
            # Every row up to `durable` was durable before handle() and this drain, so once
            # they are published and flushed every event up to it is on the bus.
            announce(events + engine.drain(wait=False))
            commit(durable)
        engine.finish_applies()
        announce(engine.drain())
        commit(engine.journal.durable_seq, asynchronous=False)
        return True
    finally:
        consumer.close()
        if not lost:
            producer.flush()
