"""Every topic's record type goes through the real broker and comes back equal; bad messages
go to the dead-letter topic with their reason while the consumer carries on."""

from __future__ import annotations

import time
import uuid

import pytest
from cgloop.bus.codec import SCHEMA_HEADER, TYPE_HEADER
from cgloop.bus.kafka import BatchConsumer, BatchProducer
from cgloop.bus.topics import DEADLETTER, TOPICS
from cgloop.contracts.samples import SAMPLE_FOR_TOPIC, SAMPLES
from cgloop.v1.deadletter_pb2 import DeadLetter

pytestmark = pytest.mark.kafka


def test_every_topic_has_a_sample() -> None:
    assert set(SAMPLE_FOR_TOPIC) == set(TOPICS)


def _drain(consumer: BatchConsumer, keep, want: int, timeout_s: float = 30) -> list:
    """Poll until `want` items passing `keep` arrived (or the timeout); return those items."""
    got, deadline = [], time.monotonic() + timeout_s
    while len(got) < want and time.monotonic() < deadline:
        item = consumer.poll(0.5)
        if item is not None:
            consumer.commit(item[2])
            if keep(item):
                got.append(item)
    return got


@pytest.mark.parametrize("topic_name", sorted(SAMPLE_FOR_TOPIC))
def test_round_trip_through_the_broker(stack_settings, topic_name: str) -> None:
    sample = SAMPLES[SAMPLE_FOR_TOPIC[topic_name]]()
    marker = uuid.uuid4().hex
    producer = BatchProducer(stack_settings.bootstrap_servers)
    producer.send(topic_name, sample, key=marker)
    producer.flush()

    consumer = BatchConsumer(stack_settings.bootstrap_servers, f"rt-{marker}", [topic_name])
    try:
        received = _drain(consumer, lambda i: i[2].key() == marker.encode(), want=1)
    finally:
        consumer.close()
    assert len(received) == 1
    topic, batch, msg = received[0]
    assert topic.name == topic_name
    assert batch == sample
    headers = dict(msg.headers())
    assert headers[TYPE_HEADER] == sample.DESCRIPTOR.full_name.encode()
    assert headers[SCHEMA_HEADER] == b"1"


def test_producer_refuses_the_wrong_batch_type(stack_settings) -> None:
    producer = BatchProducer(stack_settings.bootstrap_servers)
    with pytest.raises(TypeError, match=r"cgloop.flows.v1 carries cgloop.v1.FlowRecordBatch"):
        producer.send("cgloop.flows.v1", SAMPLES["probe_record_batch"]())


def test_malformed_messages_are_dead_lettered_and_the_consumer_carries_on(stack_settings) -> None:
    topic_name = "cgloop.probes.v1"
    marker = uuid.uuid4().hex
    good = SAMPLES["probe_record_batch"]()
    future_schema = SAMPLES["probe_record_batch"]()
    future_schema.records[0].header.schema_version = 99
    no_source = SAMPLES["probe_record_batch"]()
    no_source.records[0].header.source_id = ""
    probes = [(TYPE_HEADER, b"cgloop.v1.ProbeRecordBatch"), (SCHEMA_HEADER, b"1")]
    # (value, headers, words of the reason), in the order they are sent
    bad = [
        (b"\xff\xff\xff\xff garbage", probes, "not a valid cgloop.v1.ProbeRecordBatch"),
        (b"", probes, "empty payload"),
        (future_schema.SerializeToString(), probes, "schema_version 99 not readable"),
        (no_source.SerializeToString(), probes, "header has no source_id"),
        (SAMPLES["flow_record_batch"]().SerializeToString(), probes, "not a"),
        (
            good.SerializeToString(),
            [(TYPE_HEADER, b"cgloop.v1.FlowRecordBatch"), (SCHEMA_HEADER, b"1")],
            "type header says 'cgloop.v1.FlowRecordBatch'",
        ),
        (good.SerializeToString(), None, "no cgloop-type header"),
        (
            good.SerializeToString(),
            [probes[0], (SCHEMA_HEADER, b"99")],
            "cgloop-schema-version header 99 not readable",
        ),
    ]
    producer = BatchProducer(stack_settings.bootstrap_servers)
    for value, headers, _ in bad:
        producer.send_raw(topic_name, value, key=marker, headers=headers)
    producer.send(topic_name, good, key=marker)  # the one good message, after all the bad ones
    producer.flush()

    consumer = BatchConsumer(stack_settings.bootstrap_servers, f"dl-{marker}", [topic_name])
    try:
        items = _drain(consumer, lambda i: i[2].key() == marker.encode(), want=1)
    finally:
        consumer.close()
    assert [batch for _, batch, _ in items] == [good]
    assert consumer.stats.dead_lettered == len(bad)

    letters_consumer = BatchConsumer(
        stack_settings.bootstrap_servers, f"dlr-{marker}", [DEADLETTER.name]
    )
    try:
        letters: list[DeadLetter] = [
            b
            for _, b, _ in _drain(
                letters_consumer, lambda i: i[1].key == marker.encode(), want=len(bad)
            )
        ]
    finally:
        letters_consumer.close()
    assert len(letters) == len(bad)
    letters.sort(key=lambda letter: letter.offset)  # the order they were sent in
    for letter, (value, _, reason) in zip(letters, bad, strict=True):
        assert letter.value == value
        assert letter.topic == topic_name and letter.consumer_group == f"dl-{marker}"
        assert reason in letter.reason, (reason, letter.reason)
        assert letter.offset >= 0 and letter.header.source_id
