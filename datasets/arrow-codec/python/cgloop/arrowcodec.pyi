"""cgloop.arrowcodec: Kafka payloads of cgloop.flows.v1 / cgloop.int.v1 -> one Arrow IPC stream
(Rust, PyO3)."""

from collections.abc import Sequence

class ArrowStream:
    """The bytes of one stream, owned by Rust, exported read-only through the buffer protocol
    (flows_to_arrow and int_to_arrow return a memoryview of it). Its memory goes back to the
    codec's pool for a later call when the last view of it is released."""

    def __len__(self) -> int: ...

class PayloadError(ValueError):
    """One payload is refused. `index`: its position in the call (the caller can set it aside
    and convert the others); the text names it and what is wrong."""

    index: int

def flows_to_arrow(
    payloads: Sequence[bytes], schema_versions: Sequence[int] | None = None
) -> memoryview:
    """Decode each payload as a cgloop.v1.FlowRecordBatch, concatenate all records in order and
    return ONE Arrow IPC stream (schema, then one record batch) whose columns are exactly those
    of cgloop.flow_ingest, for `INSERT ... FORMAT ArrowStream`. No payloads give a valid stream
    of zero rows. Runs without the GIL.

    The stream is a read-only memoryview (`len()`, slicing, `bytes(...)`, file and socket
    writes, clickhouse-connect's `insert_block` for chDB and HTTP) over memory the codec reuses
    once the view is released: keep the view (or `bytes(view)`) as long as the bytes are needed.

    Refuses what the strict decoder every consumer uses refuses
    (cgloop.bus.codec.decode_payload, in its words): a record without a header, with a schema
    version outside 1..SCHEMA_VERSION or (with `schema_versions`, one a payload: its
    cgloop-schema-version header) another than its message's, without a source id; a payload
    without records; a field its message does not have, at any depth.

    Raises PayloadError (a ValueError) with the payload's `index` (and the reason) when one is
    not a valid FlowRecordBatch, is refused as above, or has a direction that is no Direction
    value (ClickHouse's protobuf decoder rejects those too); ValueError also when the payloads
    exceed 2 GiB together (one Arrow batch's limit).
    """

def int_to_arrow(
    payloads: Sequence[bytes], schema_versions: Sequence[int] | None = None
) -> memoryview:
    """Decode each payload as a cgloop.v1.IntRecordBatch, concatenate all records in order and
    return ONE Arrow IPC stream whose columns are exactly those of cgloop.int_ingest (the four
    oneof kinds side by side; a record's other kinds are 0 / '' / empty and flow_reason is
    INT_EVENT_REASON_UNSPECIFIED, as ClickHouse's protobuf decoder fills them), for
    `INSERT ... FORMAT ArrowStream`. Same conventions as flows_to_arrow: runs without the GIL,
    a read-only memoryview over pooled memory, no payloads give a stream of zero rows.

    Refuses what the strict decoder refuses, as flows_to_arrow does (each kind's header; a
    record with no kind set is an empty envelope). Raises PayloadError with the payload's
    `index` when one is not a valid IntRecordBatch, is refused, or has a flow record whose
    reason is no IntEventReason value (ClickHouse's protobuf decoder rejects those too);
    ValueError also beyond 2 GiB of payloads.
    """
