"""Strict decoding: every way a message can be wrong is refused with a reason that names it."""

from __future__ import annotations

import pytest
from cgloop.bus.codec import (
    SCHEMA_HEADER,
    TYPE_HEADER,
    DecodeError,
    check_headers,
    decode,
    decode_payload,
    encode,
    headers_for,
)
from cgloop.bus.topics import TOPICS, topic
from cgloop.contracts import SCHEMA_VERSION
from cgloop.contracts.samples import SAMPLES

FLOWS = topic("cgloop.flows.v1")
ACTIONS = topic("cgloop.actions.v1")


def test_every_topic_names_an_existing_batch_type() -> None:
    for t in TOPICS.values():
        assert t.full_type_name.startswith("cgloop.v1.")
        assert t.partitions >= 1 and t.retention_ms > 0


def test_unknown_topic_lists_the_known_ones() -> None:
    with pytest.raises(KeyError, match=r"cgloop\.flows\.v1"):
        topic("cgloop.flow.v1")


def test_valid_batch_decodes_to_an_equal_message() -> None:
    batch = SAMPLES["flow_record_batch"]()
    assert decode(FLOWS, encode(batch), headers_for(batch)) == batch


def test_oneof_envelopes_are_checked_inside() -> None:
    batch = SAMPLES["action_batch"]()
    assert decode(ACTIONS, encode(batch), headers_for(batch)) == batch
    kind = batch.events[0].WhichOneof("event")
    getattr(batch.events[0], kind).header.source_id = ""
    with pytest.raises(DecodeError, match=r"record 0 .*no source_id"):
        decode(ACTIONS, encode(batch), headers_for(batch))
    # An envelope with nothing set has no header to check: refused, not a crash.
    with pytest.raises(DecodeError, match=r"record 0 \(ActionEvent\): empty envelope"):
        decode_payload(ACTIONS, b"\x0a\x00")


def _flow_batch(**header: object):
    batch = SAMPLES["flow_record_batch"]()
    for name, value in header.items():
        setattr(batch.records[0].header, name, value)
    return batch


FLOW_HEADERS = [(TYPE_HEADER, b"cgloop.v1.FlowRecordBatch"), (SCHEMA_HEADER, b"1")]
GOOD = encode(SAMPLES["flow_record_batch"]())


def _varint(n: int) -> bytes:
    out = b""
    while n > 0x7F:
        out += bytes([n & 0x7F | 0x80])
        n >>= 7
    return out + bytes([n])


def _unknown_field_in_a_record() -> bytes:
    """A flow batch whose record carries field 999: parses, but is not a FlowRecordBatch."""
    record = encode(SAMPLES["flow_record_batch"]().records[0]) + _varint(999 << 3) + b"\x01"
    return b"\x0a" + _varint(len(record)) + record


# Every way a message on a topic can be wrong, and the words its refusal must contain. The
# sink, the analytics worker and the policy engine all refuse through this one decoder.
@pytest.mark.parametrize(
    ("payload", "headers", "reason"),
    [
        (b"", FLOW_HEADERS, "empty payload"),
        (None, FLOW_HEADERS, "empty payload"),
        (b"\xff\xff\xff\xff", FLOW_HEADERS, "not a valid cgloop.v1.FlowRecordBatch"),
        (b"\x0a\x05abc", FLOW_HEADERS, "not a valid cgloop.v1.FlowRecordBatch"),  # truncated
        (b"\xa0\x06\x01", FLOW_HEADERS, "unknown top-level field numbers [100]"),
        (
            _unknown_field_in_a_record(),
            FLOW_HEADERS,
            "its records carry fields cgloop.v1.FlowRecordBatch does not have",
        ),
        (
            encode(_flow_batch(schema_version=SCHEMA_VERSION + 1)),
            FLOW_HEADERS,
            f"schema_version {SCHEMA_VERSION + 1} not readable",
        ),
        (encode(_flow_batch(schema_version=0)), FLOW_HEADERS, "schema_version 0 not readable"),
        (encode(_flow_batch(source_id="")), FLOW_HEADERS, "header has no source_id"),
        # -- the Kafka headers: both required, exactly once, agreeing with the payload
        (GOOD, None, "no cgloop-type header"),
        (GOOD, [], "no cgloop-type header"),
        (GOOD, [(SCHEMA_HEADER, b"1")], "no cgloop-type header"),
        (GOOD, [(TYPE_HEADER, b"cgloop.v1.FlowRecordBatch")], "no cgloop-schema-version header"),
        (GOOD, [(TYPE_HEADER, None), (SCHEMA_HEADER, b"1")], "empty cgloop-type header"),
        (
            GOOD,
            [(TYPE_HEADER, b"cgloop.v1.ProbeRecordBatch"), (SCHEMA_HEADER, b"1")],
            "message type header says 'cgloop.v1.ProbeRecordBatch'",
        ),
        (
            GOOD,
            [*FLOW_HEADERS, (TYPE_HEADER, b"cgloop.v1.ProbeRecordBatch")],
            "2 cgloop-type headers",
        ),
        (GOOD, [*FLOW_HEADERS, (SCHEMA_HEADER, b"1")], "2 cgloop-schema-version headers"),
        (
            GOOD,
            [FLOW_HEADERS[0], (SCHEMA_HEADER, b"99")],
            f"cgloop-schema-version header 99 not readable (this build reads 1..{SCHEMA_VERSION})",
        ),
        (GOOD, [FLOW_HEADERS[0], (SCHEMA_HEADER, b"0")], "cgloop-schema-version header 0 not"),
        (GOOD, [FLOW_HEADERS[0], (SCHEMA_HEADER, b"one")], "'one' is not a decimal integer"),
        (GOOD, [FLOW_HEADERS[0], (SCHEMA_HEADER, b"-1")], "'-1' is not a decimal integer"),
        (GOOD, [FLOW_HEADERS[0], (SCHEMA_HEADER, b"")], "empty cgloop-schema-version header"),
    ],
)
def test_malformed_messages_are_refused_with_a_reason(payload, headers, reason) -> None:
    with pytest.raises(DecodeError) as info:
        decode(FLOWS, payload, headers)
    assert reason in str(info.value)


def test_a_record_whose_schema_version_disagrees_with_the_header_is_refused(monkeypatch) -> None:
    # Version 1 is the only one this build knows, so fake a build reading 1..2 to reach the
    # comparison: a record at 1 under a header saying 2.
    import cgloop.bus.codec as codec

    monkeypatch.setattr(codec, "SCHEMA_VERSION", 2)
    with pytest.raises(DecodeError, match=r"record 0 .*schema_version 1 disagrees with"):
        decode(FLOWS, GOOD, [FLOW_HEADERS[0], (SCHEMA_HEADER, b"2")])


def test_check_headers_returns_the_version_and_accepts_str_values() -> None:
    assert check_headers(FLOWS, FLOW_HEADERS) == 1
    assert check_headers(FLOWS, [(k, v.decode()) for k, v in FLOW_HEADERS]) == 1


def test_a_probe_batch_on_the_detections_topic_is_refused_whatever_its_headers() -> None:
    detections = topic("cgloop.detections.v1")
    probe = SAMPLES["probe_record_batch"]()
    with pytest.raises(DecodeError, match=r"type header says 'cgloop\.v1\.ProbeRecordBatch'"):
        decode(detections, encode(probe), headers_for(probe))
    lying = [(TYPE_HEADER, b"cgloop.v1.DetectionBatch"), (SCHEMA_HEADER, b"1")]
    with pytest.raises(DecodeError, match=r"fields cgloop\.v1\.DetectionBatch does not have"):
        decode(detections, encode(probe), lying)


def test_every_sample_decodes_only_on_its_own_topic() -> None:
    batches = {b.DESCRIPTOR.full_name: b for b in (f() for f in SAMPLES.values())}
    for t in TOPICS.values():
        for name, batch in batches.items():
            if name == t.full_type_name:
                assert decode(t, encode(batch), headers_for(batch)) == batch
                continue
            lying = [(TYPE_HEADER, t.full_type_name.encode()), (SCHEMA_HEADER, b"1")]
            with pytest.raises(DecodeError):
                decode(t, encode(batch), lying)


def test_a_batch_without_records_is_refused() -> None:
    empty = type(SAMPLES["flow_record_batch"]())()
    # An empty protobuf message encodes to no bytes at all, so build one with a record
    # that lacks its header instead, and check both refusals.
    with pytest.raises(DecodeError, match="empty payload"):
        decode(FLOWS, encode(empty), FLOW_HEADERS)
    empty.records.add()
    with pytest.raises(DecodeError, match="missing header"):
        decode(FLOWS, encode(empty), FLOW_HEADERS)
