"""Trace-store benchmark: Kafka -> chDB ingest of flow records, and p99 per flow per minute.

    uv run python bench/datasets/bench_datasets.py [--rows 3000000] [--query-rows 50000000]

1. Ingest: flow-record batches (5 000 records a message, every record distinct) are produced to
   a real KRaft broker, then `cgloop sink`'s Sink (in this process, chDB in a temporary folder)
   consumes them into cgloop.flow_records (and its two roll-ups). Figure: rows/s from the first
   poll to the last row visible. Side by side: the rate at which Python can merely decode and
   validate the same batches (cgloop.bus.decode), i.e. the ceiling of any sink that decodes in
   Python, and the issue's 1 M rows/s target.
2. Query: `--query-rows` synthetic flow rows generated inside ClickHouse (numbers()) into a
   copy of flow_records, the per-minute roll-up built from them with its view's own SELECT;
   then p99 jitter per flow per minute, from the roll-up (what analysts run) and from the raw
   rows (the peer), against the 1 s target.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repo root, for conftest
N_FLOWS = 1000
PER_MESSAGE = 5000


def _batches(rows: int) -> list[bytes]:
    from cgloop.bus.codec import encode
    from cgloop.contracts.samples import sample_flow_record_batch
    from cgloop.v1.flow_pb2 import FlowRecordBatch

    template = sample_flow_record_batch().records[0]
    out = []
    for start in range(0, rows, PER_MESSAGE):
        batch = FlowRecordBatch()
        for i in range(start, min(start + PER_MESSAGE, rows)):
            r = batch.records.add()
            r.CopyFrom(template)
            r.header.sequence = i
            r.five_tuple.src_port = 1024 + i % N_FLOWS
            r.interval_start_ns = template.interval_start_ns + (i // N_FLOWS) * 1_000_000_000
            r.rtp.jitter_ns = 1_000_000 + (i * 7919) % 5_000_000
        out.append(encode(batch))
    return out


def bench_ingest(rows: int) -> None:
    import clickhouse_connect
    from cgloop.bus.codec import decode
    from cgloop.bus.kafka import BatchProducer
    from cgloop.bus.topics import topic
    from cgloop.config import Settings
    from cgloop.datasets.sink.consumer import Sink, SinkConfig
    from cgloop.datasets.sink.writer import StoreWriter
    from cgloop.datasets.store.migrations import migrate
    from cgloop.stack.stack import Stack
    from cgloop.testing import ROOT, free_port

    print(f"building {rows:,} distinct flow records ...", flush=True)
    payloads = _batches(rows)
    t = topic("cgloop.flows.v1")
    start = time.perf_counter()
    for p in payloads:
        decode(t, p)
    python_rate = rows / (time.perf_counter() - start)

    with tempfile.TemporaryDirectory(ignore_cleanup_errors=True) as tmp:
        settings = Settings(
            state_dir=Path(tmp) / "stack",
            cache_dir=ROOT / ".cache",
            kafka_port=free_port(),
            kafka_controller_port=free_port(),
            store_port=free_port(),
        )
        stack = Stack(settings)
        stack.up()
        try:
            producer = BatchProducer(settings.bootstrap_servers, **{"message.max.bytes": 8 << 20})
            for p in payloads:
                producer.send_raw("cgloop.flows.v1", p, key=str(len(p)))
            producer.flush(120)
            client = clickhouse_connect.get_client(dsn=f"chdb://{tmp}/store")
            migrate(client)
            config = SinkConfig(
                group_id=f"bench-{uuid.uuid4()}", topics=["cgloop.flows.v1"],
                max_chunk_messages=200, max_chunk_age_s=0.5,
            )  # fmt: skip
            sink = Sink(StoreWriter(client), settings.bootstrap_servers, config)
            stop = threading.Event()
            runner = threading.Thread(target=sink.run, args=(stop.is_set,))
            start = time.perf_counter()
            runner.start()
            count = 0
            while count < rows and time.perf_counter() - start < 600:
                time.sleep(0.05)
                count = sink.metrics.rows.labels("flow_ingest")._value.get()
            elapsed = time.perf_counter() - start
            stop.set()
            runner.join()
            stored = client.query("SELECT count() FROM cgloop.flow_records").result_rows[0][0]
        finally:
            stack.down()
    rate = count / elapsed
    print(f"ingest: {int(count):,} flow records Kafka -> chDB in {elapsed:.2f} s "
          f"= {rate:,.0f} rows/s ({stored:,} rows in flow_records)")  # fmt: skip
    print(
        f"  vs Python decode+validate alone ({python_rate:,.0f} rows/s): {rate / python_rate:.2f}x"
    )
    print(f"  vs target 1,000,000 rows/s: {rate / 1e6:.2f}x")


def bench_query(rows: int) -> None:
    import clickhouse_connect
    from cgloop.datasets.store.migrations import migrate

    with tempfile.TemporaryDirectory(ignore_cleanup_errors=True) as tmp:
        client = clickhouse_connect.get_client(dsn=f"chdb://{tmp}")
        migrate(client)
        print(f"generating {rows:,} synthetic flow rows in ClickHouse ...", flush=True)
        start = time.perf_counter()
        # A copy of flow_records without the views, filled from numbers(); the per-minute
        # roll-up is then built from it in one pass with the views' own aggregation, which is
        # what the views would have stored (row-by-row view maintenance is the ingest figure).
        client.command(
            "CREATE TABLE cgloop.bench_flows AS cgloop.flow_records ENGINE = MergeTree"
            " PARTITION BY toDate(interval_start)"
            " ORDER BY (source_id, src_addr, dst_addr, src_port, dst_port, ip_protocol,"
            " interval_start, sequence)"
        )
        client.command(
            "INSERT INTO cgloop.bench_flows (source_id, sequence, src_addr, dst_addr, src_port,"
            " dst_port, ip_protocol, interval_start, interval_end, packets, bytes,"
            " rtp_clock_rate_hz, rtp_jitter_ns)"
            " SELECT 'bench', number, toIPv6('10.0.0.1'), toIPv6('10.0.0.2'),"
            f" toUInt16(1024 + number % {N_FLOWS}), 51000, 17,"
            f" toDateTime64('2025-06-15 00:00:00', 9, 'UTC') + toIntervalSecond(intDiv(number, {N_FLOWS})),"  # noqa: E501
            f" toDateTime64('2025-06-15 00:00:01', 9, 'UTC') + toIntervalSecond(intDiv(number, {N_FLOWS})),"  # noqa: E501
            " 1000, 1200000, 90000, 1000000 + cityHash64(number) % 5000000"
            f" FROM numbers({rows})",
            settings={"max_insert_block_size": 4_000_000},
        )
        view = client.query(
            "SELECT as_select FROM system.tables WHERE database = 'cgloop'"
            " AND name = 'flow_stats_1m_from_flows'"
        ).result_rows[0][0]
        client.command(
            "INSERT INTO cgloop.flow_stats_1m (window, src_addr, dst_addr, src_port, dst_port,"
            " ip_protocol, records, packets, bytes, lost_packets, dropped_packets, latency_ns,"
            " jitter_ns, size_bytes, inter_arrival_ns) "
            + view.replace("cgloop.flow_records", "cgloop.bench_flows")
        )
        print(f"  generated in {time.perf_counter() - start:.1f} s")
        raw_rows = client.query("SELECT count() FROM cgloop.bench_flows").result_rows[0][0]
        rollup = (
            "SELECT count(), max(p99) FROM (SELECT src_port, window,"
            " quantilesTDigestIfMerge(0.5, 0.9, 0.99, 0.999)(jitter_ns)[3] AS p99"
            " FROM cgloop.flow_stats_1m GROUP BY src_addr, dst_addr, src_port, dst_port,"
            " ip_protocol, window)"
        )
        raw = (
            "SELECT count(), max(p99) FROM (SELECT src_port, toStartOfMinute(interval_start) AS m,"
            " quantileTDigest(0.99)(rtp_jitter_ns) AS p99 FROM cgloop.bench_flows"
            " GROUP BY src_addr, dst_addr, src_port, dst_port, ip_protocol, m)"
        )
        timings = {}
        for name, sql in (("roll-up", rollup), ("raw rows", raw)):
            client.query(sql)  # warm
            best = float("inf")
            for _ in range(3):
                start = time.perf_counter()
                groups, _p99 = client.query(sql).result_rows[0]
                best = min(best, time.perf_counter() - start)
            timings[name] = (best, groups)
    print(f"query p99 jitter per flow per minute over {raw_rows:,} flow rows:")
    for name, (best, groups) in timings.items():
        print(f"  from {name}: {best * 1000:,.0f} ms (best of 3), {groups:,} flow-minutes"
              f" -> vs target 1 s: {1 / best:.2f}x")  # fmt: skip
    print(f"  roll-up vs raw rows: {timings['raw rows'][0] / timings['roll-up'][0]:.1f}x faster")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=3_000_000)
    parser.add_argument("--query-rows", type=int, default=50_000_000)
    parser.add_argument("--only", choices=["ingest", "query"])
    args = parser.parse_args()
    if args.only == "ingest":
        bench_ingest(args.rows)
    elif args.only == "query":
        bench_query(args.query_rows)
    else:  # chDB allows one data folder per process: one process per part
        for part in ("ingest", "query"):
            cmd = [sys.executable, __file__, "--only", part, "--rows", str(args.rows)]
            subprocess.run([*cmd, "--query-rows", str(args.query_rows)], check=True)


if __name__ == "__main__":
    main()
