"""Strict decoding: every way a message can be wrong is refused with a reason that names it."""

from __future__ import annotations

import pytest
from cgloop.bus.codec import TYPE_HEADER, DecodeError, decode, encode, headers_for
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
    assert decode(ACTIONS, encode(batch)) == batch
    kind = batch.events[0].WhichOneof("event")
    getattr(batch.events[0], kind).header.source_id = ""
    with pytest.raises(DecodeError, match=r"record 0 .*no source_id"):
        decode(ACTIONS, encode(batch))


def _flow_batch(**header: object):
    batch = SAMPLES["flow_record_batch"]()
    for name, value in header.items():
        setattr(batch.records[0].header, name, value)
    return batch


@pytest.mark.parametrize(
    ("payload", "headers", "reason"),
    [
        (b"", None, "empty payload"),
        (None, None, "empty payload"),
        (b"\xff\xff\xff\xff", None, "not a valid cgloop.v1.FlowRecordBatch"),
        (b"\x0a\x05abc", None, "not a valid cgloop.v1.FlowRecordBatch"),  # truncated field
        (b"\xa0\x06\x01", None, "unknown top-level field numbers [100]"),
        (
            encode(_flow_batch(schema_version=SCHEMA_VERSION + 1)),
            None,
            f"schema_version {SCHEMA_VERSION + 1} not readable",
        ),
        (encode(_flow_batch(schema_version=0)), None, "schema_version 0 not readable"),
        (encode(_flow_batch(source_id="")), None, "header has no source_id"),
        (
            encode(SAMPLES["flow_record_batch"]()),
            [(TYPE_HEADER, b"cgloop.v1.ProbeRecordBatch")],
            "message type header says 'cgloop.v1.ProbeRecordBatch'",
        ),
    ],
)
def test_malformed_messages_are_refused_with_a_reason(payload, headers, reason) -> None:
    with pytest.raises(DecodeError) as info:
        decode(FLOWS, payload, headers)
    assert reason in str(info.value)


def test_a_batch_without_records_is_refused() -> None:
    empty = type(SAMPLES["flow_record_batch"]())()
    # An empty protobuf message encodes to no bytes at all, so build one with a record
    # that lacks its header instead, and check both refusals.
    with pytest.raises(DecodeError, match="empty payload"):
        decode(FLOWS, encode(empty))
    empty.records.add()
    with pytest.raises(DecodeError, match="missing header"):
        decode(FLOWS, encode(empty))
