"""Detectors fire on planted episodes, stay silent on clean traffic, and separate the real L4S
captures."""

from __future__ import annotations

import csv

import pytest
from cgloop.analytics.detectors import L4sAbuseDetector, QueueOverloadDetector, SloDetector
from cgloop.analytics.features import conversations, split_directions
from cgloop.analytics.records import NS, records_from_pcap
from cgloop.analytics.synthetic import Degradation, gaming_records
from cgloop.testing import data_missing
from cgloop.v1.common_pb2 import RecordHeader
from cgloop.v1.detection_pb2 import DetectionKind as K
from cgloop.v1.int_pb2 import IntQueueRecord
from cgloop.v1.node_pb2 import CoreSample, NodeSample

from .conftest import DATA, need_data


def _slo_run(platform, degradations=(), seconds=30.0, seed=3):
    recs = gaming_records(platform, seconds, seed=seed, degradations=degradations)
    det = SloDetector()
    down, up = split_directions(recs)
    det.watch(down[0].five_tuple, platform, down=True)
    det.watch(up[0].five_tuple, platform, down=False)
    out = [d for r in recs for d in det.on_flow(r)]
    t0 = min(r.interval_start_ns for r in recs)
    return out, t0


@pytest.mark.parametrize(
    ("deg", "kind"),
    [
        (Degradation(10, 20, jitter_ms=15), K.DETECTION_KIND_SLO_JITTER),
        (Degradation(10, 20, loss=0.2), K.DETECTION_KIND_SLO_LOSS),
        (Degradation(10, 20, rate_cap_mbps=5), K.DETECTION_KIND_SLO_THROUGHPUT),
    ],
)
def test_slo_fires_once_on_a_planted_episode_with_evidence(deg, kind):
    out, t0 = _slo_run("gfn", (deg,))
    hits = [d for d in out if d.kind == kind]
    assert len(hits) == 1, out
    d = hits[0]
    start_s = (d.window_start_ns - t0) / NS
    assert 10 <= start_s <= 12  # detected within ~2 s of the episode start
    assert (d.window_end_ns - d.window_start_ns) / NS >= 1.0  # the minimum duration held
    names = {e.name for e in d.evidence}
    assert {"cusum", "duration_s"} <= names and d.evidence[0].threshold > 0
    assert d.labels["platform"] == "gfn" and 0 < d.confidence <= 1


@pytest.mark.parametrize("platform", ["gfn", "std", "psn", "xc"])
def test_slo_silent_on_clean_sessions_and_single_spikes(platform):
    out, _ = _slo_run(platform, seconds=40)
    assert out == []
    spike = (Degradation(15, 15.2, jitter_ms=40, loss=0.5),)  # 200 ms burst of trouble
    out, _ = _slo_run(platform, spike, seconds=30, seed=4)
    assert out == []


def test_slo_false_alarms_on_clean_real_calls():
    """Real RTP calls (Skype 73 s, Teams, Discord, Telegram) treated as Xbox-profile gaming
    flows: no SLO detection. (The WhatsApp video call is excluded on purpose: its RFC 3550
    jitter reaches ~50 ms, a true breach of a 5 ms objective.)"""
    files = [
        DATA / "l4s-tests" / "skype_bi_dualpi2_l.pcap.gz",
        DATA / "ndpi-pcaps" / "teams.pcap",
        DATA / "ndpi-pcaps" / "discord.pcap",
        DATA / "ndpi-pcaps" / "telegram_videocall.pcapng",
    ]
    seconds, alarms = 0.0, []
    for f in files:
        if not f.exists():
            data_missing(f"real capture {f.name}")
        for rs in conversations(records_from_pcap(f)).values():
            if not any(r.HasField("rtp") for r in rs):
                continue
            det = SloDetector()
            down, up = split_directions(rs)
            det.watch(down[0].five_tuple, "xc", down=False)  # no throughput SLO for calls
            if up:
                det.watch(up[0].five_tuple, "xc", down=False)
            alarms += [d for r in rs for d in det.on_flow(r)]
            seconds += (rs[-1].interval_end_ns - rs[0].interval_start_ns) / NS
    assert seconds > 80
    assert alarms == []


def _l4s(name):
    det = L4sAbuseDetector()
    return [d for r in records_from_pcap(need_data("l4s-tests", name)) for d in det.on_flow(r)]


def test_l4s_abuse_separates_skype_from_prague_and_cubic():
    skype = _l4s("skype_bi_dualpi2_l.pcap.gz")
    kinds = [d.kind for d in skype]
    assert kinds.count(K.DETECTION_KIND_L4S_UNRESPONSIVE_ECN) == 1
    d = next(d for d in skype if d.kind == K.DETECTION_KIND_L4S_UNRESPONSIVE_ECN)
    assert (d.flow.src_port, d.flow.dst_port) == (63236, 3480)  # Skype's upstream in L
    ev = {e.name: e for e in d.evidence}
    assert ev["ce_fraction"].value >= ev["ce_fraction"].threshold
    assert ev["l_queue_share"].value >= 0.9
    # the fast verdict (issue 21): within 500 ms of the flow's first packet, over 4 x 100 ms
    first = min(r.interval_start_ns for r in records_from_pcap(need_data(
        "l4s-tests", "skype_bi_dualpi2_l.pcap.gz")) if r.five_tuple == d.flow)
    assert ev["decision_s"].value <= 0.5 and ev["decision_s"].threshold == pytest.approx(0.4)
    assert d.window_end_ns - first <= NS // 2
    assert _l4s("prague_dualpi2_wifi.pcap.gz") == []
    assert _l4s("cubic_dualpi2_wifi.pcap.gz") == []


def test_l4s_abuse_is_silent_on_every_ndpi_capture():
    """Calls, video, games and P2P of nDPI's captures (none of them in the L queue): the fast
    verdict raises nothing either."""
    pcaps = sorted(p for p in need_data("ndpi-pcaps").glob("*.pcap*") if p.suffix != ".out")
    assert len(pcaps) >= 39  # 16 before issue 21, 23 added with it
    for p in pcaps:
        det = L4sAbuseDetector()
        assert [d for r in records_from_pcap(p) for d in det.on_flow(r)] == [], p.name


def test_l4s_microbursts_in_the_l_queue():
    from cgloop.v1.common_pb2 import FiveTuple
    from cgloop.v1.flow_pb2 import FlowRecord

    det = L4sAbuseDetector()
    ft = FiveTuple(src_addr=b"\x0a\0\0\1", dst_addr=b"\x0a\0\0\2", src_port=1, dst_port=2,
                   ip_protocol=17)
    out = []
    for i in range(80):  # 8 s of ECT(1) traffic, a 30-packet burst every 100 ms, no CE
        t = 10 * NS + i * NS // 10
        out += det.on_flow(FlowRecord(five_tuple=ft, interval_start_ns=t,
                                      interval_end_ns=t + NS // 10, packets=30, bytes=30_000,
                                      ecn_ect1_packets=30, max_burst_packets=30))
    assert [d.kind for d in out] == [K.DETECTION_KIND_L4S_MICROBURST]


def _queue(t_ns, util, latency_ns=0):
    return IntQueueRecord(header=RecordHeader(timestamp_ns=t_ns, source_id="s", sequence=1),
                          switch_id=7, egress_port=3, queue_id=0, egress_tx_utilization=util,
                          queue_latency_ns=latency_ns)


def test_overload_predicted_before_rho_reaches_one():
    det = QueueOverloadDetector()
    out, fired_at = [], None
    for i in range(60):  # utilisation ramps 0.5 → 1.0 over 3 s, then stays saturated
        rho = 0.5 + 0.5 * i / 30
        got = det.on_int_queue(_queue(i * NS // 10, min(rho, 1.0)))
        if got and fired_at is None:
            fired_at = rho
        out += got
    assert len(out) == 1 and out[0].kind == K.DETECTION_KIND_QUEUE_CONGESTION
    assert fired_at is not None and fired_at < 0.9  # ahead of time, from the trend
    assert out[0].labels["trigger"] == "trend"


def test_overload_silent_on_steady_load_and_node_overload_fires():
    det = QueueOverloadDetector()
    assert [d for i in range(100) for d in det.on_int_queue(_queue(i * NS // 10, 0.6))] == []
    out = []
    for i in range(30):
        n = NodeSample(header=RecordHeader(timestamp_ns=i * NS // 5, source_id="n", sequence=i),
                       node_id="node-a", cores=[CoreSample(core=0, utilization=0.97)])
        out += det.on_node(n)
    assert [d.kind for d in out] == [K.DETECTION_KIND_NODE_OVERLOAD]
    assert out[0].node_id == "node-a"


def test_queue_detector_on_real_xbox_queue_telemetry():
    """Real BMv2 INT of the Xbox sessions (queue depth and dequeue delay, ~2 samples/s). The
    software switch does queue (p99 dequeue delay ~28 ms), so detections are expected; what
    must hold: no isolated spike fires, every detection rests on a rise held for >= 0.5 s,
    and one sustained run fires at most once."""
    import numpy as np

    files = sorted(need_data("xbox-cloud-gaming").glob("*/*/*/INT data/*.csv"))
    samples, detections, spikes, runs = 0, 0, 0, 0
    for n, f in enumerate(files):
        for port, side in ((1, "downlink"), (2, "uplink")):
            det = QueueOverloadDetector()
            series = []
            with f.open(newline="") as fh:
                for row in csv.DictReader(fh):
                    try:
                        t = int(np.datetime64(row["time"], "ns").astype(np.int64))
                        delay_ns = int(float(row[f"{side} deq_timedelta"]) * 1000)  # µs
                    except (KeyError, ValueError):
                        continue
                    series.append((t, delay_ns))
            series.sort()
            floor_ns = det.trend_floor * det.queue_latency_ns
            high = [d >= floor_ns for _, d in series]
            k = 0
            while k < len(high):  # runs of samples above the trend floor
                if not high[k]:
                    k += 1
                    continue
                j = k
                while j + 1 < len(high) and high[j + 1]:
                    j += 1
                if j == k:
                    spikes += 1
                elif series[j][0] - series[k][0] >= NS // 2:
                    runs += 1
                k = j + 1
            for t, delay in series:
                q = _queue(t, 0.0, delay)
                q.switch_id, q.egress_port = n, port
                for d in det.on_int_queue(q):
                    detections += 1
                    ev = {e.name: e for e in d.evidence}
                    assert ev["above_floor_s"].value >= 0.5
                    assert ev["queue_latency_ns"].value >= floor_ns
                samples += 1
    assert samples > 30_000
    assert spikes > 0  # the data has isolated spikes ...
    assert 0 < detections <= runs  # ... none of which fired; at most one per sustained run
