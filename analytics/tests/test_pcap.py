"""Packets → FlowRecords: conservation, RTP, ECN, bad input."""

from __future__ import annotations

import gzip

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


def test_truncated_capture_keeps_the_good_packets(tmp_path):
    raw = gzip.decompress(need_data("l4s-tests", "prague_dualpi2_wifi.pcap.gz").read_bytes())
    cut = tmp_path / "cut.pcap"
    cut.write_bytes(raw[: len(raw) // 50 + 37])  # ends mid-packet
    recs = records_from_pcap(cut)
    assert sum(r.packets for r in recs) > 500
