"""cgloop's Kafka topics: name, batch type, partitions, retention, key.

The table is declared once, in proto/cgloop/v1/bus.proto (read through cgloop.contracts.bus;
the Rust producers read the same declaration). Code names a topic by the constants below
(`FLOWS.name`), never by a string of its own.

Partition counts are sized for one node and can be raised (never lowered) on a real cluster;
keys keep one flow (or one subject) on one partition, so per-flow order is preserved.
"""

from __future__ import annotations

from dataclasses import dataclass

from cgloop.contracts.bus import BusTopic, topic_specs
from google.protobuf import descriptor_pool, message_factory
from google.protobuf.message import Message

HOUR_MS = 3_600_000
DAY_MS = 24 * HOUR_MS


@dataclass(frozen=True)
class Topic:
    name: str
    batch_type: str  # full protobuf name of the batch every message carries (cgloop.v1.*)
    partitions: int
    retention_ms: int
    key: str  # what the producer keys messages by (for partition locality)
    description: str

    def message_class(self) -> type[Message]:
        # The batch types' modules are imported below, so the default pool knows them.
        desc = descriptor_pool.Default().FindMessageTypeByName(self.batch_type)
        return message_factory.GetMessageClass(desc)

    @property
    def full_type_name(self) -> str:
        return self.message_class().DESCRIPTOR.full_name

    def config(self) -> dict[str, str]:
        return {"retention.ms": str(self.retention_ms), "cleanup.policy": "delete"}


def _import_batch_types() -> None:
    from cgloop.v1 import (  # noqa: F401
        action_pb2,
        deadletter_pb2,
        detection_pb2,
        flow_pb2,
        int_pb2,
        node_pb2,
        probe_pb2,
    )


_import_batch_types()

_BY_ID: dict[int, Topic] = {
    number: Topic(
        spec.name,
        spec.batch_type,
        spec.partitions,
        spec.retention_hours * HOUR_MS,
        spec.key,
        spec.description,
    )
    for number, spec in topic_specs().items()
}
TOPICS: dict[str, Topic] = {t.name: t for t in _BY_ID.values()}

FLOWS = _BY_ID[BusTopic.BUS_TOPIC_FLOWS]
INT = _BY_ID[BusTopic.BUS_TOPIC_INT]
PROBES = _BY_ID[BusTopic.BUS_TOPIC_PROBES]
NODES = _BY_ID[BusTopic.BUS_TOPIC_NODES]
DETECTIONS = _BY_ID[BusTopic.BUS_TOPIC_DETECTIONS]
ACTIONS = _BY_ID[BusTopic.BUS_TOPIC_ACTIONS]
DEADLETTER = _BY_ID[BusTopic.BUS_TOPIC_DEADLETTER]

# What the analytics worker consumes, declared here so the loop (which starts the worker as a
# process and waits for its group to catch up) names the same topics without importing it. The
# loop's own actions tell the worker which flows now carry another DSCP.
ANALYTICS_INPUTS = tuple(t.name for t in (FLOWS, INT, PROBES, NODES, ACTIONS))


def topic(name: str) -> Topic:
    try:
        return TOPICS[name]
    except KeyError:
        raise KeyError(f"unknown topic {name!r}; cgloop topics are: {', '.join(TOPICS)}") from None
