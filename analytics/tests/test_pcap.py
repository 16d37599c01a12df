"""Captures → FlowRecords through the probe's pcap twin (cgloop.pcaprecords): conservation, RTP,
ECN, generated packets, bad input. The twin's records equal the probe binary's:
telemetry/tests/test_probe_pcap.py."""

from __future__ import annotations

import gzip
import re
import struct

import pytest
from cgloop.analytics.packets import Packet, records_from_packets, to_pcap
from cgloop.analytics.records import NS, CaptureError, read_capture, records_from_pcap, tuple_key

from .conftest import need_data


def test_records_conserve_packets_and_bytes():
    path = need_data("ndpi-pcaps", "zoom.pcap")
    recs, counters = read_capture(path)
    assert counters["accounted"] > 700
    assert sum(r.packets for r in recs) == counters["accounted"]
    assert counters["records"] == len(recs)
    for r in recs:
        assert r.interval_start_ns <= r.interval_end_ns
        assert sum(r.size_histogram_bytes.buckets) == r.packets
        if not r.packets:
            assert r.is_final  # a flow's idle end is reported by a packet-less final record
            continue
        assert r.size_min_bytes <= r.size_sum_bytes / r.packets <= r.size_max_bytes
        assert r.ecn_not_ect_packets + r.ecn_ect0_packets + r.ecn_ect1_packets + \
            r.ecn_ce_packets == r.packets
    # every flow's last record is final
    last = {}
    for r in recs:
        last[tuple_key(r.five_tuple)] = r
    assert all(r.is_final for r in last.values())


def test_l4s_capture_ecn_counts_match_the_published_figures():
    recs = records_from_pcap(need_data("l4s-tests", "skype_bi_dualpi2_l.pcap.gz"))
    up = [r for r in recs if r.five_tuple.src_port == 63236 and r.five_tuple.dst_port == 3480]
    # data/README: 6 657 ECT(1) and 3 790 CE packets upstream
    assert sum(r.ecn_ect1_packets for r in up) == 6657
    assert sum(r.ecn_ce_packets for r in up) == 3790


def test_rtp_stream_recognised_with_clock_and_markers():
    recs = records_from_pcap(need_data("ndpi-pcaps", "rtp.pcapng"))
    rtp = [r for r in recs if r.HasField("rtp") and r.rtp.payload_type == 34]
    assert rtp, "the H.263 stream (PT 34) in nDPI's rtp.pcapng was not recognised"
    assert {r.rtp.clock_rate_hz for r in rtp} == {90_000}
    assert sum(r.rtp.marker_packets for r in rtp) > 0


def test_bytes_and_file_give_the_same_records(tmp_path):
    path = need_data("ndpi-pcaps", "zoom.pcap")
    from_file = records_from_pcap(path, source_id="x")
    from_bytes = records_from_pcap(path.read_bytes(), source_id="x")
    assert [r.SerializeToString() for r in from_file] == [
        r.SerializeToString() for r in from_bytes
    ]


def test_not_a_pcap_is_a_clear_error(tmp_path):
    bad = tmp_path / "notes.pcap"
    bad.write_text("hello, not a capture\n" * 10)
    with pytest.raises(ValueError, match="not a pcap"):
        records_from_pcap(bad)
    with pytest.raises(OSError, match=r"missing\.pcap"):
        records_from_pcap(tmp_path / "missing.pcap")


def _udp(i: int) -> Packet:
    return Packet(ts_ns=(1_700_000_000 + i) * NS + 250_000_000,
                  key=(b"\x0a\0\0\x01", b"\x0a\0\0\x02", 1000 + i, 2000, 17), length=68)


def test_generated_packets_keep_their_size_time_tos_and_rtp():
    key = (b"\x0a\0\0\x01", b"\x0a\0\0\x02", 5004, 6000, 17)
    pkts = [
        Packet(ts_ns=NS + i * 10_000_000, key=key, length=1200, ecn=1, dscp=46, rtp_ssrc=7,
               rtp_pt=96, rtp_seq=i, rtp_ts=i * 900, rtp_marker=i % 3 == 0)
        for i in range(40)
    ]
    recs = records_from_packets(pkts, "test/gen")
    assert sum(r.packets for r in recs) == 40
    assert sum(r.bytes for r in recs) == 40 * 1200
    assert {r.last_dscp for r in recs} == {46}
    assert sum(r.ecn_ect1_packets for r in recs) == 40
    assert recs[0].interval_start_ns >= NS
    assert {r.header.source_id for r in recs} == {"test/gen"}
    rtp = [r for r in recs if r.HasField("rtp")]
    assert rtp and {r.rtp.ssrc for r in rtp} == {7}
    # TCP and IPv6 too; a size below the headers is raised to them
    v6 = (bytes(15) + b"\1", bytes(15) + b"\2", 443, 50000, 6)
    recs = records_from_packets([Packet(ts_ns=NS, key=v6, length=10, tcp_flags=0x12)], "t")
    assert (recs[0].size_max_bytes, recs[0].tcp_flags_seen) == (60, 0x12)


def capture(packets: list[Packet], snaplen: int = 65535) -> bytes:
    """A classic little-endian µs pcap (link type 101) of 68-byte packets, one per second."""
    nano = to_pcap(packets)
    out = struct.pack("<IHHiIII", 0xA1B2C3D4, 2, 4, 0, 0, snaplen, 101)
    at = 24
    for i in range(len(packets)):
        _, _, incl, _ = struct.unpack_from("<IIII", nano, at)
        head = nano[at + 16 : at + 16 + incl]
        pkt = head + b"x" * (68 - incl)  # the whole packet captured
        out += struct.pack("<IIII", 1_700_000_000 + i, 250_000, 68, 68) + pkt
        at += 16 + incl
    return out


def test_exact_timestamps_from_a_sound_capture():
    recs = records_from_pcap(capture([_udp(0), _udp(1), _udp(2)]), interval_ns=0)
    assert sorted(r.first_seen_ns for r in recs) == [
        (1_700_000_000 + i) * NS + 250_000_000 for i in range(3)
    ]


# (damage, what the error must say, packet, offset); records 16 + 68 bytes, header 24.
DAMAGE = [
    (lambda b: b + b"\0" * 7, "packet 4 at byte offset 276: truncated record header (7 of 16",
     4, 276),
    (lambda b: b[:-30], "packet 3 at byte offset 192: truncated record: 68 bytes announced, 38 "
     "left in the file", 3, 192),
    (lambda b: b[:16] + struct.pack("<I", 60) + b[20:], "packet 1 at byte offset 24: record "
     "length 68 is beyond the snaplen 60", 1, 24),
    (lambda b: b[:24 + 8] + struct.pack("<I", 1 << 30) + b[36:], "packet 1 at byte offset 24: "
     "record length 1073741824 is beyond the snaplen 65535", 1, 24),
]


@pytest.mark.parametrize(("damage", "message", "packet", "offset"), DAMAGE)
def test_a_damaged_capture_is_refused_with_the_packet_and_offset(
    tmp_path, damage, message, packet, offset
):
    bad = tmp_path / "bad.pcap"
    bad.write_bytes(damage(capture([_udp(0), _udp(1), _udp(2)])))
    with pytest.raises(CaptureError) as refused:
        records_from_pcap(bad)
    assert message in str(refused.value)
    assert str(refused.value).startswith(f"{bad}: ")
    assert (refused.value.packet, refused.value.offset) == (packet, offset)
    assert isinstance(refused.value, ValueError)


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda b: b"\xde\xad\xbe\xef" + b[4:], "not a pcap or pcapng file"),
        (lambda b: b[:10], "truncated pcap header (10 of 24 bytes)"),
        (lambda b: gzip.compress(b)[:-12],
         "damaged or unreadable capture near uncompressed byte offset"),
    ],
)
def test_what_is_no_capture_is_refused(damage, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        records_from_pcap(damage(capture([_udp(0), _udp(1), _udp(2)])))


def _pcapng(packets: list[bytes]) -> bytes:
    """Section header, one raw-IP interface, one enhanced packet block per packet (µs)."""
    def block(kind: int, body: bytes) -> bytes:
        body += b"\0" * (-len(body) % 4)
        n = len(body) + 12
        return struct.pack("<II", kind, n) + body + struct.pack("<I", n)

    out = block(0x0A0D0D0A, struct.pack("<IHHq", 0x1A2B3C4D, 1, 0, -1))
    out += block(1, struct.pack("<HHI", 101, 0, 65535))
    for i, p in enumerate(packets):
        ts = (1 + i) * 1_000_000
        out += block(6, struct.pack("<IIIII", 0, ts >> 32, ts & 0xFFFFFFFF, len(p), len(p)) + p)
    return out


def test_a_truncated_pcapng_block_is_refused():
    frames = capture([_udp(0), _udp(1), _udp(2)])
    pkts = [frames[24 + i * 84 + 16 : 24 + (i + 1) * 84] for i in range(3)]
    good = _pcapng(pkts)
    assert sum(r.packets for r in records_from_pcap(good)) == 3
    with pytest.raises(CaptureError, match=r"packet 3 at byte offset \d+: truncated pcapng"):
        records_from_pcap(good[:-5])


def test_a_real_capture_cut_mid_packet_is_refused(tmp_path):
    raw = gzip.decompress(need_data("l4s-tests", "prague_dualpi2_wifi.pcap.gz").read_bytes())
    cut = tmp_path / "cut.pcap"
    cut.write_bytes(raw[: len(raw) // 50 + 37])  # ends mid-packet
    with pytest.raises(CaptureError, match=r"packet \d+ at byte offset \d+: truncated record"):
        records_from_pcap(cut)
