"""cgloop's Kafka topics: name, batch type, partitions, retention.

Partition counts are sized for one node and can be raised (never lowered) on a real cluster;
keys keep one flow (or one subject) on one partition, so per-flow order is preserved.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

from google.protobuf.message import Message

HOUR_MS = 3_600_000
DAY_MS = 24 * HOUR_MS


@dataclass(frozen=True)
class Topic:
    name: str
    message_type: str  # "module:Class" under cgloop.v1, the batch type every message carries
    partitions: int
    retention_ms: int
    key: str  # what the producer keys messages by (for partition locality)
    description: str

    def message_class(self) -> type[Message]:
        module, cls = self.message_type.split(":")
        return getattr(importlib.import_module(f"cgloop.v1.{module}"), cls)

    @property
    def full_type_name(self) -> str:
        return self.message_class().DESCRIPTOR.full_name

    def config(self) -> dict[str, str]:
        return {"retention.ms": str(self.retention_ms), "cleanup.policy": "delete"}


TOPICS: dict[str, Topic] = {
    t.name: t
    for t in [
        Topic(
            "cgloop.flows.v1",
            "flow_pb2:FlowRecordBatch",
            6,
            6 * HOUR_MS,
            "five-tuple hash",
            "per-flow interval records from the XDP probe",
        ),
        Topic(
            "cgloop.int.v1",
            "int_pb2:IntRecordBatch",
            6,
            6 * HOUR_MS,
            "inner five-tuple or switch id",
            "INT hop/flow/queue/drop records from the collector",
        ),
        Topic(
            "cgloop.probes.v1",
            "probe_pb2:ProbeRecordBatch",
            3,
            DAY_MS,
            "probe target",
            "active latency probe results",
        ),
        Topic(
            "cgloop.nodes.v1",
            "node_pb2:NodeSampleBatch",
            3,
            DAY_MS,
            "node id",
            "node samples: CPU frequency, utilisation, power, function counters",
        ),
        Topic(
            "cgloop.detections.v1",
            "detection_pb2:DetectionBatch",
            3,
            7 * DAY_MS,
            "detection subject",
            "detections from analytics",
        ),
        Topic(
            "cgloop.actions.v1",
            "action_pb2:ActionBatch",
            3,
            30 * DAY_MS,
            "action target",
            "policy engine actions and their results (the audit trail)",
        ),
        Topic(
            "cgloop.deadletter.v1",
            "deadletter_pb2:DeadLetter",
            1,
            7 * DAY_MS,
            "original topic",
            "messages no consumer could decode, with the reason",
        ),
    ]
}

DEADLETTER = TOPICS["cgloop.deadletter.v1"]
# What the analytics worker consumes, declared here so the loop (which starts the worker as a
# process and waits for its group to catch up) names the same topics without importing it. The
# loop's own actions tell the worker which flows now carry another DSCP.
ANALYTICS_INPUTS = tuple(
    TOPICS[name].name
    for name in (
        "cgloop.flows.v1", "cgloop.int.v1", "cgloop.probes.v1", "cgloop.nodes.v1",
        "cgloop.actions.v1",
    )
)  # fmt: skip


def topic(name: str) -> Topic:
    try:
        return TOPICS[name]
    except KeyError:
        raise KeyError(f"unknown topic {name!r}; cgloop topics are: {', '.join(TOPICS)}") from None
