"""Running the engine on Kafka: detections in, action batches out, offsets after the journal.

Order per detection batch: decide and act (journaled), publish the resulting events, flush,
then commit the batch's offset. A crash anywhere before the commit redelivers the batch; the
journal makes the redelivery a no-op for actions already decided.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path

from cgloop.bus.kafka import BatchConsumer, BatchProducer
from cgloop.policy.engine import Engine, events_by_key
from cgloop.v1 import action_pb2 as apb
from cgloop.v1 import detection_pb2 as dpb

log = logging.getLogger(__name__)

DETECTIONS = "cgloop.detections.v1"
ACTIONS = "cgloop.actions.v1"


def publish(producer: BatchProducer, events: list[apb.ActionEvent]) -> None:
    for key, batch in events_by_key(events).items():
        producer.send(ACTIONS, batch, key=key)
    if events:
        producer.flush()


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
) -> None:
    consumer = BatchConsumer(bootstrap, group_id, [DETECTIONS], source_id=engine.source_id)
    producer = BatchProducer(bootstrap, client_id=engine.source_id)
    try:
        publish(producer, engine.drain())  # whatever resuming from the journal produced
        while not stop.is_set():
            # Take what is waiting (up to max_messages) so one flush and one commit per
            # partition cover many batches: the synchronous commit is the bus's slowest step.
            last: dict[int, object] = {}
            combined = dpb.DetectionBatch()
            taken = 0
            item = consumer.poll(poll_s)
            while item is not None:
                _, batch, msg = item
                combined.records.extend(batch.records)  # type: ignore[attr-defined]
                last[msg.partition()] = msg
                taken += 1
                item = consumer.poll(0.001) if taken < max_messages else None
            events = engine.handle(combined) if taken else []
            engine.tick()
            if approvals is not None and approvals.is_dir():
                process_approvals(engine, approvals)
            publish(producer, events + engine.drain())
            for msg in last.values():
                consumer.commit(msg)  # type: ignore[arg-type]
    finally:
        consumer.close()
        producer.flush()
