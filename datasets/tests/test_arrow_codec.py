"""cgloop.arrowcodec against the real store: the same Kafka payloads inserted through today's
ProtobufList path (StoreWriter) and as an Arrow stream (flows_to_arrow + FORMAT ArrowStream)
must store identical rows in flow_records and identical roll-ups (flow_minutes).

chDB opens one data folder per process, so each path runs in a child process of its own
(this file run as a script) on a fresh, migrated store; both run side by side."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import pyarrow as pa
import pytest
from cgloop.arrowcodec import flows_to_arrow
from cgloop.contracts.samples import sample_flow_record_batch
from cgloop.v1.common_pb2 import DIRECTION_INGRESS
from cgloop.v1.flow_pb2 import FlowRecordBatch

QUERIES = {
    "flow_records": "SELECT * EXCEPT ingested_at FROM cgloop.flow_records ORDER BY ALL",
    "flow_minutes": "SELECT * FROM cgloop.flow_minutes ORDER BY ALL",
    "ingest_columns": "SELECT name FROM system.columns"
    " WHERE database = 'cgloop' AND table = 'flow_ingest' ORDER BY position",
}


def _payloads() -> list[bytes]:
    """Kafka values covering what the decoders could disagree on."""
    sample = sample_flow_record_batch()
    template = sample.records[0]

    bare = FlowRecordBatch()  # records missing every optional part
    bare.records.add()  # nothing at all: no header, five-tuple, histograms or RTP
    only_header = bare.records.add()
    only_header.header.source_id = "node-b/flow-probe"
    only_header.header.sequence = 7
    only_header.packets = 1
    no_rtp = bare.records.add()
    no_rtp.CopyFrom(template)
    no_rtp.ClearField("rtp")
    no_rtp.ClearField("inter_arrival_histogram_ns")
    no_rtp.header.sequence = 8

    varied = FlowRecordBatch()  # IPv6, empty histograms, another direction, a few minutes
    for i in range(6):
        r = varied.records.add()
        r.CopyFrom(template)
        r.header.sequence = 100 + i
        r.interval_start_ns = template.interval_start_ns + i * 20_000_000_000
        r.rtp.jitter_ns = 1_000_000 + i * 250_000
        if i % 2:
            r.five_tuple.src_addr = bytes.fromhex("20010db8000000000000000000000001")
            r.five_tuple.dst_addr = bytes.fromhex("20010db80000000000000000000000ff")
            r.direction = DIRECTION_INGRESS
            r.interface_name = "veth-gw1-ü"
        if i % 3 == 0:
            r.size_histogram_bytes.Clear()
            r.size_histogram_bytes.SetInParent()  # present but empty
            r.inter_arrival_histogram_ns.Clear()
        r.is_final = i == 5
    return [sample.SerializeToString(), bare.SerializeToString(), varied.SerializeToString()]


def _store_rows(path: str, tmp_path: Path, payloads: list[bytes]) -> subprocess.Popen:
    folder = tmp_path / path
    folder.mkdir()
    for i, p in enumerate(payloads):
        (folder / f"payload-{i:03d}.bin").write_bytes(p)
    return subprocess.Popen(
        [sys.executable, __file__, path, str(folder)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _result(proc: subprocess.Popen) -> dict[str, list[dict]]:
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err[-3000:]
    return json.loads(out)


def test_arrow_path_stores_the_same_rows_as_protobuf(tmp_path: Path) -> None:
    payloads = _payloads()
    children = {p: _store_rows(p, tmp_path, payloads) for p in ("protobuf", "arrow")}
    protobuf, arrow = (_result(children[p]) for p in ("protobuf", "arrow"))
    n = sum(len(FlowRecordBatch.FromString(p).records) for p in payloads)
    assert len(protobuf["flow_records"]) == n
    assert arrow["flow_records"] == protobuf["flow_records"]
    assert protobuf["flow_minutes"], "the roll-ups got rows"
    assert arrow["flow_minutes"] == protobuf["flow_minutes"]
    # A migration adding an ingest column fails here until the codec fills it too.
    schema = pa.ipc.open_stream(flows_to_arrow(payloads[:1])).schema
    assert schema.names == [r["name"] for r in protobuf["ingest_columns"]]


def test_stream_holds_all_payloads_in_order() -> None:
    payloads = _payloads()
    table = pa.ipc.open_stream(flows_to_arrow(payloads)).read_all()
    want = [r.header.sequence for p in payloads for r in FlowRecordBatch.FromString(p).records]
    assert table.column("header_sequence").to_pylist() == want
    assert table.column("five_tuple_src_addr").type == pa.binary()
    assert table.column("size_histogram_bytes_buckets").type.value_type == pa.uint64()
    empty = pa.ipc.open_stream(flows_to_arrow([])).read_all()
    assert empty.num_rows == 0 and empty.schema == table.schema


def test_stream_is_a_read_only_buffer_later_calls_leave_alone(tmp_path: Path) -> None:
    """The stream is a memoryview over Rust-owned memory that goes back to a pool when
    released: a stream still held must never be reused or changed by later calls."""
    payloads = _payloads()
    first = flows_to_arrow(payloads)
    kept = bytes(first)
    assert isinstance(first, memoryview) and first.readonly and len(first) == len(kept)
    for n in (1, 2, 1, 2):  # fewer payloads: other streams
        other = flows_to_arrow(payloads[:n])
        assert bytes(other) != kept
        del other  # back to the pool, for the next call
    assert bytes(first) == kept
    with pytest.raises(TypeError):
        first[0] = 0
    (tmp_path / "stream.arrow").write_bytes(first)
    assert (tmp_path / "stream.arrow").read_bytes() == kept


def test_malformed_payload_raises_value_error_naming_its_index() -> None:
    good = sample_flow_record_batch().SerializeToString()
    with pytest.raises(
        ValueError, match=r"^payload 2: not a cgloop\.v1\.FlowRecordBatch \(record 0\): .+"
    ):
        flows_to_arrow([good, good, b"\x0a\x64\x01\x02"])  # field 1 claims 100 bytes, has 2
    unknown = FlowRecordBatch()
    unknown.records.add().direction = 9  # no such Direction: ClickHouse refuses it as well
    with pytest.raises(ValueError, match=r"^payload 1, record 0: direction 9 "):
        flows_to_arrow([good, unknown.SerializeToString()])
    with pytest.raises(TypeError):
        flows_to_arrow([good, "not bytes"])  # type: ignore[list-item]


def test_decode_releases_the_gil() -> None:
    """Another Python thread runs while flows_to_arrow decodes and writes the stream (only
    wrapping the finished stream holds the GIL): a call holding it would let no tick in."""
    payloads = _payloads()
    big = FlowRecordBatch()
    for p in payloads:
        big.MergeFromString(p)
    chunk = [big.SerializeToString()] * 20_000  # 200 000 rows: a fraction of a second
    window: list[float] = []

    def convert() -> None:
        window.append(time.perf_counter())
        flows_to_arrow(chunk)
        window.append(time.perf_counter())

    ticks: list[float] = []
    worker = threading.Thread(target=convert)
    worker.start()
    while worker.is_alive():
        ticks.append(time.perf_counter())
        time.sleep(0)  # yield: with the GIL held elsewhere, this thread waits here
    worker.join()
    start, end = window
    # The second quarter: clear of a thread switch just before the call (5 ms) and of its
    # end.
    d = end - start
    inside = [t for t in ticks if start + d / 4 < t < start + d / 2]
    assert inside, f"no tick in the second quarter of a {d:.3f} s call"


def _child(path: str, folder: Path) -> None:
    """Insert the folder's payloads through one path into a fresh store; print the rows."""
    import clickhouse_connect
    from cgloop.datasets.records import KINDS
    from cgloop.datasets.sink.writer import StoreWriter
    from cgloop.datasets.store.migrations import migrate

    payloads = [p.read_bytes() for p in sorted(folder.glob("payload-*.bin"))]
    client = clickhouse_connect.get_client(dsn=f"chdb://{folder / 'store'}")
    migrate(client)
    if path == "protobuf":
        # columnar=False: ClickHouse's ProtobufList decoder, not the codec (StoreWriter's default).
        StoreWriter(client, columnar=False).insert(KINDS["cgloop.flows.v1"], payloads, None)
    else:
        stream = flows_to_arrow(payloads)
        names = pa.ipc.open_stream(stream).schema.names
        client.raw_insert("cgloop.flow_ingest", names, insert_block=stream, fmt="ArrowStream")
    out = {
        name: [
            json.loads(line)
            for line in client.raw_query(sql, fmt="JSONEachRow").decode().splitlines()
        ]
        for name, sql in QUERIES.items()
    }
    print(json.dumps(out))


if __name__ == "__main__":
    _child(sys.argv[1], Path(sys.argv[2]))
