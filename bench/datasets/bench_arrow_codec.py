"""cgloop.arrowcodec micro-benchmark: flow-record and INT Kafka payloads -> one Arrow IPC stream.

    uv run python bench/datasets/bench_arrow_codec.py [--rows 500000] [--chunk 20] [--repeat 5]
        [--baseline OLD.so] [--kinds flows,int]

The bench's flow batches (bench_datasets._batches: 5 000 distinct records a message), cut into
chunks of `--chunk` messages as the sink inserts them. Side by side, alternating, best of
`--repeat`:

1. Decode: `flows_to_arrow(chunk)` against the peer, protobuf-python's (upb)
   `FlowRecordBatch.ParseFromString` of the same messages (which builds no columns at all),
   and with `--baseline` against another build of the codec (e.g. the previous commit's
   `arrowcodec.*.so`, kept aside before rebuilding), loaded beside this one.
2. Store insert (chDB, all migrations), the same chunks through the sink's StoreWriter, its
   settings for both: ProtobufList (`columnar=False`, ClickHouse decodes) against
   flows_to_arrow + `FORMAT ArrowStream` (encode time included; with `--baseline` also the
   other build's stream), (a) into cgloop.flow_ingest, whose views fill flow_records and the
   roll-ups (tables truncated between rounds), and (b) into a Null table with the same columns
   and no views: the formats' own cost. `--no-store` skips it.

INT (`--kinds int`): the same for `int_to_arrow` against `IntRecordBatch.ParseFromString`, and
the inserts into cgloop.int_ingest (its four views: int_hop/flow/queue/drop_records, and the
flow_stats_1s/1m roll-ups fed from the flow and drop records) and a Null table without views.
The records (`_int_batches`): the canonical INT sample's four kinds in turn (hop, flow with two
hops, queue, drop), each with its own sequence, 10 000 flows (source ports) and a time spread
over a minute; 5 000 records a message. No `--baseline` for INT (the codec is new).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_datasets import _batches
from cgloop.arrowcodec import flows_to_arrow, int_to_arrow
from cgloop.bus.topics import FLOWS, INT
from cgloop.contracts.samples import sample_int_record_batch
from cgloop.v1.flow_pb2 import FlowRecordBatch
from cgloop.v1.int_pb2 import IntRecordBatch

# What each kind's section times: the codec's function, the peer's message class, the topic
# and the tables its rows end up in (the check that every row was stored).
KINDS = {
    "flows": (flows_to_arrow, FlowRecordBatch, FLOWS.name, ("flow_records",)),
    "int": (
        int_to_arrow,
        IntRecordBatch,
        INT.name,
        ("int_hop_records", "int_flow_records", "int_queue_records", "int_drop_records"),
    ),
}


def _int_batches(rows: int, per_message: int = 5_000) -> list[bytes]:
    """INT Kafka values: the sample's four kinds in turn, distinct sequences, 10 000 flows."""
    sample = sample_int_record_batch()
    out = []
    for start in range(0, rows, per_message):
        batch = IntRecordBatch()
        for i in range(start, min(rows, start + per_message)):
            r = batch.records.add()
            r.CopyFrom(sample.records[i % 4])
            m = getattr(r, r.WhichOneof("record"))
            m.header.sequence = i
            m.header.timestamp_ns += (i % 60_000) * 1_000_000
            if "five_tuple" in m.DESCRIPTOR.fields_by_name:
                m.five_tuple.src_port = 20_000 + i % 10_000
        out.append(batch.SerializeToString())
    return out


def _best(fn: Callable[[], object], repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def _chunks(payloads: list[bytes], n: int) -> list[list[bytes]]:
    return [payloads[i : i + n] for i in range(0, len(payloads), n)]


def load_baseline(path: str) -> Callable[[list[bytes]], object]:
    """`flows_to_arrow` of another build of the extension (its module is named arrowcodec
    too; a separate shared object, so it loads beside the current one)."""
    spec = importlib.util.spec_from_file_location("arrowcodec", path)
    if spec is None or spec.loader is None:
        raise SystemExit(f"{path}: not a Python extension module")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.flows_to_arrow  # type: ignore[no-any-return]


def bench_decode(
    chunks: list[list[bytes]],
    rows: int,
    repeat: int,
    baseline: Callable[[list[bytes]], object] | None = None,
    kind: str = "flows",
) -> None:
    codec, message, _, _ = KINDS[kind]
    name = codec.__name__

    def arrow() -> None:
        for c in chunks:
            codec(c)

    def old() -> None:
        for c in chunks:
            baseline(c)  # type: ignore[misc]

    def parse() -> None:
        for c in chunks:
            for p in c:
                message().ParseFromString(p)

    arrow_s = parse_s = old_s = float("inf")
    for _ in range(repeat):  # alternate, so drift in load hits all alike
        arrow_s = min(arrow_s, _best(arrow, 1))
        parse_s = min(parse_s, _best(parse, 1))
        if baseline is not None:
            old_s = min(old_s, _best(old, 1))
    if baseline is not None:
        assert all(bytes(baseline(c)) == bytes(codec(c)) for c in chunks[:2])  # type: ignore[arg-type]
    stream_mb = sum(len(codec(c)) for c in chunks) / 1e6
    proto_mb = sum(len(p) for c in chunks for p in c) / 1e6
    print(f"{kind} decode, {rows} rows in {len(chunks)} calls (best of {repeat}):")
    print(f"  {name:23} {rows / arrow_s / 1e6:6.2f} M rows/s  ({arrow_s:.3f} s)")
    print(f"  peer ParseFromString    {rows / parse_s / 1e6:6.2f} M rows/s  ({parse_s:.3f} s)")
    print(f"  ratio arrow/peer        {parse_s / arrow_s:6.2f}x")
    if baseline is not None:
        print(f"  baseline flows_to_arrow {rows / old_s / 1e6:6.2f} M rows/s  ({old_s:.3f} s)")
        print(f"  ratio arrow/baseline    {old_s / arrow_s:6.2f}x")
    print(f"  bytes: protobuf {proto_mb:.1f} MB -> Arrow stream {stream_mb:.1f} MB")


def bench_store(
    chunks: list[list[bytes]],
    rows: int,
    repeat: int,
    baseline: Callable[[list[bytes]], object] | None = None,
    kind_name: str = "flows",
) -> None:
    import dataclasses

    import clickhouse_connect
    from cgloop.datasets.records import KINDS as RECORD_KINDS
    from cgloop.datasets.sink.writer import Encoded, StoreWriter
    from cgloop.datasets.store.migrations import migrate

    codec, _, topic, stored_in = KINDS[kind_name]
    name = codec.__name__
    kind = RECORD_KINDS[topic]
    # The same Null table without views: the format's own cost, nothing downstream.
    bare = dataclasses.replace(kind, ingest_table=f"{kind.ingest_table}_bare")
    tmp = tempfile.mkdtemp(prefix="bench-arrow-codec-")
    try:
        client = clickhouse_connect.get_client(dsn=f"chdb://{tmp}/store")
        migrate(client)
        client.command(
            f"CREATE TABLE cgloop.{bare.ingest_table} AS cgloop.{kind.ingest_table} ENGINE = Null"
        )
        # Both formats through the sink's own StoreWriter (its insert settings, encode
        # included): only the format differs.
        writers = {"pb": StoreWriter(client, columnar=False), "ar": StoreWriter(client)}
        tables = [
            r[0]
            for r in client.query(
                "SELECT name FROM system.tables WHERE database = 'cgloop'"
                " AND engine LIKE '%MergeTree%'"
            ).result_rows
        ]

        def truncate() -> None:
            for t in tables:
                client.command(f"TRUNCATE TABLE cgloop.{t}")

        def insert(path: str, k: object) -> Callable[[], None]:
            def run() -> None:
                for c in chunks:
                    if path == "old":  # the baseline build's stream, the same insert
                        encoded = Encoded(baseline(c), "ArrowStream")  # type: ignore[misc, arg-type]
                        writers["ar"].insert(k, c, None, encoded)  # type: ignore[arg-type]
                    else:
                        writers[path].insert(k, c, None)  # type: ignore[arg-type]

            return run

        def stored() -> int:
            counts = " + ".join(f"(SELECT count() FROM cgloop.{t})" for t in stored_in)
            return int(client.query(f"SELECT {counts}").result_rows[0][0])

        paths = ("pb", "ar", "old") if baseline is not None else ("pb", "ar")
        best = {(p, t): float("inf") for p in paths for t in ("views", "bare")}
        for _ in range(repeat):  # alternating, so drift in load hits all alike
            for p in paths:
                truncate()
                best[p, "views"] = min(best[p, "views"], _best(insert(p, kind), 1))
                assert stored() == rows, stored()
            for p in paths:
                best[p, "bare"] = min(best[p, "bare"], _best(insert(p, bare), 1))
        client.close()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # chDB may still hold files of its own
    for label, t in (
        (f"store insert, {kind.ingest_table} with its views", "views"),
        ("format only, a Null table without views", "bare"),
    ):
        pb, ar = best["pb", t], best["ar", t]
        print(f"{label}, {rows} rows in {len(chunks)} inserts (best of {repeat}):")
        print(f"  {name + ' + ArrowStream':29} {rows / ar / 1e6:5.2f} M rows/s  ({ar:.3f} s)")
        print(f"  peer StoreWriter ProtobufList {rows / pb / 1e6:5.2f} M rows/s  ({pb:.3f} s)")
        print(f"  ratio arrow/protobuf          {pb / ar:5.2f}x")
        if baseline is not None:
            old = best["old", t]
            old_rate = rows / old / 1e6
            print(f"  baseline codec + ArrowStream  {old_rate:5.2f} M rows/s  ({old:.3f} s)")
            print(f"  ratio arrow/baseline          {old / ar:5.2f}x")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=500_000)
    ap.add_argument("--chunk", type=int, default=20, help="messages an insert (the sink's)")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--store-repeat", type=int, default=2)
    ap.add_argument("--no-store", action="store_true")
    ap.add_argument(
        "--baseline", metavar="SO", help="another build's arrowcodec.*.so to time beside this one"
    )
    ap.add_argument("--kinds", default="flows,int", help="flows, int or both (comma-separated)")
    args = ap.parse_args()
    print(f"load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    for kind in args.kinds.split(","):
        payloads = _batches(args.rows) if kind == "flows" else _int_batches(args.rows)
        chunks = _chunks(payloads, args.chunk)
        baseline = load_baseline(args.baseline) if args.baseline and kind == "flows" else None
        bench_decode(chunks, args.rows, args.repeat, baseline, kind)
        if not args.no_store:
            bench_store(chunks, args.rows, args.store_repeat, baseline, kind)
        print(f"load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
