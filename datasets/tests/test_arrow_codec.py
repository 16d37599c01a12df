"""cgloop.arrowcodec against the real store: the same Kafka payloads inserted through the
ProtobufList path (StoreWriter(columnar=False): ClickHouse decodes) and as an Arrow stream
(StoreWriter's default: flows_to_arrow / int_to_arrow + FORMAT ArrowStream) must store identical
rows: for flows in flow_records and the roll-ups (flow_minutes); for INT in the four INT tables
and the roll-ups they feed (flow_stats_1s / flow_stats_1m: latency and drops).

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
from cgloop.arrowcodec import flows_to_arrow, int_to_arrow
from cgloop.contracts.samples import sample_flow_record_batch, sample_int_record_batch
from cgloop.v1 import int_pb2
from cgloop.v1.common_pb2 import DIRECTION_INGRESS
from cgloop.v1.flow_pb2 import FlowRecordBatch
from google.protobuf.internal.encoder import _VarintBytes

FLOW_QUERIES = {
    "flow_records": "SELECT * EXCEPT ingested_at FROM cgloop.flow_records ORDER BY ALL",
    "flow_minutes": "SELECT * FROM cgloop.flow_minutes ORDER BY ALL",
    "ingest_columns": "SELECT name, type FROM system.columns"
    " WHERE database = 'cgloop' AND table = 'flow_ingest' ORDER BY position",
}


_ROLLUP = (
    "SELECT window, src_addr, dst_addr, src_port, dst_port, ip_protocol,"
    " sum(records) AS records, sum(dropped_packets) AS dropped,"
    " quantilesTDigestIfMerge(0.5, 0.9, 0.99, 0.999)(latency_ns) AS latency"
    " FROM cgloop.{t} GROUP BY ALL ORDER BY ALL"
)
INT_QUERIES = {
    **{
        t: f"SELECT * EXCEPT ingested_at FROM cgloop.{t} ORDER BY ALL"
        for t in ("int_hop_records", "int_flow_records", "int_queue_records", "int_drop_records")
    },
    "flow_stats_1s": _ROLLUP.format(t="flow_stats_1s"),
    "flow_stats_1m": _ROLLUP.format(t="flow_stats_1m"),
    "ingest_columns": "SELECT name, type FROM system.columns"
    " WHERE database = 'cgloop' AND table = 'int_ingest' ORDER BY position",
}

V6_SRC = bytes.fromhex("20010db8000000000000000000000001")
V6_DST = bytes.fromhex("20010db80000000000000000000000ff")


def _payloads() -> list[bytes]:
    """Kafka values covering what the decoders could disagree on."""
    sample = sample_flow_record_batch()
    template = sample.records[0]

    # Records missing every optional part. A header with a version and a source id is not
    # optional: the codec refuses a record without (as the strict decoder does).
    bare = FlowRecordBatch()
    only_header = bare.records.add()  # no five-tuple, histograms or RTP
    only_header.header.schema_version = 1
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


def _store_rows(kind: str, path: str, tmp_path: Path, payloads: list[bytes]) -> subprocess.Popen:
    folder = tmp_path / f"{kind}-{path}"
    folder.mkdir()
    for i, p in enumerate(payloads):
        (folder / f"payload-{i:03d}.bin").write_bytes(p)
    return subprocess.Popen(
        [sys.executable, __file__, kind, path, str(folder)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _result(proc: subprocess.Popen) -> dict[str, list[dict]]:
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err[-3000:]
    return json.loads(out)


def _both_paths(
    kind: str, tmp_path: Path, payloads: list[bytes]
) -> tuple[dict[str, list[dict]], dict[str, list[dict]]]:
    """The rows each path stored (ProtobufList, Arrow), the two children run side by side."""
    children = {p: _store_rows(kind, p, tmp_path, payloads) for p in ("protobuf", "arrow")}
    protobuf, arrow = (_result(children[p]) for p in ("protobuf", "arrow"))
    return protobuf, arrow


def _ch_type(t: pa.DataType) -> str:
    """The ClickHouse type an Arrow column of the codec fills."""
    if pa.types.is_list(t):
        return f"Array({_ch_type(t.value_type)})"
    if pa.types.is_struct(t):
        return "Tuple(" + ", ".join(f"{f.name} {_ch_type(f.type)}" for f in t) + ")"
    return {
        pa.uint32(): "UInt32",
        pa.uint64(): "UInt64",
        pa.float64(): "Float64",
        pa.bool_(): "Bool",
        pa.binary(): "String",
        pa.string(): "String",
    }[t]


def _assert_schema_is_the_tables(stream: memoryview, columns: list[dict]) -> None:
    """The stream's columns are the ingest table's (system.columns): names, order, types. A
    migration adding an ingest column (or changing a type) fails here until the codec fills
    it too."""
    schema = pa.ipc.open_stream(stream).schema
    want = [(r["name"], r["type"].replace("LowCardinality(String)", "String")) for r in columns]
    assert [(f.name, _ch_type(f.type)) for f in schema] == want


def test_arrow_path_stores_the_same_rows_as_protobuf(tmp_path: Path) -> None:
    payloads = _payloads()
    protobuf, arrow = _both_paths("flows", tmp_path, payloads)
    n = sum(len(FlowRecordBatch.FromString(p).records) for p in payloads)
    assert len(protobuf["flow_records"]) == n
    assert arrow["flow_records"] == protobuf["flow_records"]
    assert protobuf["flow_minutes"], "the roll-ups got rows"
    assert arrow["flow_minutes"] == protobuf["flow_minutes"]
    _assert_schema_is_the_tables(flows_to_arrow(payloads[:1]), protobuf["ingest_columns"])


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
    record = unknown.records.add()
    record.header.schema_version, record.header.source_id = 1, "s"
    record.direction = 9  # no such Direction: ClickHouse refuses it as well
    with pytest.raises(ValueError, match=r"^payload 1, record 0: direction 9 "):
        flows_to_arrow([good, unknown.SerializeToString()])
    with pytest.raises(TypeError):
        flows_to_arrow([good, "not bytes"])  # type: ignore[list-item]
    # Nearly empty records are refused before their columns are sized (~200x the wire bytes).
    with pytest.raises(ValueError, match=r"^400000 records in 800000 bytes .*nearly empty"):
        flows_to_arrow([b"\x0a\x00" * 400_000])


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


def _int_payloads() -> list[bytes]:
    """Kafka values covering what the decoders could disagree on: every kind, kinds missing
    their nested messages, IPv4 and IPv6, several seconds and minutes."""
    sample = sample_int_record_batch()
    hop, flow, queue, drop = (getattr(r, r.WhichOneof("record")) for r in sample.records)

    bare = int_pb2.IntRecordBatch()  # (a record with no kind at all is refused: not here)
    r = bare.records.add().hop
    r.CopyFrom(hop)
    r.header.sequence = 20
    r.ClearField("hop")  # no IntHop
    r.ClearField("five_tuple")
    r = bare.records.add().flow
    r.CopyFrom(flow)
    r.header.sequence = 21
    r.ClearField("five_tuple")
    r.ClearField("path_switch_ids")
    r.hops.add()  # an empty hop among the others
    r.reason = int_pb2.INT_EVENT_REASON_UNSPECIFIED
    r = bare.records.add().queue
    r.header.schema_version, r.header.source_id = 1, "int-collector-2"  # only a header
    r = bare.records.add().drop
    r.CopyFrom(drop)
    r.header.sequence = 23
    r.ClearField("five_tuple")

    varied = int_pb2.IntRecordBatch()  # IPv6 flows over several seconds and two minutes
    for i in range(8):
        t_ns = flow.header.timestamp_ns + i * 9_000_000_000
        v6 = i % 2 == 1
        f = varied.records.add().flow
        f.CopyFrom(flow)
        f.header.sequence = 100 + i
        f.header.timestamp_ns = t_ns
        f.end_to_end_latency_ns = 1_000 + 350 * i
        f.reason = int_pb2.IntEventReason.values()[i % 8]
        f.hops[0].egress_tx_utilization = 0.125 * i
        if v6:
            f.five_tuple.src_addr, f.five_tuple.dst_addr = V6_SRC, V6_DST
        d = varied.records.add().drop
        d.CopyFrom(drop)
        d.header.sequence = 200 + i
        d.header.timestamp_ns = t_ns + 1
        d.drop_count = 3 + i
        if v6:
            d.five_tuple.src_addr, d.five_tuple.dst_addr = V6_SRC, V6_DST
        h = varied.records.add().hop
        h.CopyFrom(hop)
        h.header.sequence = 300 + i
        h.hop_index = i
        if v6:
            h.five_tuple.src_addr = V6_SRC
        q = varied.records.add().queue
        q.CopyFrom(queue)
        q.header.sequence = 400 + i
        q.congested = i % 3 == 0

    # Two kinds in one record (no producer writes it; both decoders keep both).
    both = int_pb2.IntRecord(hop=hop), int_pb2.IntRecord(drop=drop)  # copies
    both[0].hop.header.sequence, both[1].drop.header.sequence = 30, 31
    both = b"".join(r.SerializeToString() for r in both)
    two = b"\x0a" + _VarintBytes(len(both)) + both
    return [
        sample.SerializeToString(),
        bare.SerializeToString(),
        varied.SerializeToString(),
        two,
    ]


def test_arrow_path_stores_the_same_int_rows_as_protobuf(tmp_path: Path) -> None:
    payloads = _int_payloads()
    protobuf, arrow = _both_paths("int", tmp_path, payloads)
    counts = {"int_hop_records": 11, "int_flow_records": 10, "int_queue_records": 10}
    counts["int_drop_records"] = 11
    for table, n in counts.items():
        assert len(protobuf[table]) == n, table
        assert arrow[table] == protobuf[table], table
    for rollup in ("flow_stats_1s", "flow_stats_1m"):
        rows = protobuf[rollup]
        assert any(r["dropped"] for r in rows) and any(r["records"] == 0 for r in rows), rollup
        assert any(r["latency"][0] > 0 for r in rows), rollup
        assert arrow[rollup] == rows, rollup
    # IPv6 and IPv4 both arrived (and none the default), and the flow hops' tuples (with
    # 0008's elements) of three hops, one empty.
    for table in ("int_flow_records", "int_drop_records"):
        addrs = {r["src_addr"] for r in protobuf[table]}
        assert {"2001:db8::1", "::ffff:198.51.100.7", "::"} <= addrs, table
    hops = [r["hops"] for r in protobuf["int_flow_records"] if len(r["hops"]) == 3]
    assert hops and len(hops[0][2]) == 14 and set(hops[0][2].values()) == {0}
    _assert_schema_is_the_tables(int_to_arrow(payloads[:1]), protobuf["ingest_columns"])


def test_stream_holds_every_kind_in_order() -> None:
    payloads = _int_payloads()
    table = pa.ipc.open_stream(int_to_arrow(payloads)).read_all()
    records = [r for p in payloads for r in int_pb2.IntRecordBatch.FromString(p).records]
    assert table.num_rows == len(records)
    reasons = table.column("flow_reason").to_pylist()
    want = [int_pb2.IntEventReason.Name(r.flow.reason) for r in records]
    assert reasons == want  # INT_EVENT_REASON_UNSPECIFIED where a record is no flow record
    assert table.column("queue_congested").type == pa.bool_()
    empty = pa.ipc.open_stream(int_to_arrow([])).read_all()
    assert empty.num_rows == 0 and empty.schema == table.schema


def test_malformed_int_payload_raises_value_error_naming_its_index() -> None:
    good = sample_int_record_batch().SerializeToString()
    with pytest.raises(
        ValueError, match=r"^payload 2: not a cgloop\.v1\.IntRecordBatch \(record 0\): .+"
    ):
        int_to_arrow([good, good, b"\x0a\x64\x01\x02"])  # field 1 claims 100 bytes, has 2
    # A record whose hop is not an IntHopRecord: prost's reason, naming the field.
    with pytest.raises(ValueError, match=r"^payload 1: .*\(record 4\): .*IntHopRecord"):
        int_to_arrow([good, good + b"\x0a\x04\x0a\x02\x08\xff"])
    unknown = int_pb2.IntRecordBatch()
    flow = unknown.records.add().flow
    flow.header.schema_version, flow.header.source_id = 1, "s"
    flow.reason = 42  # no such IntEventReason: ClickHouse refuses it too
    with pytest.raises(ValueError, match=r"^payload 0, record 0: reason 42 is not"):
        int_to_arrow([unknown.SerializeToString()])
    with pytest.raises(TypeError):
        int_to_arrow([good, "not bytes"])  # type: ignore[list-item]
    with pytest.raises(ValueError, match=r"^400000 records in 800000 bytes .*nearly empty"):
        int_to_arrow([b"\x0a\x00" * 400_000])


def _child(kind: str, path: str, folder: Path) -> None:
    """Insert the folder's payloads of `kind` through one path into a fresh store; print the
    rows."""
    import clickhouse_connect
    from cgloop.datasets.records import KINDS
    from cgloop.datasets.sink.writer import StoreWriter
    from cgloop.datasets.store.migrations import migrate

    topic, codec, queries = {
        "flows": ("cgloop.flows.v1", flows_to_arrow, FLOW_QUERIES),
        "int": ("cgloop.int.v1", int_to_arrow, INT_QUERIES),
    }[kind]
    payloads = [p.read_bytes() for p in sorted(folder.glob("payload-*.bin"))]
    client = clickhouse_connect.get_client(dsn=f"chdb://{folder / 'store'}")
    migrate(client)
    if path == "protobuf":
        # columnar=False: ClickHouse's ProtobufList decoder, not the codec.
        StoreWriter(client, columnar=False).insert(KINDS[topic], payloads, None)
    else:
        # The sink's own path: StoreWriter picks the codec for the topic.
        writer = StoreWriter(client)
        encoded = writer.encode(KINDS[topic], payloads)
        assert encoded.fmt == "ArrowStream"
        assert bytes(encoded.body) == bytes(codec(payloads))
        writer.insert(KINDS[topic], payloads, None, encoded)
    out = {
        name: [
            json.loads(line)
            for line in client.raw_query(sql, fmt="JSONEachRow").decode().splitlines()
        ]
        for name, sql in queries.items()
    }
    print(json.dumps(out))


if __name__ == "__main__":
    _child(sys.argv[1], sys.argv[2], Path(sys.argv[3]))


def _bad_payloads() -> dict[str, list[tuple[str, bytes, bool]]]:
    """topic -> (case, payload, same words): payloads the strict decoder refuses; `same words`
    where the codec's reason is the decoder's own (header, version, source, records)."""
    from cgloop.contracts.samples import SAMPLE_FOR_TOPIC, SAMPLES

    out: dict[str, list[tuple[str, bytes, bool]]] = {}
    probes = SAMPLES[SAMPLE_FOR_TOPIC["cgloop.probes.v1"]]().SerializeToString()
    flows = sample_flow_record_batch()
    anonymous, future, headless = (FlowRecordBatch() for _ in range(3))
    for batch in (anonymous, future, headless):
        batch.CopyFrom(flows)
    anonymous.records[0].header.source_id = ""
    future.records[0].header.schema_version = 99
    headless.records[0].ClearField("header")
    out["cgloop.flows.v1"] = [
        ("empty source_id", anonymous.SerializeToString(), True),
        ("schema_version 99", future.SerializeToString(), True),
        ("no header", headless.SerializeToString(), True),
        ("no records", FlowRecordBatch().SerializeToString(), False),
        ("a probe batch", probes, False),
        ("garbage", b"\xff\xff\xff garbage", False),
        # An unknown field inside a record (field 99 of FlowRecord).
        ("unknown field", _with_unknown(flows), False),
    ]
    ints = sample_int_record_batch()
    anonymous_int, future_int, empty_envelope = (int_pb2.IntRecordBatch() for _ in range(3))
    for batch in (anonymous_int, future_int, empty_envelope):
        batch.CopyFrom(ints)
    anonymous_int.records[1].flow.header.source_id = ""
    future_int.records[3].drop.header.schema_version = 99
    empty_envelope.records.add()
    out["cgloop.int.v1"] = [
        ("empty source_id", anonymous_int.SerializeToString(), True),
        ("schema_version 99", future_int.SerializeToString(), True),
        ("empty envelope", empty_envelope.SerializeToString(), True),
        ("a probe batch", probes, False),
        ("garbage", b"\xff\xff\xff garbage", False),
    ]
    return out


def _with_unknown(batch: FlowRecordBatch) -> bytes:
    """`batch` with field 99 (varint 1) appended to its first record."""
    first = batch.records[0].SerializeToString() + b"\x98\x06\x01"
    rest = b"".join(
        b"\x0a" + _VarintBytes(len(r)) + r
        for r in (x.SerializeToString() for x in batch.records[1:])
    )
    return b"\x0a" + _VarintBytes(len(first)) + first + rest


@pytest.mark.parametrize("topic", ["cgloop.flows.v1", "cgloop.int.v1"])
def test_the_codec_refuses_what_the_strict_decoder_refuses(topic: str) -> None:
    """Sink and consumers must refuse the same messages: the codec (the sink's fast path)
    refuses every payload cgloop.bus.codec.decode_payload refuses, names it by index, and
    for the header checks in the decoder's own words."""
    from cgloop.arrowcodec import PayloadError
    from cgloop.bus.codec import DecodeError, decode_payload
    from cgloop.bus.topics import TOPICS

    encode = {"cgloop.flows.v1": flows_to_arrow, "cgloop.int.v1": int_to_arrow}[topic]
    good = (
        sample_flow_record_batch() if topic == "cgloop.flows.v1" else sample_int_record_batch()
    ).SerializeToString()
    decode_payload(TOPICS[topic], good, 1)
    encode([good], [1])
    for case, payload, same_words in _bad_payloads()[topic]:
        with pytest.raises(DecodeError) as strict:
            decode_payload(TOPICS[topic], payload, 1)
        with pytest.raises(PayloadError) as codec:
            encode([good, payload, good], [1, 1, 1])
        assert codec.value.index == 1, case
        if same_words:
            assert str(codec.value) == f"payload 1: {strict.value}", case
    # The record's version must be its message's header version.
    with pytest.raises(PayloadError, match="disagrees with the cgloop-schema-version header 2"):
        encode([good], [2])
    with pytest.raises(ValueError, match="2 schema_versions for 1 payloads"):
        encode([good], [1, 1])
