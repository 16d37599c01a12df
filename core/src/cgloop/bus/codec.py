"""Encoding and strict decoding of topic messages.

Protobuf parsing is lenient (random bytes often parse as *something*), so decoding checks more
than the wire format: no unknown top-level fields, every record has a header with a schema
version this build reads and a source id. Anything else is a DecodeError whose message says
exactly what was wrong; consumers send such messages to the dead-letter topic.
"""

from __future__ import annotations

from cgloop.bus.topics import Topic
from cgloop.contracts import SCHEMA_VERSION
from google.protobuf.message import DecodeError as ProtobufDecodeError
from google.protobuf.message import Message
from google.protobuf.unknown_fields import UnknownFieldSet

TYPE_HEADER = "cgloop-type"
SCHEMA_HEADER = "cgloop-schema-version"


class DecodeError(ValueError):
    """A message that is not a valid batch for its topic; the text is the dead-letter reason."""


def encode(message: Message) -> bytes:
    # Deterministic so the same batch always has the same bytes (dedup, test vectors).
    return message.SerializeToString(deterministic=True)


def headers_for(message: Message) -> list[tuple[str, bytes]]:
    return [
        (TYPE_HEADER, message.DESCRIPTOR.full_name.encode()),
        (SCHEMA_HEADER, str(SCHEMA_VERSION).encode()),
    ]


def _records(batch: Message) -> list[Message]:
    """The records a batch carries (each has a `header`), unwrapping oneof envelopes."""
    if "header" in batch.DESCRIPTOR.fields_by_name:
        return [batch]  # a single record, e.g. DeadLetter
    out: list[Message] = []
    for field in batch.DESCRIPTOR.fields:
        if field.message_type is None or not field.is_repeated:
            continue
        for item in getattr(batch, field.name):
            if "header" in item.DESCRIPTOR.fields_by_name:
                out.append(item)
            else:  # envelope with a oneof (IntRecord, ActionEvent)
                which = (
                    item.WhichOneof(item.DESCRIPTOR.oneofs[0].name)
                    if item.DESCRIPTOR.oneofs
                    else None
                )
                out.append(getattr(item, which) if which else item)
    return out


def decode(
    topic: Topic, payload: bytes | None, headers: list[tuple[str, bytes]] | None = None
) -> Message:
    """Parse and validate one message of `topic`; raise DecodeError naming the problem."""
    expected = topic.full_type_name
    for name, value in headers or []:
        if name == TYPE_HEADER and value and value.decode(errors="replace") != expected:
            raise DecodeError(
                f"message type header says {value.decode(errors='replace')!r}, "
                f"topic {topic.name} carries {expected}"
            )
    if not payload:
        raise DecodeError(
            f"empty payload: topic {topic.name} carries non-empty {expected} messages"
        )
    message = topic.message_class()()
    try:
        message.ParseFromString(payload)
    except ProtobufDecodeError as exc:
        raise DecodeError(f"not a valid {expected} ({len(payload)} bytes): {exc}") from None
    unknown = UnknownFieldSet(message)
    if len(unknown):
        numbers = sorted({f.field_number for f in unknown})
        raise DecodeError(f"not a {expected}: unknown top-level field numbers {numbers}")
    records = _records(message)
    if not records:
        raise DecodeError(f"{expected} with no records")
    for i, record in enumerate(records):
        where = f"record {i} ({record.DESCRIPTOR.name})"
        if not record.HasField("header"):
            raise DecodeError(f"{where}: missing header")
        header = record.header
        if not 1 <= header.schema_version <= SCHEMA_VERSION:
            raise DecodeError(
                f"{where}: schema_version {header.schema_version} not readable "
                f"(this build reads 1..{SCHEMA_VERSION})"
            )
        if not header.source_id:
            raise DecodeError(f"{where}: header has no source_id")
    return message
