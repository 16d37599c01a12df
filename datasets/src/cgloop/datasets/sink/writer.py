"""Writing Kafka batches into the store, columnar where it counts.

Flow records and INT records, the high-volume kinds, are decoded in Rust (`cgloop.arrowcodec`,
one Arrow IPC stream a chunk, the GIL released) and inserted as `ArrowStream`: ClickHouse then
reads columns instead of decoding protobuf row by row (flows: ~0.4 against ~1.5-2.5 us a
record, bench/datasets; INT: 1.4x ProtobufList's rate into int_ingest with its views,
datasets/arrow-codec/README.md). Every other kind is sent as its raw protobuf batches
(`ProtobufList`), decoded by ClickHouse with the schema sent inline
(`format_schema_source='string'`), so no store needs our .proto files on its disk.

The same `raw_insert` call works against chDB in this process (clickhouse-connect's `chdb://`
backend, which streams the bytes through a temporary file) and against a ClickHouse server over
HTTP. Both paths fill the same ingest table with the same rows (datasets/tests/test_arrow_codec.py).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cache

from cgloop.bus.topics import FLOWS, INT
from cgloop.datasets.records import DATABASE, RecordKind, format_schema
from clickhouse_connect.driver.client import Client
from google.protobuf.internal.encoder import _VarintBytes


class StoreWriteError(RuntimeError):
    """The store refused an insert; the message names the table and ClickHouse's reason."""


class UndecodableBatch(StoreWriteError):
    """A payload of the batch is not the topic's protobuf message, or holds a record the
    strict decoder refuses (the codec's reason). `index`: that payload's position in the
    call, when the codec names one (the caller sets it aside and encodes the others)."""

    def __init__(self, message: str, index: int | None = None) -> None:
        super().__init__(message)
        self.index = index


def arrow_encoder(topic: str) -> Callable[..., bytes | memoryview] | None:
    """The columnar encoder of `topic`'s batches (payloads, and optionally the schema version
    each message's header declares -> one Arrow IPC stream, a read-only memoryview over the
    codec's reused memory), or None: the kind goes as protobuf. It refuses what the strict
    decoder (cgloop.bus.codec.decode_payload) refuses, raising PayloadError with the index."""
    from cgloop.arrowcodec import flows_to_arrow, int_to_arrow

    return {FLOWS.name: flows_to_arrow, INT.name: int_to_arrow}.get(topic)


def frame(kind: RecordKind, payloads: Sequence[bytes]) -> bytes:
    """The insert body for `payloads` (Kafka message values of `kind`'s topic).

    Batches concatenate into one valid batch (protobuf merges repeated fields), sent as one
    length-delimited ProtobufList envelope; single-record messages (dead letters) are
    length-delimited rows of the Protobuf format.
    """
    if kind.single_message:
        return b"".join(_VarintBytes(len(p)) + p for p in payloads)
    body = b"".join(payloads)
    return _VarintBytes(len(body)) + body


@dataclass(frozen=True)
class Encoded:
    """An insert body: the bytes and the ClickHouse input format they are in."""

    body: bytes | memoryview
    fmt: str


def store_writers(
    dsn: str, count: int, first: Client | None = None, columnar: bool = True
) -> list[StoreWriter]:
    """`count` writers on the store at `dsn`, each with a connection of its own (one per sink
    writer thread; chDB allows many connections to the folder its process owns). `first`:
    an existing client to use for the first."""
    import clickhouse_connect

    clients = [first] if first is not None else []
    clients += [clickhouse_connect.get_client(dsn=dsn) for _ in range(count - len(clients))]
    return [StoreWriter(client, columnar=columnar) for client in clients]


class StoreWriter:
    """Inserts a kind's batches (as Arrow or protobuf) into its ingest table with a dedup
    token."""

    def __init__(self, client: Client, parallel_views: bool = False, columnar: bool = True) -> None:
        self.client = client
        # Arrow inserts for the kinds that have an encoder; False: protobuf for every kind
        # (the previous path, kept as the benchmark's peer).
        self.columnar = columnar
        # Run a table's materialized views side by side (flow_records feeds two roll-ups). Off
        # by default: with the sink's two writer threads inserting at once, 2 cores are better
        # spent on two inserts than on one insert's views (bench/datasets: 0.9x with them).
        self.parallel_views = parallel_views

    @cache  # noqa: B019 - a few writers per process (one per sink thread), a handful of kinds
    def columns(self, kind: RecordKind) -> tuple[str, ...]:
        """The ingest table's columns as the store has them (a proto field the migrations do
        not map yet is simply not requested)."""
        rows = self.client.query(
            "SELECT name FROM system.columns WHERE database = {db:String} AND table = {t:String}"
            " ORDER BY position",
            parameters={"db": DATABASE, "t": kind.ingest_table},
        ).result_rows
        if not rows:
            raise StoreWriteError(
                f"{DATABASE}.{kind.ingest_table} does not exist: run `cgloop store migrate`"
            )
        return tuple(r[0] for r in rows)

    def encodes_strictly(self, kind: RecordKind) -> bool:
        """Whether `encode` refuses what the strict decoder refuses (the Arrow codec does, as
        it encodes); otherwise the caller must decode each payload strictly first."""
        return self.columnar and arrow_encoder(kind.topic) is not None

    def encode(
        self,
        kind: RecordKind,
        payloads: Sequence[bytes],
        schema_versions: Sequence[int] | None = None,
    ) -> Encoded:
        """The insert body of `payloads`: an Arrow stream where `kind` has an encoder (and
        `columnar`), else the framed protobuf batches. `schema_versions`: each message's
        schema-version header, which its records must carry. Raises UndecodableBatch when a
        payload is not the kind's message or holds a record the strict decoder refuses (the
        Arrow path checks while it encodes)."""
        encoder = arrow_encoder(kind.topic) if self.columnar else None
        if encoder is None:
            return Encoded(
                frame(kind, payloads), "Protobuf" if kind.single_message else "ProtobufList"
            )
        try:
            versions = list(schema_versions) if schema_versions is not None else None
            return Encoded(encoder(payloads, versions), "ArrowStream")
        except ValueError as exc:
            raise UndecodableBatch(f"{kind.topic}: {exc}", getattr(exc, "index", None)) from exc

    def insert(
        self,
        kind: RecordKind,
        payloads: Sequence[bytes],
        token: str | None,
        encoded: Encoded | None = None,
    ) -> int:
        """Insert the records of `payloads` (already `encoded`, or encoded here); return the
        rows the store reports written."""
        settings: dict[str, str | int] = {
            "format_schema_source": "string",
            "format_schema": format_schema(),
            "format_schema_message_name": kind.row_descriptor.name,
            "input_format_parallel_parsing": 0,
            "deduplicate_blocks_in_dependent_materialized_views": 1,
            # One insert block per call, so the dedup token covers exactly this batch.
            "max_insert_block_size": 1 << 30,
            "min_insert_block_size_rows": 0,
            "min_insert_block_size_bytes": 0,
            # A view's GROUP BY over a block of >= 100 k rows would switch to two-level
            # aggregation and hand its target 256 blocks, i.e. 256 parts an insert (4-5x
            # slower, and a merge backlog); one-level gives a part per 65 k groups
            # (datasets/tests/test_writer.py).
            "group_by_two_level_threshold": 0,
            "group_by_two_level_threshold_bytes": 0,
            # Rows are unique by (source, sequence) within a batch; collapsing equal sort keys
            # at insert costs ~0.5 us a flow record (bench/datasets) and finds nothing. Replays
            # are dropped whole by the dedup token; background merges still replace.
            "optimize_on_insert": 0,
            "parallel_view_processing": int(self.parallel_views),
            # On a cluster the ingest table is Distributed: the insert returns once every
            # shard has stored its share (with this token), so the offset is committed only
            # after that; no effect on a local table.
            "distributed_foreground_insert": 1,
            # The deployment's `cgloop` profile turns async inserts on (for small writers);
            # the sink's chunks are already large, and an async insert would be merged with
            # others into a block its token does not describe: off for the sink.
            "async_insert": 0,
        }
        if token:
            settings["insert_deduplication_token"] = token
        encoded = encoded or self.encode(kind, payloads)
        try:
            summary = self.client.raw_insert(
                f"{DATABASE}.{kind.ingest_table}",
                list(self.columns(kind)),
                insert_block=encoded.body,
                settings=settings,
                fmt=encoded.fmt,
            )
        except Exception as exc:  # clickhouse-connect raises per backend; keep ClickHouse's text
            raise StoreWriteError(f"insert into {DATABASE}.{kind.ingest_table}: {exc}") from exc
        return int(getattr(summary, "written_rows", 0) or 0)
