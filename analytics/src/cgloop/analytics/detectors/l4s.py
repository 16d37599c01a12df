"""L4S abuse in the low-latency queue (MOSAICO D234 §2.3.2).

A fast verdict first: the unresponsive-ECN rule below is judged over the flow's first and every
later `fast_bins` x `fast_bin_ns` (default 4 x 100 ms, the probe's export interval) as soon as
records cover them, so an L-queue flow that ignores CE is flagged within about half a second of
its start (on the real Skype capture: see docs/analytics.md). An episode it opens ends only
when both the fast and the long window say the flow is clean.

Then, per flow direction, records are binned (default 0.5 s) and judged over a sliding window
(default 5 s):

* unresponsive ECN: the flow is in the L queue (ECT(1)/CE share >= 0.5), carries real load
  (>= `min_rate_bps`; sparse flows need not respond, RFC 9331), its CE fraction stays high
  (>= `ce_threshold` on average) and its rate does not fall (second half of the window >=
  `response_ratio` x first half). A responsive (Prague-like) flow either keeps CE low or cuts
  its rate.
* unpaced micro-bursts: an L-queue flow whose bursts reach `l_burst_packets` in at least
  `burst_bins` bins of the window;
* classic-queue bursts: the same for a not-ECT/ECT(0) flow with `classic_burst_packets`, when
  its rate is erratic (coefficient of variation >= `classic_erratic_cv`): a steady video stream
  bursts once per frame and is not an attack.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import numpy as np
from cgloop.analytics.detectors.base import ev, make_detection
from cgloop.analytics.records import NS, TupleKey, observation_labels, tuple_key
from cgloop.v1.common_pb2 import FiveTuple
from cgloop.v1.detection_pb2 import Detection, DetectionKind, Severity
from cgloop.v1.flow_pb2 import FlowRecord


@dataclass
class _Bin:
    start: int
    packets: int = 0
    bytes: int = 0
    ect1: int = 0
    ce: int = 0
    max_burst: int = 0


@dataclass
class _FlowState:
    five_tuple: FiveTuple
    bins: deque = field(default_factory=deque)
    last_seen: int = 0
    episode: dict[int, int] = field(default_factory=dict)  # kind -> episode start
    first_ns: int = 0  # the first record's interval start: verdict times count from it
    fast: deque = field(default_factory=deque)  # _Bin of fast_bin_ns, oldest first
    fast_judged_ns: int = 0  # end of the last fast window judged
    fast_abusive: bool = False  # the last fast window's unresponsive-ECN verdict
    where: dict[str, str] = field(default_factory=dict)  # node_id, interface of the last record


class L4sAbuseDetector:
    name = "l4s-abuse"

    def __init__(
        self,
        bin_ns: int = NS // 2,
        window_bins: int = 10,
        ce_threshold: float = 0.2,
        response_ratio: float = 0.8,
        min_rate_bps: float = 200_000,
        l_share: float = 0.5,
        l_burst_packets: int = 16,
        classic_burst_packets: int = 48,
        burst_bins: int = 3,
        classic_erratic_cv: float = 0.5,
        max_flows: int = 50_000,
        idle_ns: int = 30 * NS,
        fast_bin_ns: int = NS // 10,
        fast_bins: int = 4,
    ) -> None:
        self.bin_ns = bin_ns
        self.window_bins = window_bins
        self.ce_threshold = ce_threshold
        self.response_ratio = response_ratio
        self.min_rate_bps = min_rate_bps
        self.l_share = l_share
        self.l_burst_packets = l_burst_packets
        self.classic_burst_packets = classic_burst_packets
        self.burst_bins = burst_bins
        self.classic_erratic_cv = classic_erratic_cv
        self.max_flows = max_flows
        self.idle_ns = idle_ns
        self.fast_bin_ns = fast_bin_ns
        self.fast_bins = fast_bins  # 0: no fast verdict
        self.flows: dict[TupleKey, _FlowState] = {}

    def on_flow(self, r: FlowRecord) -> list[Detection]:
        key = tuple_key(r.five_tuple)
        st = self.flows.get(key)
        if st is None:
            if len(self.flows) >= self.max_flows:
                self.evict(r.interval_end_ns, force=True)
            st = _FlowState(FiveTuple(**{f.name: getattr(r.five_tuple, f.name)
                                         for f in FiveTuple.DESCRIPTOR.fields}))
            st.first_ns = r.interval_start_ns
            self.flows[key] = st
        st.last_seen = r.interval_end_ns
        st.where = observation_labels(r)
        start = r.interval_start_ns - r.interval_start_ns % self.bin_ns
        closed = False
        if not st.bins or st.bins[-1].start < start:
            closed = bool(st.bins)
            st.bins.append(_Bin(start))
            while len(st.bins) > self.window_bins + 1:
                st.bins.popleft()
        b = st.bins[-1]
        b.packets += r.packets
        b.bytes += r.bytes
        b.ect1 += r.ecn_ect1_packets
        b.ce += r.ecn_ce_packets
        b.max_burst = max(b.max_burst, r.max_burst_packets)
        out = self._fast(st, r) if self.fast_bins else []
        # judge on completed bins only, once per bin
        return out + self._judge(st, r.interval_end_ns) if closed else out

    def _fast(self, st: _FlowState, r: FlowRecord) -> list[Detection]:
        """The unresponsive-ECN rule over the last `fast_bins` fast bins that records have
        covered (bins without packets count as silent), once per newly covered bin."""
        w = self.fast_bin_ns
        start = r.interval_start_ns - r.interval_start_ns % w
        if not st.fast or st.fast[-1].start < start:
            st.fast.append(_Bin(start))
        b = st.fast[-1]
        b.packets += r.packets
        b.bytes += r.bytes
        b.ect1 += r.ecn_ect1_packets
        b.ce += r.ecn_ce_packets
        covered = r.interval_end_ns - r.interval_end_ns % w  # bins before it are complete
        lo = covered - self.fast_bins * w
        while st.fast and st.fast[0].start < lo:
            st.fast.popleft()
        first_bin = st.first_ns - st.first_ns % w
        if covered <= st.fast_judged_ns or lo < first_bin:
            return []
        st.fast_judged_ns = covered
        by_start = {x.start: x for x in st.fast}
        bins = [by_start.get(lo + i * w, _Bin(lo + i * w)) for i in range(self.fast_bins)]
        out = self._ecn(st, bins, w, r.interval_end_ns)
        st.fast_abusive = out is not None
        return out or []

    def _ecn(self, st: _FlowState, bins: list[_Bin], bin_ns: int, now_ns: int):
        """The unresponsive-ECN rule over `bins`: None when it does not hold, else the
        detection of a new episode (an empty list within one)."""
        packets = np.array([b.packets for b in bins], dtype=float)
        total = packets.sum()
        if total == 0:
            return None
        rate = np.array([b.bytes * 8 / (bin_ns / NS) for b in bins])
        l_share = sum(b.ect1 + b.ce for b in bins) / total
        ce_frac = sum(b.ce for b in bins) / total
        half = len(bins) // 2
        first, second = float(np.median(rate[:half])), float(np.median(rate[half:]))
        response = second / first if first > 0 else 1.0
        mean_rate = float(rate.mean())
        if not (
            l_share >= self.l_share
            and mean_rate >= self.min_rate_bps
            and ce_frac >= self.ce_threshold
            and response >= self.response_ratio
        ):
            return None
        window = (bins[0].start, bins[-1].start + bin_ns)
        conf = min(1.0, 0.5 + (ce_frac - self.ce_threshold) + 0.25 * min(1.0, response - 0.8))
        return self._emit(
            st, DetectionKind.DETECTION_KIND_L4S_UNRESPONSIVE_ECN, window, conf,
            Severity.SEVERITY_MAJOR,
            [
                ev("ce_fraction", ce_frac, self.ce_threshold, 0.0, "ratio"),
                ev("l_queue_share", l_share, self.l_share, 0.0, "ratio"),
                ev("rate_response", response, self.response_ratio, 1.0, "ratio"),
                ev("rate_bps", mean_rate, self.min_rate_bps, first, "bps"),
                # the verdict's time: from the flow's first record to the record that decided
                ev("decision_s", (now_ns - st.first_ns) / NS, (window[1] - window[0]) / NS, 0.0,
                   "s"),
            ],
        )

    def _judge(self, st: _FlowState, now_ns: int) -> list[Detection]:
        bins = list(st.bins)[:-1][-self.window_bins:]
        if len(bins) < self.window_bins:
            return []
        packets = np.array([b.packets for b in bins], dtype=float)
        total = packets.sum()
        if total == 0:
            return []
        rate = np.array([b.bytes * 8 / (self.bin_ns / NS) for b in bins])
        l_share = sum(b.ect1 + b.ce for b in bins) / total
        window = (bins[0].start, bins[-1].start + self.bin_ns)
        in_l = l_share >= self.l_share
        ecn = self._ecn(st, bins, self.bin_ns, now_ns)
        out: list[Detection] = list(ecn or [])
        if ecn is None and not st.fast_abusive:
            st.episode.pop(DetectionKind.DETECTION_KIND_L4S_UNRESPONSIVE_ECN, None)
        limit = self.l_burst_packets if in_l else self.classic_burst_packets
        kind = (DetectionKind.DETECTION_KIND_L4S_MICROBURST if in_l
                else DetectionKind.DETECTION_KIND_CLASSIC_QUEUE_BURST)
        bursty = sum(1 for b in bins if b.max_burst >= limit)
        # Classic-queue bursts hurt through the coupling when they are erratic; a steady
        # video stream (one burst per frame, every frame) is not an attack.
        erratic = float(rate.std() / rate.mean()) if rate.mean() > 0 else 0.0
        if bursty >= self.burst_bins and (in_l or erratic >= self.classic_erratic_cv):
            out += self._emit(
                st, kind, window, min(1.0, bursty / self.window_bins + 0.3),
                Severity.SEVERITY_MINOR,
                [
                    ev("max_burst_packets", max(b.max_burst for b in bins), limit, 0.0, "packets"),
                    ev("bursty_bins", bursty, self.burst_bins, 0.0, "bins"),
                    ev("l_queue_share", l_share, self.l_share, 0.0, "ratio"),
                    ev("rate_cv", erratic, self.classic_erratic_cv, 0.0, "ratio"),
                ],
            )
        else:
            st.episode.pop(kind, None)
        return out

    def _emit(self, st, kind, window, conf, severity, evidence) -> list[Detection]:
        if kind in st.episode:
            return []  # one detection per episode
        st.episode[kind] = window[0]
        return [make_detection(kind, severity, conf, evidence, self.name, window, st.five_tuple,
                               window[0], labels=st.where)]

    def evict(self, now_ns: int, force: bool = False) -> int:
        idle = [k for k, s in self.flows.items() if now_ns - s.last_seen > self.idle_ns]
        if force and not idle and self.flows:
            idle = [min(self.flows, key=lambda k: self.flows[k].last_seen)]
        for k in idle:
            del self.flows[k]
        return len(idle)
