"""The Kafka bus as declared once in proto/cgloop/v1/bus.proto, read from the generated
descriptors: the topic table (BusTopic), the header names (BusHeader) and the librdkafka
settings of every producer (BusProducer). `cgloop.bus` builds its topics, codec and producer
from here; the Rust crate reads the same options (cgloop_proto::bus), and a test compares the
two readings (`table()` against `cgloop-vectors bus-table`).
"""

from __future__ import annotations

from typing import Any

from cgloop.v1 import bus_pb2
from cgloop.v1.bus_pb2 import BusHeader, BusProducer, BusTopic, ProducerSettings, TopicSpec

__all__ = [
    "BusHeader",
    "BusProducer",
    "BusTopic",
    "header_name",
    "producer_reason",
    "producer_settings",
    "table",
    "topic_spec",
    "topic_specs",
]


def _options(enum: Any, number: int) -> Any:
    return enum.DESCRIPTOR.values_by_number[number].GetOptions()


def _numbers(enum: Any) -> list[int]:
    return [v.number for v in enum.DESCRIPTOR.values if v.number != 0]


def topic_spec(which: int) -> TopicSpec:
    """The declaration of one BusTopic; KeyError for one that declares no topic."""
    options = _options(BusTopic, which)
    if not options.HasExtension(bus_pb2.topic):
        raise KeyError(f"{BusTopic.Name(which)} declares no topic")
    return options.Extensions[bus_pb2.topic]


def topic_specs() -> dict[int, TopicSpec]:
    """Every topic, by BusTopic number, in declaration order."""
    return {n: topic_spec(n) for n in _numbers(BusTopic)}


def header_name(which: int) -> str:
    name = _options(BusHeader, which).Extensions[bus_pb2.header_name]
    if not name:
        raise KeyError(f"{BusHeader.Name(which)} declares no header name")
    return name


def _declared(which: int) -> ProducerSettings:
    return _options(BusProducer, which).Extensions[bus_pb2.producer_settings]


def producer_settings(which: int) -> dict[str, str]:
    """The librdkafka settings `which` runs with: the default ones, then its own named ones."""
    return {
        **dict(_declared(BusProducer.BUS_PRODUCER_DEFAULT).librdkafka),
        **dict(_declared(which).librdkafka),
    }


def producer_reason(which: int) -> str:
    """Why `which` differs from the default ("" when it does not)."""
    return _declared(which).reason


def table() -> dict[str, Any]:
    """The whole table in the shape `cgloop-vectors bus-table` prints (Rust's reading)."""
    return {
        "topics": {
            BusTopic.Name(n): {
                "name": s.name,
                "batch_type": s.batch_type,
                "partitions": s.partitions,
                "retention_hours": s.retention_hours,
                "key": s.key,
                "description": s.description,
            }
            for n, s in topic_specs().items()
        },
        "headers": {BusHeader.Name(n): header_name(n) for n in _numbers(BusHeader)},
        "producers": {
            BusProducer.Name(n): {
                "librdkafka": producer_settings(n),
                "reason": producer_reason(n),
            }
            for n in _numbers(BusProducer)
        },
    }
