"""Which record kinds the store keeps, and how protobuf batches become rows: in one place.

Every Kafka topic carries a protobuf batch whose field 1 repeats the row message. ClickHouse
decodes such a batch natively with its `ProtobufList` format (a length-delimited envelope whose
field 1 repeats the row message: exactly our batch's wire layout), matching nested fields to
columns by their path joined with `_` (`header.source_id` -> `header_source_id`). So:

* each kind has an *ingest* table (engine Null) whose columns are named after the flattened
  protobuf paths of its row message (`ingest_columns()` derives them from the descriptor);
* materialized views turn ingest rows into the analyst tables (plain names, DateTime64 times,
  IPv6 addresses, LowCardinality enum names); they live in the migrations;
* the sink sends the raw Kafka bytes, never decoding records in Python on the hot path.

Adding a field to a .proto: `cgloop store schema-diff` prints the ALTER statements of the
migration that maps it; until then the sink simply does not ask ClickHouse for that column.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

from cgloop.bus.topics import (
    ACTIONS,
    DEADLETTER,
    DETECTIONS,
    FLOWS,
    INT,
    NODES,
    PROBES,
    TOPICS,
    Topic,
)
from google.protobuf.descriptor import Descriptor, FieldDescriptor

DATABASE = "cgloop"

_SCALAR_PROTO = {
    FieldDescriptor.TYPE_DOUBLE: "double",
    FieldDescriptor.TYPE_FLOAT: "float",
    FieldDescriptor.TYPE_INT64: "int64",
    FieldDescriptor.TYPE_UINT64: "uint64",
    FieldDescriptor.TYPE_INT32: "int32",
    FieldDescriptor.TYPE_FIXED64: "fixed64",
    FieldDescriptor.TYPE_FIXED32: "fixed32",
    FieldDescriptor.TYPE_BOOL: "bool",
    FieldDescriptor.TYPE_STRING: "string",
    FieldDescriptor.TYPE_BYTES: "bytes",
    FieldDescriptor.TYPE_UINT32: "uint32",
    FieldDescriptor.TYPE_SFIXED32: "sfixed32",
    FieldDescriptor.TYPE_SFIXED64: "sfixed64",
    FieldDescriptor.TYPE_SINT32: "sint32",
    FieldDescriptor.TYPE_SINT64: "sint64",
}
_SCALAR_CH = {
    "double": "Float64",
    "float": "Float32",
    "int64": "Int64",
    "sint64": "Int64",
    "sfixed64": "Int64",
    "uint64": "UInt64",
    "fixed64": "UInt64",
    "int32": "Int32",
    "sint32": "Int32",
    "sfixed32": "Int32",
    "uint32": "UInt32",
    "fixed32": "UInt32",
    "bool": "Bool",
    "string": "String",
    "bytes": "String",
}


@dataclass(frozen=True)
class RecordKind:
    """One kind of row: where it comes from and the ingest table ClickHouse decodes it into."""

    name: str  # e.g. "flow"
    topic: str  # Kafka topic carrying its batches
    ingest_table: str  # Null table named after protobuf paths; MVs fan out from it

    @property
    def topic_spec(self) -> Topic:
        return TOPICS[self.topic]

    @property
    def row_descriptor(self) -> Descriptor:
        """The message repeated in field 1 of the topic's batch (a DeadLetter is its own row)."""
        batch = self.topic_spec.message_class().DESCRIPTOR
        if "header" in batch.fields_by_name:
            return batch
        return batch.fields_by_number[1].message_type

    @property
    def single_message(self) -> bool:
        """True when each Kafka message is one row rather than a batch (dead letters)."""
        return "header" in self.topic_spec.message_class().DESCRIPTOR.fields_by_name


# One ingest table per topic; the INT and action topics fan out to several tables by oneof.
KINDS: dict[str, RecordKind] = {
    k.topic: k
    for k in [
        RecordKind("flow", FLOWS.name, "flow_ingest"),
        RecordKind("int", INT.name, "int_ingest"),
        RecordKind("probe", PROBES.name, "probe_ingest"),
        RecordKind("node", NODES.name, "node_ingest"),
        RecordKind("detection", DETECTIONS.name, "detection_ingest"),
        RecordKind("action", ACTIONS.name, "action_ingest"),
        RecordKind("deadletter", DEADLETTER.name, "deadletter_ingest"),
    ]
}


def _ch_type(field: FieldDescriptor) -> str:
    """ClickHouse type a single (non-repeated) field decodes into."""
    if field.enum_type is not None:
        return "LowCardinality(String)"  # the enum value's name
    return _SCALAR_CH[_SCALAR_PROTO[field.type]]


def _is_map(field: FieldDescriptor) -> bool:
    return field.message_type is not None and field.message_type.GetOptions().map_entry


def ingest_columns(descriptor: Descriptor, prefix: str = "") -> list[tuple[str, str]]:
    """(column, ClickHouse type) for every leaf of `descriptor`, paths joined with `_`.

    Nested messages are flattened; repeated scalars are arrays; repeated messages are arrays of
    named tuples; maps are Map(String, String); `Log2Histogram` and friends flatten to
    `<field>_buckets Array(UInt64)`.
    """
    columns: list[tuple[str, str]] = []
    for field in descriptor.fields:
        name = f"{prefix}{field.name}"
        if _is_map(field):
            key, value = field.message_type.fields
            columns.append((name, f"Map({_ch_type(key)}, {_ch_type(value)})"))
        elif field.message_type is not None and field.is_repeated:
            inner = ", ".join(f"{n} {t}" for n, t in ingest_columns(field.message_type))
            columns.append((name, f"Array(Tuple({inner}))"))
        elif field.message_type is not None:
            columns.extend(ingest_columns(field.message_type, f"{name}_"))
        elif field.is_repeated:
            columns.append((name, f"Array({_ch_type(field)})"))
        else:
            columns.append((name, _ch_type(field)))
    return columns


def _proto_type(field: FieldDescriptor) -> str:
    if field.message_type is not None:
        return "." + field.message_type.full_name
    if field.enum_type is not None:
        return "." + field.enum_type.full_name
    return _SCALAR_PROTO[field.type]


def _render_message(message: Descriptor, out: list[str], indent: str = "") -> None:
    out.append(f"{indent}message {message.name} {{")
    for nested in message.nested_types:
        if not nested.GetOptions().map_entry:
            _render_message(nested, out, indent + "  ")
    for enum in message.enum_types:
        out.append(f"{indent}  enum {enum.name} {{")
        out.extend(f"{indent}    {v.name} = {v.number};" for v in enum.values)
        out.append(f"{indent}  }}")
    real_oneofs = [o for o in message.oneofs if not _synthetic(o)]
    for field in message.fields:
        if field.containing_oneof in real_oneofs:
            continue
        if _is_map(field):
            key, value = field.message_type.fields
            out.append(
                f"{indent}  map<{_proto_type(key)}, {_proto_type(value)}> "
                f"{field.name} = {field.number};"
            )
            continue
        label = (
            "repeated " if field.is_repeated else ("optional " if field.containing_oneof else "")
        )
        out.append(f"{indent}  {label}{_proto_type(field)} {field.name} = {field.number};")
    for oneof in real_oneofs:
        out.append(f"{indent}  oneof {oneof.name} {{")
        out.extend(f"{indent}    {_proto_type(f)} {f.name} = {f.number};" for f in oneof.fields)
        out.append(f"{indent}  }}")
    out.append(f"{indent}}}")


def _synthetic(oneof: object) -> bool:
    """proto3 `optional` fields live in a synthetic one-field oneof named `_<field>`."""
    fields = oneof.fields  # type: ignore[attr-defined]
    return len(fields) == 1 and oneof.name == f"_{fields[0].name}"  # type: ignore[attr-defined]


@cache
def format_schema() -> str:
    """All cgloop.v1 record messages and enums as one self-contained .proto text.

    ClickHouse takes it inline (`format_schema_source='string'`), so neither chDB nor a remote
    ClickHouse server needs our .proto files on its disk.
    """
    files = {k.topic_spec.message_class().DESCRIPTOR.file for k in KINDS.values()}
    seen: set[str] = set()
    ordered = []

    def visit(fd: object) -> None:
        # Only our package: node_agent.proto (whose chain functions actions embed) imports
        # protobuf's descriptor.proto for its options, and ClickHouse cannot parse that
        # file rendered as proto3; records never hold its messages.
        if fd.name in seen or fd.package != "cgloop.v1":  # type: ignore[attr-defined]
            return
        seen.add(fd.name)  # type: ignore[attr-defined]
        for dep in fd.dependencies:  # type: ignore[attr-defined]
            visit(dep)
        ordered.append(fd)

    for fd in sorted(files, key=lambda f: f.name):
        visit(fd)
    out = ['syntax = "proto3";', "package cgloop.v1;"]
    for fd in ordered:
        for enum in fd.enum_types_by_name.values():
            out.append(f"enum {enum.name} {{")
            out.extend(f"  {v.name} = {v.number};" for v in enum.values)
            out.append("}")
        for message in fd.message_types_by_name.values():
            _render_message(message, out)
    return "\n".join(out) + "\n"
