"""cgloop.arrowcodec: Kafka payloads of cgloop.flows.v1 -> one Arrow IPC stream (Rust, PyO3)."""

from collections.abc import Sequence

def flows_to_arrow(payloads: Sequence[bytes]) -> bytes:
    """Decode each payload as a cgloop.v1.FlowRecordBatch, concatenate all records in order and
    return ONE Arrow IPC stream (schema, then one record batch) whose columns are exactly those
    of cgloop.flow_ingest, for `INSERT ... FORMAT ArrowStream`. No payloads give a valid stream
    of zero rows. Runs without the GIL.

    Raises ValueError naming the payload's index (and prost's reason) when one is not a valid
    FlowRecordBatch, or the payload and record index when a direction is no Direction value
    (ClickHouse's protobuf decoder rejects those too); ValueError also when the payloads exceed
    2 GiB together (one Arrow batch's limit).
    """
