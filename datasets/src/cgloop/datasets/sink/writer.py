"""Writing raw protobuf batches into the store: ClickHouse decodes them, not Python.

The same `raw_insert` call works against chDB in this process (clickhouse-connect's `chdb://`
backend, which streams the bytes through a temporary file) and against a ClickHouse server over
HTTP. The schema travels inline with the insert (`format_schema_source='string'`), so neither
needs our .proto files on its disk.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache

from cgloop.datasets.records import DATABASE, RecordKind, format_schema
from clickhouse_connect.driver.client import Client
from google.protobuf.internal.encoder import _VarintBytes


class StoreWriteError(RuntimeError):
    """The store refused an insert; the message names the table and ClickHouse's reason."""


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


class StoreWriter:
    """Inserts framed batches into a kind's ingest table with a dedup token."""

    def __init__(self, client: Client, parallel_views: bool = True) -> None:
        self.client = client
        # Run a table's materialized views side by side (flow_records feeds two roll-ups): on
        # 2 cores ~1.2x on the store-alone insert (bench/datasets). Off: one after another.
        self.parallel_views = parallel_views

    @cache  # noqa: B019 - one writer per process, a handful of kinds
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

    def insert(self, kind: RecordKind, payloads: Sequence[bytes], token: str | None) -> int:
        """Insert the records of `payloads`; return the rows the store reports written."""
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
            # aggregation and hand its target 256 blocks, i.e. 256 parts an insert (5-10x
            # slower, and a merge backlog): one-level keeps one part a table an insert.
            "group_by_two_level_threshold": 0,
            "group_by_two_level_threshold_bytes": 0,
            # Rows are unique by (source, sequence) within a batch; collapsing equal sort keys
            # at insert costs ~0.5 us a flow record (bench/datasets) and finds nothing. Replays
            # are dropped whole by the dedup token; background merges still replace.
            "optimize_on_insert": 0,
            "parallel_view_processing": int(self.parallel_views),
        }
        if token:
            settings["insert_deduplication_token"] = token
        fmt = "Protobuf" if kind.single_message else "ProtobufList"
        try:
            summary = self.client.raw_insert(
                f"{DATABASE}.{kind.ingest_table}",
                list(self.columns(kind)),
                insert_block=frame(kind, payloads),
                settings=settings,
                fmt=fmt,
            )
        except Exception as exc:  # clickhouse-connect raises per backend; keep ClickHouse's text
            raise StoreWriteError(f"insert into {DATABASE}.{kind.ingest_table}: {exc}") from exc
        return int(getattr(summary, "written_rows", 0) or 0)
