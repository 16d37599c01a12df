"""Encoding and strict decoding of topic messages: the one decoder every consumer uses.

Protobuf parsing is lenient (random bytes often parse as *something*, and a batch of another
type often parses as this one), so decoding checks more than the wire format:

* the Kafka headers (`check_headers`): exactly one `cgloop-type` header naming the topic's
  batch type and exactly one `cgloop-schema-version` header, a decimal integer this build
  reads (1..SCHEMA_VERSION). Every cgloop producer (Python `BatchProducer`, the Rust probe,
  INT collector and node agent) sets both, so a message without them is refused;
* the payload: not empty, parses as the topic's batch type with no unknown field at any depth
  (a batch of another type shows up as fields this type does not have);
* every record: a header whose schema_version equals the message's schema-version header, and
  a non-empty source_id.

Anything else is a DecodeError whose message says exactly what was wrong; consumers send such
messages to the dead-letter topic with that reason. The sink, the analytics worker and the
policy engine all decide through this module, so they refuse the same messages.
"""

from __future__ import annotations

from collections.abc import Sequence

from cgloop.bus.topics import Topic
from cgloop.contracts import SCHEMA_VERSION
from cgloop.contracts.bus import BusHeader, header_name
from google.protobuf.message import DecodeError as ProtobufDecodeError
from google.protobuf.message import Message
from google.protobuf.unknown_fields import UnknownFieldSet

# Declared in proto/cgloop/v1/bus.proto (BusHeader), as the Rust producers read them.
TYPE_HEADER = header_name(BusHeader.BUS_HEADER_TYPE)
SCHEMA_HEADER = header_name(BusHeader.BUS_HEADER_SCHEMA_VERSION)

Headers = Sequence[tuple[str, bytes | str | None]]


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


def _text(value: bytes | str | None) -> str:
    if value is None:
        return ""
    return value if isinstance(value, str) else value.decode(errors="replace")


def _one(topic: Topic, headers: Headers, name: str) -> str:
    values = [_text(v) for k, v in headers if k == name]
    if not values:
        raise DecodeError(
            f"no {name} header: every message on {topic.name} must carry one "
            "(cgloop's producers always set it)"
        )
    if len(values) > 1:
        raise DecodeError(f"{len(values)} {name} headers ({values!r}); exactly one expected")
    if not values[0]:
        raise DecodeError(f"empty {name} header")
    return values[0]


def check_headers(topic: Topic, headers: Headers | None) -> int:
    """Check a Kafka message's cgloop headers for `topic`; return its schema version.

    Raises DecodeError when the type header is missing, repeated, empty or names another
    batch type, or the schema-version header is missing, repeated, not a decimal integer or
    outside 1..SCHEMA_VERSION. `headers` is what confluent-kafka's `Message.headers()` returns
    (None for a message without headers, which is refused).
    """
    headers = headers or []
    expected = topic.full_type_name
    kind = _one(topic, headers, TYPE_HEADER)
    if kind != expected:
        raise DecodeError(
            f"message type header says {kind!r}, topic {topic.name} carries {expected}"
        )
    raw = _one(topic, headers, SCHEMA_HEADER)
    if not raw.isascii() or not raw.isdigit():
        raise DecodeError(f"{SCHEMA_HEADER} header {raw!r} is not a decimal integer")
    version = int(raw)
    if not 1 <= version <= SCHEMA_VERSION:
        raise DecodeError(
            f"{SCHEMA_HEADER} header {version} not readable (this build reads 1..{SCHEMA_VERSION})"
        )
    return version


def _records(batch: Message) -> list[Message]:
    """The records a batch carries (each has a `header`), unwrapping oneof envelopes.

    An envelope with nothing set is returned as is (it has no `header`; `decode` refuses it).
    """
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


def _drop_unknown_fields(message: Message) -> bool:
    """Discard unknown fields at every depth; True if there were any. Done in the C
    implementation (the encoded size shrinks when unknown fields go): a recursive walk in
    Python would cost several times the parse on a large batch."""
    size = message.ByteSize()
    message.DiscardUnknownFields()
    return message.ByteSize() != size


def decode_payload(
    topic: Topic, payload: bytes | None, schema_version: int | None = None
) -> Message:
    """Parse and validate the payload of one message of `topic` (no Kafka headers: bytes read
    from elsewhere, or after `check_headers`). With `schema_version`, every record's header
    must carry exactly that version."""
    expected = topic.full_type_name
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
    if _drop_unknown_fields(message):
        raise DecodeError(
            f"not a {expected}: its records carry fields {expected} does not have "
            "(another message type?)"
        )
    records = _records(message)
    if not records:
        raise DecodeError(f"{expected} with no records")
    for i, record in enumerate(records):
        where = f"record {i} ({record.DESCRIPTOR.name})"
        if "header" not in record.DESCRIPTOR.fields_by_name:
            raise DecodeError(f"{where}: empty envelope, none of its records is set")
        if not record.HasField("header"):
            raise DecodeError(f"{where}: missing header")
        header = record.header
        if not 1 <= header.schema_version <= SCHEMA_VERSION:
            raise DecodeError(
                f"{where}: schema_version {header.schema_version} not readable "
                f"(this build reads 1..{SCHEMA_VERSION})"
            )
        if schema_version is not None and header.schema_version != schema_version:
            raise DecodeError(
                f"{where}: schema_version {header.schema_version} disagrees with the "
                f"{SCHEMA_HEADER} header {schema_version}"
            )
        if not header.source_id:
            raise DecodeError(f"{where}: header has no source_id")
    return message


def decode(topic: Topic, payload: bytes | None, headers: Headers | None = None) -> Message:
    """Parse and validate one Kafka message of `topic` (headers and payload); raise
    DecodeError naming the problem. Missing headers are refused: use `decode_payload` for
    bytes that did not come from Kafka."""
    version = check_headers(topic, headers)
    return decode_payload(topic, payload, version)
