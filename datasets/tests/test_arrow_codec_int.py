"""cgloop.arrowcodec.int_to_arrow against the real store: the same INT Kafka payloads inserted
through the ProtobufList path (StoreWriter(columnar=False)) and as an Arrow stream
(StoreWriter's default: int_to_arrow + FORMAT ArrowStream) must store identical rows in the
four INT tables and identical roll-ups (flow_stats_1s / flow_stats_1m: latency and drops).

chDB opens one data folder per process, so each path runs in a child process of its own
(this file run as a script) on a fresh, migrated store; both run side by side."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest
from cgloop.arrowcodec import int_to_arrow
from cgloop.contracts.samples import sample_int_record_batch
from cgloop.v1 import int_pb2
from google.protobuf.internal.encoder import _VarintBytes

_ROLLUP = (
    "SELECT window, src_addr, dst_addr, src_port, dst_port, ip_protocol,"
    " sum(records) AS records, sum(dropped_packets) AS dropped,"
    " quantilesTDigestIfMerge(0.5, 0.9, 0.99, 0.999)(latency_ns) AS latency"
    " FROM cgloop.{t} GROUP BY ALL ORDER BY ALL"
)
QUERIES = {
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
    """Kafka values covering what the decoders could disagree on: every kind, kinds missing
    their nested messages, an empty record, IPv4 and IPv6, several seconds and minutes."""
    sample = sample_int_record_batch()
    hop, flow, queue, drop = (getattr(r, r.WhichOneof("record")) for r in sample.records)

    bare = int_pb2.IntRecordBatch()
    bare.records.add()  # no kind at all: a row of defaults, in no table
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
    r.header.source_id = "int-collector-2"  # only a header
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


def test_arrow_path_stores_the_same_int_rows_as_protobuf(tmp_path: Path) -> None:
    payloads = _payloads()
    children = {p: _store_rows(p, tmp_path, payloads) for p in ("protobuf", "arrow")}
    protobuf, arrow = (_result(children[p]) for p in ("protobuf", "arrow"))
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
    # A migration adding an ingest column (or changing a type) fails here until the codec
    # fills it too.
    schema = pa.ipc.open_stream(int_to_arrow(payloads[:1])).schema
    want = [
        (r["name"], r["type"].replace("LowCardinality(String)", "String"))
        for r in protobuf["ingest_columns"]
    ]
    assert [(f.name, _ch_type(f.type)) for f in schema] == want


def test_stream_holds_every_kind_in_order() -> None:
    payloads = _payloads()
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
    with pytest.raises(ValueError, match=r"^payload 1: .*\(record 1\): .*IntHopRecord"):
        int_to_arrow([good, b"\x0a\x00" + b"\x0a\x04\x0a\x02\x08\xff"])
    unknown = int_pb2.IntRecordBatch()
    unknown.records.add().flow.reason = 42  # no such IntEventReason: ClickHouse refuses it too
    with pytest.raises(ValueError, match=r"^payload 0, record 0: reason 42 is not"):
        int_to_arrow([unknown.SerializeToString()])
    with pytest.raises(TypeError):
        int_to_arrow([good, "not bytes"])  # type: ignore[list-item]


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
        # columnar=False: ClickHouse's ProtobufList decoder, not the codec.
        StoreWriter(client, columnar=False).insert(KINDS["cgloop.int.v1"], payloads, None)
    else:
        # The sink's own path: StoreWriter picks the codec for the INT topic.
        writer = StoreWriter(client)
        encoded = writer.encode(KINDS["cgloop.int.v1"], payloads)
        assert encoded.fmt == "ArrowStream"
        assert bytes(encoded.body) == bytes(int_to_arrow(payloads))
        writer.insert(KINDS["cgloop.int.v1"], payloads, None, encoded)
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
