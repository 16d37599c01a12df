"""The streaming worker refuses, through the bus's one strict decoder, what the sink refuses:
each bad message goes to the dead-letter topic with its reason and reaches no detector."""

from __future__ import annotations

import time
import uuid

import pytest
from cgloop.analytics.engine import AnalyticsEngine
from cgloop.analytics.worker import Worker
from cgloop.bus.codec import SCHEMA_HEADER, TYPE_HEADER, headers_for
from cgloop.bus.kafka import BatchConsumer, BatchProducer, ensure_topics
from cgloop.bus.topics import DEADLETTER
from cgloop.contracts.samples import SAMPLES

pytestmark = pytest.mark.kafka

FLOWS = [(TYPE_HEADER, b"cgloop.v1.FlowRecordBatch"), (SCHEMA_HEADER, b"1")]


def test_the_worker_dead_letters_what_the_sink_refuses(stack_settings, tmp_path) -> None:
    bootstrap = stack_settings.bootstrap_servers
    ensure_topics(bootstrap)
    run = uuid.uuid4().hex
    group = f"analytics-refusals-{run}"
    good = SAMPLES["flow_record_batch"]()
    no_source = SAMPLES["flow_record_batch"]()
    no_source.records[0].header.source_id = ""
    actions = SAMPLES["action_batch"]()
    # (topic, value, headers, words of the reason), in the order they are sent
    bad = [
        (
            "cgloop.flows.v1",
            good.SerializeToString(),
            [FLOWS[0], (SCHEMA_HEADER, b"99")],
            "cgloop-schema-version header 99 not readable",
        ),
        (
            "cgloop.actions.v1",
            actions.SerializeToString(),
            [(TYPE_HEADER, b"cgloop.v1.ActionBatch"), (SCHEMA_HEADER, b"99")],
            "cgloop-schema-version header 99 not readable",
        ),
        ("cgloop.flows.v1", no_source.SerializeToString(), FLOWS, "header has no source_id"),
        ("cgloop.flows.v1", good.SerializeToString(), None, "no cgloop-type header"),
        (
            "cgloop.flows.v1",
            SAMPLES["detection_batch"]().SerializeToString(),
            headers_for(SAMPLES["detection_batch"]()),
            "type header says 'cgloop.v1.DetectionBatch'",
        ),
        (
            "cgloop.flows.v1",
            SAMPLES["probe_record_batch"]().SerializeToString(),
            FLOWS,  # lying
            "not a valid cgloop.v1.FlowRecordBatch",
        ),
    ]
    producer = BatchProducer(bootstrap)
    for topic, value, headers, _ in bad:
        producer.send_raw(topic, value, key=run, headers=headers)
    producer.send("cgloop.flows.v1", good, key=run)
    producer.flush()

    worker = Worker(AnalyticsEngine(None), bootstrap, tmp_path / "worker.json", group)
    deadline = time.monotonic() + 60
    try:
        while time.monotonic() < deadline and not (
            worker.stats.messages and worker.consumer.stats.dead_lettered >= len(bad)
        ):
            worker.step(0.5)
    finally:
        worker.close()
    # Only the good batch reached the detectors.
    assert worker.stats.messages == 1
    assert worker.stats.records == len(good.records)
    assert worker.consumer.stats.dead_lettered == len(bad)

    letters = BatchConsumer(bootstrap, f"dl-{run}", [DEADLETTER.name])
    mine = []
    deadline = time.monotonic() + 60
    try:
        while time.monotonic() < deadline and len(mine) < len(bad):
            item = letters.poll(1.0)
            if item is not None and item[1].consumer_group == group:
                mine.append(item[1])
    finally:
        letters.close()
    assert len(mine) == len(bad)
    for topic, value, _, words in bad:
        (letter,) = [x for x in mine if x.topic == topic and x.value == value and words in x.reason]
        assert letter.key == run.encode()
