"""Packets → FlowRecords: conservation, RTP, ECN, bad input."""

from __future__ import annotations

import gzip
import io
import struct

import dpkt
import pytest
from cgloop.analytics.pcap import PcapError, PcapStats, packets_from_pcap, records_from_pcap
from cgloop.analytics.records import NS, tuple_key

from .conftest import need_data


def test_records_conserve_packets_and_bytes():
    path = need_data("ndpi-pcaps", "zoom.pcap")
    stats = PcapStats()
    recs = records_from_pcap(path, stats=stats)
    pkts = list(packets_from_pcap(path))
    assert stats.parsed == len(pkts) > 700
    assert sum(r.packets for r in recs) == len(pkts)
    assert sum(r.bytes for r in recs) == sum(p.length for p in pkts)
    for r in recs:
        assert r.interval_end_ns - r.interval_start_ns == NS // 10
        assert r.interval_start_ns <= r.last_seen_ns < r.interval_end_ns
        assert sum(r.size_histogram_bytes.buckets) == r.packets
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


def test_not_a_pcap_is_a_clear_error(tmp_path):
    bad = tmp_path / "notes.pcap"
    bad.write_text("hello, not a capture\n" * 10)
    with pytest.raises(PcapError, match="not a pcap"):
        records_from_pcap(bad)
    with pytest.raises(PcapError, match="no such file"):
        records_from_pcap(tmp_path / "missing.pcap")


def _udp(i: int, payload: int = 40) -> bytes:
    ip = dpkt.ip.IP(src=b"\x0a\0\0\x01", dst=b"\x0a\0\0\x02", p=17,
                    data=dpkt.udp.UDP(sport=1000 + i, dport=2000, data=b"x" * payload))
    ip.len = len(bytes(ip))
    return bytes(ip)


def capture(packets: list[bytes], snaplen: int = 65535) -> bytes:
    """A classic little-endian µs pcap of raw IPv4 packets (link type 101), one per second."""
    out = struct.pack("<IHHiIII", 0xA1B2C3D4, 2, 4, 0, 0, snaplen, 101)
    for i, pkt in enumerate(packets):
        out += struct.pack("<IIII", 1_700_000_000 + i, 250_000, len(pkt), len(pkt)) + pkt
    return out


def test_exact_timestamps_from_a_sound_capture(tmp_path):
    good = tmp_path / "good.pcap"
    good.write_bytes(capture([_udp(0), _udp(1), _udp(2)]))
    pkts = list(packets_from_pcap(good))
    assert [p.ts_ns for p in pkts] == [
        (1_700_000_000 + i) * NS + 250_000_000 for i in range(3)
    ]


# (damage, what the error must say); packets are 68 bytes, records 16 + 68, header 24.
DAMAGE = [
    (lambda b: b + b"\0" * 7, "packet 4 at byte offset 276: truncated record header (7 of 16"),
    (lambda b: b[:-30], "packet 3 at byte offset 192: truncated record: 68 bytes announced, 38 "
     "left in the file"),
    (lambda b: b[:16] + struct.pack("<I", 60) + b[20:], "packet 1 at byte offset 24: record "
     "length 68 is beyond the snaplen 60"),
    (lambda b: b[:24 + 8] + struct.pack("<I", 1 << 30) + b[36:], "packet 1 at byte offset 24: "
     "record length 1073741824 is beyond the snaplen 65535"),
    (lambda b: b"\xde\xad\xbe\xef" + b[4:], "not a pcap or pcapng file (starts with deadbeef)"),
    (lambda b: b[:10], "not a pcap or pcapng file"),
    (lambda b: gzip.compress(b)[:-12], "damaged or unreadable capture near uncompressed byte"),
]


@pytest.mark.parametrize(("damage", "message"), DAMAGE)
def test_a_damaged_capture_is_refused_with_the_packet_and_offset(tmp_path, damage, message):
    bad = tmp_path / "bad.pcap"
    bad.write_bytes(damage(capture([_udp(0), _udp(1), _udp(2)])))
    with pytest.raises(PcapError) as refused:
        records_from_pcap(bad)
    assert message in str(refused.value)
    assert str(refused.value).startswith(f"{bad}: ")


def test_a_truncated_pcapng_block_is_refused(tmp_path):
    buf = io.BytesIO()
    writer = dpkt.pcapng.Writer(buf, linktype=101)
    for i in range(3):
        writer.writepkt(_udp(i), ts=1.0 + i)
    bad = tmp_path / "cut.pcapng"
    bad.write_bytes(buf.getvalue()[:-5])
    with pytest.raises(PcapError, match=r"packet 3 at byte offset \d+: bad pcapng block"):
        records_from_pcap(bad)


def test_a_real_capture_cut_mid_packet_is_refused(tmp_path):
    raw = gzip.decompress(need_data("l4s-tests", "prague_dualpi2_wifi.pcap.gz").read_bytes())
    cut = tmp_path / "cut.pcap"
    cut.write_bytes(raw[: len(raw) // 50 + 37])  # ends mid-packet
    with pytest.raises(PcapError, match=r"packet \d+ at byte offset \d+: truncated record"):
        records_from_pcap(cut)
