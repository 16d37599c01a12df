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
from collections import deque
from pathlib import Path

from cgloop.bus import topics
from cgloop.bus.kafka import BatchConsumer, BatchProducer
from cgloop.policy.engine import Engine, events_by_key
from cgloop.v1 import action_pb2 as apb
from cgloop.v1 import detection_pb2 as dpb

log = logging.getLogger(__name__)

DETECTIONS = topics.DETECTIONS.name
ACTIONS = topics.ACTIONS.name


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
) -> None:
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
    """
    inputs = [DETECTIONS, ACTIONS] if node_facts else [DETECTIONS]
    consumer = BatchConsumer(bootstrap, group_id, inputs, source_id=engine.source_id)
    producer = BatchProducer(bootstrap, client_id=engine.source_id)
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

    try:
        # Whatever resuming from the journal produced, starting with the events of the
        # previous run that Kafka never acknowledged.
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
                last[(msg.topic(), msg.partition())] = msg
                taken += 1
                item = consumer.poll(0.001) if taken < max_messages else None
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
    finally:
        consumer.close()
        producer.flush()
