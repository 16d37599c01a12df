"""cgloop.bus takes its topics, header names and producer settings from the one declaration in
proto/cgloop/v1/bus.proto (cgloop.contracts.bus), and the Python producer runs with them."""

from __future__ import annotations

import pytest
from cgloop.bus import topics
from cgloop.bus.codec import SCHEMA_HEADER, TYPE_HEADER, headers_for
from cgloop.bus.kafka import BatchProducer
from cgloop.contracts.bus import (
    BusHeader,
    BusProducer,
    BusTopic,
    header_name,
    producer_reason,
    producer_settings,
    topic_spec,
)
from cgloop.contracts.samples import SAMPLE_FOR_TOPIC, SAMPLES

PYTHON = BusProducer.BUS_PRODUCER_PYTHON


def test_the_producer_runs_with_the_declared_settings() -> None:
    producer = BatchProducer("localhost:1", client_id="t", **{"message.timeout.ms": 1000})
    declared = producer_settings(PYTHON)
    assert declared["enable.idempotence"] == "true" and declared["acks"] == "all"
    for key, value in declared.items():
        assert producer.config[key] == value, key
    # what is the caller's own is kept
    assert producer.config["message.timeout.ms"] == 1000
    assert producer.config["client.id"] == "t"


@pytest.mark.parametrize("key", ["linger.ms", "enable.idempotence", "acks", "compression.type"])
def test_a_declared_setting_cannot_be_changed_by_a_caller(key: str) -> None:
    with pytest.raises(ValueError, match=key.replace(".", r"\.") + ".*bus.proto"):
        BatchProducer("localhost:1", **{key: "0"})


def test_a_named_difference_comes_with_its_reason() -> None:
    agent = producer_settings(BusProducer.BUS_PRODUCER_NODE_AGENT)
    assert agent["linger.ms"] == "0" != producer_settings(PYTHON)["linger.ms"]
    assert "batches" in producer_reason(BusProducer.BUS_PRODUCER_NODE_AGENT)
    assert producer_reason(PYTHON) == ""
    # everything not named stays the default
    rest = {k: v for k, v in agent.items() if k != "linger.ms"}
    assert rest == {k: v for k, v in producer_settings(PYTHON).items() if k != "linger.ms"}


def test_topic_constants_are_the_declared_topics() -> None:
    pairs = {
        topics.FLOWS: BusTopic.BUS_TOPIC_FLOWS,
        topics.INT: BusTopic.BUS_TOPIC_INT,
        topics.PROBES: BusTopic.BUS_TOPIC_PROBES,
        topics.NODES: BusTopic.BUS_TOPIC_NODES,
        topics.DETECTIONS: BusTopic.BUS_TOPIC_DETECTIONS,
        topics.ACTIONS: BusTopic.BUS_TOPIC_ACTIONS,
        topics.DEADLETTER: BusTopic.BUS_TOPIC_DEADLETTER,
    }
    assert set(pairs) == set(topics.TOPICS.values())
    for t, which in pairs.items():
        spec = topic_spec(which)
        assert (t.name, t.batch_type, t.partitions) == (spec.name, spec.batch_type, spec.partitions)
        assert t.message_class().DESCRIPTOR.full_name == spec.batch_type


def test_unspecified_names_no_topic() -> None:
    with pytest.raises(KeyError, match="BUS_TOPIC_UNSPECIFIED"):
        topic_spec(BusTopic.BUS_TOPIC_UNSPECIFIED)


def test_headers_are_the_declared_names() -> None:
    assert header_name(BusHeader.BUS_HEADER_TYPE) == TYPE_HEADER
    assert header_name(BusHeader.BUS_HEADER_SCHEMA_VERSION) == SCHEMA_HEADER
    for name, sample in SAMPLE_FOR_TOPIC.items():
        batch = SAMPLES[sample]()
        sent = dict(headers_for(batch))
        assert sent[TYPE_HEADER].decode() == topics.topic(name).batch_type
