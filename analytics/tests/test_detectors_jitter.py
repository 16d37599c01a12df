"""Jitter breaches are judged against the path's own delay variation (issue 17, finding 7).

A flow's RFC 3550 jitter compares arrival times with the RTP timestamps its sender wrote, so a
sender whose host is busy (descheduled, sending late) shows jitter that no queue made. Recorded
on the lab under a CPU hog, a client's input stream sat at 1.4-3.4 ms of jitter against GeForce
Now's 2 ms objective while the probes of its path varied by ~0.03 ms: the loop acted on it before
any fault. A queue whose delay varies delays the probes of the path as much, and still fires.
"""

from __future__ import annotations

import csv
from dataclasses import replace
from pathlib import Path

import numpy as np
from cgloop.analytics.detectors import SloDetector
from cgloop.analytics.detectors.slo import SeriesParams
from cgloop.analytics.engine import AnalyticsEngine, EngineConfig
from cgloop.analytics.packets import Packet, records_from_packets
from cgloop.analytics.records import NS
from cgloop.analytics.synthetic import gaming_records
from cgloop.v1.common_pb2 import FiveTuple, RecordHeader
from cgloop.v1.detection_pb2 import DetectionKind as K
from cgloop.v1.flow_pb2 import FlowRecord, RtpStats
from cgloop.v1.probe_pb2 import ProbeRecord

RECORDED = Path(__file__).parent / "data" / "contended_sender_jitter.csv"
SERVER, CLIENT = bytes([10, 77, 1, 1]), bytes([10, 77, 11, 2])
DOWN = FiveTuple(src_addr=SERVER, dst_addr=CLIENT, src_port=49104, dst_port=49104,
                 ip_protocol=17)
UP = FiveTuple(src_addr=CLIENT, dst_addr=SERVER, src_port=49104, dst_port=49104, ip_protocol=17)
T0 = 1_795_571_000 * NS
MS = 1_000_000


def _loop_detector() -> SloDetector:
    """The SLO detector with the loop's settings (flow-record metrics must last 200 ms)."""
    det = SloDetector(params=SeriesParams(min_duration_ns=200 * MS),
                      latency_params=SeriesParams(min_duration_ns=50 * MS))
    det.watch(DOWN, "gfn", down=True, t_ns=T0)
    det.watch(UP, "gfn", down=False, t_ns=T0)
    return det


def _recorded(five_tuple: FiveTuple = UP, t0: int = T0):
    """The recorded input-stream records and probe RTTs, as (time, kind, record or RTT ns)."""
    events = []
    with RECORDED.open() as f:
        for i, row in enumerate(csv.reader(x for x in f if not x.startswith("#"))):
            if row[0] == "flow":
                start, end = t0 + int(float(row[1]) * MS), t0 + int(float(row[2]) * MS)
                rec = FlowRecord(
                    header=RecordHeader(schema_version=1, source_id="lab/edge/flow-probe",
                                        sequence=i + 1, timestamp_ns=end),
                    five_tuple=five_tuple, interval_start_ns=start, interval_end_ns=end,
                    packets=int(row[3]), bytes=int(row[3]) * 525,
                    rtp=RtpStats(ssrc=7, payload_type=97, clock_rate_hz=90_000,
                                 jitter_ns=int(float(row[4]) * 1000)),
                )
                events.append((end, "flow", rec))
            else:
                sent, rtt = t0 + int(float(row[1]) * MS), int(float(row[2]) * 1000)
                events.append((sent + rtt, "probe", (sent, rtt)))
    events.sort(key=lambda e: e[0])
    return events


def _jitter_hits(det: SloDetector, events, probes: bool = True):
    out = []
    for _, kind, x in events:
        if kind == "flow":
            out += [d for d in det.on_flow(x) if d.kind == K.DETECTION_KIND_SLO_JITTER]
        elif probes:
            det.on_path_delay(DOWN, x[0], x[1])
    return out


def test_a_busy_senders_jitter_with_a_steady_path_is_no_breach():
    events = _recorded()
    flows = [x for _, k, x in events if k == "flow"]
    over = [r.rtp.jitter_ns / 1e6 for r in flows if r.rtp.jitter_ns > 2 * MS]
    assert len(over) >= len(flows) // 3, "the recording breaches the 2 ms objective often"
    # Nothing measures the path (a pcap, no probes): the jitter alone fires, as it always did.
    assert _jitter_hits(_loop_detector(), events, probes=False)
    # The probes of the same path, same queue, saw no variation: the sender's host, not the
    # network. No detection, so the loop does not act.
    det = _loop_detector()
    assert _jitter_hits(det, events) == []
    assert det.held_jitter > 0
    pj = det.path_jitter(UP, 0, 2**63)  # the last second of probes it keeps
    assert pj is not None and pj[0] < 0.2


def _bursty_uplink(seconds: float, fault_s: float, seed: int = 1) -> np.ndarray:
    """SYNTHETIC: the queueing delay (ms, per 0.1 ms step) of an access uplink FIFO that bursty
    cross traffic fills from `fault_s` on: bursts of 2-12 ms of backlog, 100 a second (the
    uplink ~70 % busy), drained at line rate. Before `fault_s` the queue is empty."""
    rng = np.random.default_rng(seed)
    steps = int(seconds * 10_000)
    q = np.zeros(steps)
    backlog = 0.0
    arrivals = set(
        int(t * 10_000) for t in np.cumsum(rng.exponential(1 / 100, 2000)) + fault_s
        if t < seconds
    )
    for i in range(steps):
        backlog = max(0.0, backlog - 0.1)
        if i in arrivals:
            backlog += rng.uniform(2, 12)
        q[i] = backlog
    return q


def _through_queue(q: np.ndarray, seconds: float):
    """SYNTHETIC: a punctual input stream (RTP, a packet every 10 ms) and probes every 10 ms,
    both through the queue `q`; events as `_recorded` gives them."""
    key = (CLIENT, SERVER, 49104, 49104, 17)
    events, packets = [], []
    for n in range(int(seconds * 100)):
        sent = n * 10 * MS
        arrival = T0 + sent + 50_000 + int(q[n * 100] * MS)
        pkt = Packet(ts_ns=arrival, key=key, length=565, rtp_ssrc=7, rtp_pt=97, rtp_seq=n,
                     rtp_ts=n * 900, rtp_marker=True)
        packets.append(pkt)
        psent = sent + 3 * MS
        rtt = 80_000 + int(q[min(len(q) - 1, n * 100 + 30)] * MS)
        events.append((T0 + psent + rtt, "probe", (T0 + psent, rtt)))
    recs = records_from_packets(packets, "synthetic/uplink", 100 * MS)
    events += [(r.interval_end_ns, "flow", r) for r in recs]
    events.sort(key=lambda e: e[0])
    return events


def test_a_queue_that_varies_the_path_still_fires_promptly():
    fault_s, seconds = 3.0, 8.0
    events = _through_queue(_bursty_uplink(seconds, fault_s), seconds)
    hits = _jitter_hits(_loop_detector(), events)
    assert len(hits) == 1, hits
    d = hits[0]
    ev = {e.name: e for e in d.evidence}
    assert ev["path_jitter_ms"].value >= ev["path_jitter_ms"].threshold == 1.0
    assert ev["path_samples"].value >= 5
    # detected within a second (event time) of the queue's first burst, at most one more flow
    # record (100 ms) after the jitter alone would have fired
    assert (d.window_end_ns - T0) / NS - fault_s <= 1.0
    plain = _jitter_hits(_loop_detector(), events, probes=False)
    assert len(plain) == 1 and d.window_end_ns - plain[0].window_end_ns <= 100 * MS


def _probe(seq: int, sent_ns: int, rtt_ns: int) -> ProbeRecord:
    return ProbeRecord(
        header=RecordHeader(schema_version=1, source_id="edge/probe/edge-cl1-be", sequence=seq,
                            timestamp_ns=sent_ns),
        probe_id="edge-cl1-be", target_addr=CLIENT, probe_sequence=seq, sent_ns=sent_ns,
        received_ns=sent_ns + rtt_ns, rtt_ns=rtt_ns,
    )


def test_the_engine_judges_jitter_by_the_probes_of_the_flows_queue(small_model):
    """End to end through the engine: a classified gaming session, then the recorded busy
    sender's input stream and probes of its client; no jitter detection."""
    model, card = small_model
    eng = AnalyticsEngine(model, card.version, EngineConfig(
        slo_profile="lab", slo_min_duration_s=0.2, latency_min_duration_s=0.05))
    # whichever platform the small model names, GeForce Now's 2 ms jitter objective
    eng.slo.profiles = {k: replace(v, jitter_ms=2.0) for k, v in eng.slo.profiles.items()}
    session = gaming_records("gfn", 10, seed=5, client=CLIENT, server=SERVER,
                             ports=(49104, 49104))
    start = session[0].interval_start_ns
    for r in session:
        if r.interval_end_ns <= start + 3 * NS:
            eng.on_flows([r])
    assert eng.servers.get(CLIENT), "the session is classified and its client probed"
    assert eng.slo.watching(UP) and eng.slo.watching(DOWN)
    t0 = start + 3 * NS
    rest = [(r.interval_end_ns, "down", r) for r in session
            if r.interval_end_ns > t0 and r.five_tuple.src_addr == SERVER]
    out, seq = [], 0
    for _, kind, x in sorted(_recorded(UP, t0) + rest, key=lambda e: e[0]):
        if kind == "probe":
            seq += 1
            out += eng.on_probes([_probe(seq, *x)])
        else:
            out += eng.on_flows([x])
    jitter = [d for d in out if d.kind == K.DETECTION_KIND_SLO_JITTER]
    assert jitter == []
    assert eng.slo.held_jitter > 0, "the breach was seen and held back, not missed"
