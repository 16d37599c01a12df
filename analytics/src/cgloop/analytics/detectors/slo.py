"""Latency, jitter, loss and throughput SLO breaches of gaming flows (per-platform profiles).

Each (flow, metric) is a series with a robust baseline (median and MAD of recent normal
samples), an upward CUSUM on the standardised deviation, and a state machine: an episode fires
only when the CUSUM has tripped AND the value has been past the platform's SLO threshold for at
least `min_duration`; it clears after `clear_hold` below `clear_ratio` x threshold (hysteresis).
A single spike therefore never fires, and an ongoing episode fires once.

Jitter is corroborated by the path. A flow's RFC 3550 jitter compares its packets' arrival
times with the RTP timestamps its sender wrote: it counts the sender host's timing (a game
server's or a client's process descheduled on a busy CPU sends late) as much as the network's
queues. Queueing delay that varies by milliseconds between packets does so for every packet
in the queue, the active probes and INT reports of the same path included; a busy sender's
lateness shows in its own stream only. So, where the path's delay is measured (probe RTTs or
INT latency matched to the flow's conversation, `on_path_delay`), a jitter breach fires only
if that delay also varies: the median change between successive samples during the breach
(at least `path_min_samples`; `path_window_ns` of them are kept) reaches `path_jitter_ratio` x
the jitter objective. Where nothing measures
the path (pcaps, deployments without probes) jitter fires on its own, as before; the
detection's `path_samples` evidence says which.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
from cgloop.analytics.detectors.base import ev, make_detection
from cgloop.analytics.records import (
    NS,
    TupleKey,
    conversation_key,
    observation_labels,
    tuple_key,
)
from cgloop.slo import GENERIC, Objectives
from cgloop.slo import table as slo_table
from cgloop.v1.common_pb2 import FiveTuple
from cgloop.v1.detection_pb2 import Detection, DetectionKind, Severity
from cgloop.v1.flow_pb2 import FlowRecord


@dataclass(frozen=True)
class SloProfile:
    """A platform's objectives, as the detector applies them (from the SLO table, cgloop.slo)."""

    latency_ms: float
    jitter_ms: float
    loss: float
    min_down_mbps: float

    @classmethod
    def of(cls, o: Objectives) -> SloProfile:
        return cls(o.latency_ms, o.jitter_ms, o.loss, o.min_down_mbps)


def platform_slos(deployment: str | None = None) -> dict[str, SloProfile]:
    """Every platform's profile from the SLO table (cgloop.slo: MOSAICO D234 Table 2.1), under
    a deployment profile's objectives if named (e.g. `lab`: 20 ms latency for every platform).
    Unknown deployment names raise CgloopError listing the known ones."""
    t = slo_table()
    return {name: SloProfile.of(t.objectives(name, deployment)) for name in t.platforms}


PLATFORM_SLOS: dict[str, SloProfile] = platform_slos()


@dataclass
class SeriesParams:
    min_duration_ns: int = 1 * NS
    clear_hold_ns: int = 2 * NS
    clear_ratio: float = 0.7
    cusum_k: float = 0.5  # slack, in robust standard deviations
    cusum_h: float = 5.0  # decision interval
    history: int = 120  # normal samples kept for the baseline


@dataclass
class _Series:
    threshold: float
    upward: bool  # True: breach when above (latency, jitter, loss); False: below (throughput)
    p: SeriesParams
    normal: deque = field(default_factory=deque)
    cusum: float = 0.0
    over_since: int | None = None
    below_since: int | None = None
    in_episode: bool = False
    episode_start: int = 0
    peak: float = 0.0

    def _sign(self, x: float) -> float:
        return x if self.upward else -x

    def baseline(self) -> tuple[float, float]:
        if not self.normal:
            return (self.threshold * (0.3 if self.upward else 3.0), abs(self.threshold) * 0.1)
        arr = np.fromiter(self.normal, dtype=float)
        med = float(np.median(arr))
        mad = float(np.median(np.abs(arr - med))) * 1.4826
        return med, max(mad, abs(self.threshold) * 0.05)

    def update(
        self, t: int, x: float, corroborated: Callable[[], bool] | None = None
    ) -> dict | None:
        """One sample; a hit when an episode starts. `corroborated`, when given, is asked last:
        False holds the episode back (the breach stays pending and fires once it is)."""
        med, sigma = self.baseline()
        z = (self._sign(x) - self._sign(med)) / sigma
        self.cusum = max(0.0, self.cusum + z - self.p.cusum_k)
        over = self._sign(x) >= self._sign(self.threshold)
        if over:
            self.over_since = t if self.over_since is None else self.over_since
            self.peak = max(self.peak, x) if self.upward else min(self.peak or x, x)
        else:
            self.over_since = None
        if not self.in_episode:
            if not over and self._sign(x) < self._sign(self.threshold * self.p.clear_ratio):
                self.normal.append(x)
                while len(self.normal) > self.p.history:
                    self.normal.popleft()
            if (
                over
                and self.cusum > self.p.cusum_h
                and t - self.over_since >= self.p.min_duration_ns
                and (corroborated is None or corroborated())
            ):
                self.in_episode, self.episode_start = True, self.over_since
                return {
                    "value": x, "peak": self.peak, "baseline": med, "cusum": self.cusum,
                    "start": self.over_since,
                }
            return None
        # in an episode: clear after clear_hold below clear_ratio x threshold
        if self._sign(x) < self._sign(self.threshold * self.p.clear_ratio):
            self.below_since = t if self.below_since is None else self.below_since
            if t - self.below_since >= self.p.clear_hold_ns:
                self.in_episode, self.below_since, self.cusum, self.peak = False, None, 0.0, 0.0
        else:
            self.below_since = None
        return None


_METRICS = {
    # metric: (kind, unit, evidence name, upward)
    "latency": (DetectionKind.DETECTION_KIND_SLO_LATENCY, "ms", "latency_ms", True),
    "jitter": (DetectionKind.DETECTION_KIND_SLO_JITTER, "ms", "rtp_jitter_ms", True),
    "loss": (DetectionKind.DETECTION_KIND_SLO_LOSS, "ratio", "loss_fraction", True),
    "throughput": (DetectionKind.DETECTION_KIND_SLO_THROUGHPUT, "Mbit/s", "down_mbps", False),
}


@dataclass
class _Flow:
    platform: str
    five_tuple: FiveTuple
    down: bool
    series: dict[str, _Series]
    last_seen: int = 0
    # where the flow was last observed (node_id, interface: records.observation_labels)
    where: dict[str, str] = field(default_factory=dict)


class SloDetector:
    """SLO breaches of flows registered as gaming (`watch`), from flow records and latency
    samples (INT end-to-end latency, active probes)."""

    name = "slo"

    def __init__(
        self,
        profiles: dict[str, SloProfile] | None = None,
        params: SeriesParams | None = None,
        max_flows: int = 10_000,
        idle_ns: int = 30 * NS,
        latency_params: SeriesParams | None = None,
        path_window_ns: int = NS,
        path_jitter_ratio: float = 0.5,
        path_min_samples: int = 5,
    ) -> None:
        self.profiles = profiles or PLATFORM_SLOS
        self.params = params or SeriesParams()
        # latency comes from probes and INT, far more often than flow records: its own timing
        self.latency_params = latency_params or self.params
        self.max_flows = max_flows
        self.idle_ns = idle_ns
        self.flows: dict[TupleKey, _Flow] = {}
        self.path_window_ns = path_window_ns
        self.path_jitter_ratio = path_jitter_ratio
        self.path_min_samples = path_min_samples
        # per conversation (both directions share the path): (time, delay ms) of the last window
        self.paths: dict[TupleKey, deque[tuple[int, float]]] = {}
        self.held_jitter = 0  # jitter breaches the path did not corroborate (samples)

    def watch(
        self, five_tuple: FiveTuple, platform: str, down: bool = True, t_ns: int = 0,
        where: dict[str, str] | None = None,
    ) -> None:
        key = tuple_key(five_tuple)
        if key in self.flows:
            return
        if len(self.flows) >= self.max_flows:
            oldest = min(self.flows, key=lambda k: self.flows[k].last_seen)
            del self.flows[oldest]
        prof = self.profiles.get(platform) or self.profiles[GENERIC]
        thr = {
            "latency": prof.latency_ms, "jitter": prof.jitter_ms, "loss": prof.loss,
            "throughput": prof.min_down_mbps,
        }
        self.flows[key] = _Flow(
            platform, FiveTuple(**{f.name: getattr(five_tuple, f.name)
                                   for f in FiveTuple.DESCRIPTOR.fields}), down,
            {
                m: _Series(thr[m], _METRICS[m][3],
                           self.latency_params if m == "latency" else self.params)
                for m in _METRICS
            },
            last_seen=t_ns, where=dict(where or {}),
        )

    def watching(self, five_tuple: FiveTuple) -> bool:
        return tuple_key(five_tuple) in self.flows

    def on_path_delay(self, five_tuple: FiveTuple, t_ns: int, delay_ns: float) -> None:
        """A measured delay of the path a flow takes (a probe's RTT toward either end in the
        flow's queue, an INT end-to-end latency): the evidence a jitter breach is checked
        against. Lower bounds (overdue notices) are no measurement of variation."""
        fwd = tuple_key(five_tuple)
        if fwd not in self.flows and (fwd[1], fwd[0], fwd[3], fwd[2], fwd[4]) not in self.flows:
            return  # only the paths of watched flows are kept (INT reports every flow)
        key = conversation_key(five_tuple)
        samples = self.paths.get(key)
        if samples is None:
            if len(self.paths) >= self.max_flows:
                oldest = min(self.paths, key=lambda k: self.paths[k][-1][0])
                del self.paths[oldest]
            samples = self.paths[key] = deque()
        samples.append((t_ns, delay_ns / 1e6))
        while samples and samples[-1][0] - samples[0][0] > self.path_window_ns:
            samples.popleft()

    def path_jitter(
        self, five_tuple: FiveTuple, since_ns: int, t_ns: int
    ) -> tuple[float, int] | None:
        """(median |change| between successive path delays in ms, samples) from `since_ns` (the
        breach's start: the path must vary while the flow's jitter is high) to `t_ns`, or the
        last `path_min_samples` before `t_ns` when the span holds fewer; None when the path is
        not measured there. The median: a late reply (the probing or the reflecting host
        descheduled) moves it not at all, a queue whose delay varies moves most differences."""
        samples = self.paths.get(conversation_key(five_tuple))
        if not samples:
            return None
        upto = sorted(v for v in samples if v[0] <= t_ns)
        span = [v for v in upto if v[0] >= since_ns]
        if len(span) < self.path_min_samples:
            span = upto[-self.path_min_samples:]
        if len(span) < self.path_min_samples:
            return None
        delays = np.array([d for _, d in span])
        return float(np.median(np.abs(np.diff(delays)))), len(span)

    def _sample(self, fl: _Flow, metric: str, t: int, x: float, window: tuple[int, int]):
        s = fl.series[metric]
        path: tuple[float, int] | None = None
        need = s.threshold * self.path_jitter_ratio

        def path_varies() -> bool:
            nonlocal path
            path = self.path_jitter(fl.five_tuple, s.over_since or t, t)
            if path is None or path[0] >= need:
                return True
            self.held_jitter += 1
            return False

        hit = s.update(t, x, path_varies if metric == "jitter" else None)
        if hit is None:
            return None
        extra = []
        if metric == "jitter":
            pj, n = path if path is not None else (0.0, 0)
            extra = [ev("path_jitter_ms", pj, need, 0.0, "ms"),
                     ev("path_samples", n, self.path_min_samples, 0.0, "samples")]
        kind, unit, name, _ = _METRICS[metric]
        ratio = (hit["peak"] / s.threshold) if s.upward else (s.threshold / max(hit["peak"], 1e-9))
        severity = Severity.SEVERITY_MAJOR if ratio >= 2 else Severity.SEVERITY_MINOR
        params = s.p
        conf = min(1.0, 0.5 + hit["cusum"] / (4 * params.cusum_h))
        return make_detection(
            kind, severity, conf,
            [
                ev(name, hit["value"], s.threshold, hit["baseline"], unit),
                ev(f"peak_{name}", hit["peak"], s.threshold, hit["baseline"], unit),
                ev("cusum", hit["cusum"], params.cusum_h, 0.0, "sigma"),
                ev("duration_s", (t - hit["start"]) / NS, params.min_duration_ns / NS, 0.0,
                   "s"),
                *extra,
            ],
            self.name, (hit["start"], window[1]), fl.five_tuple, hit["start"],
            labels={**fl.where, "platform": fl.platform, "metric": metric},
        )

    def on_flow(self, r: FlowRecord) -> list[Detection]:
        fl = self.flows.get(tuple_key(r.five_tuple))
        if fl is None:
            return []
        fl.last_seen = r.interval_end_ns
        fl.where = observation_labels(r)
        t, w = r.interval_end_ns, (r.interval_start_ns, r.interval_end_ns)
        out = []
        if r.HasField("rtp"):
            got = r.packets + r.rtp.lost_packets
            out.append(self._sample(fl, "jitter", t, r.rtp.jitter_ns / 1e6, w))
            if got:
                out.append(self._sample(fl, "loss", t, r.rtp.lost_packets / got, w))
        if fl.down and r.interval_end_ns > r.interval_start_ns:
            mbps = r.bytes * 8 / ((r.interval_end_ns - r.interval_start_ns) / NS) / 1e6
            out.append(self._sample(fl, "throughput", t, mbps, w))
        return [d for d in out if d is not None]

    def on_latency(self, five_tuple: FiveTuple, t_ns: int, latency_ns: float) -> list[Detection]:
        fl = self.flows.get(tuple_key(five_tuple))
        if fl is None:
            return []
        fl.last_seen = t_ns
        d = self._sample(fl, "latency", t_ns, latency_ns / 1e6, (t_ns, t_ns))
        return [d] if d is not None else []

    def evict(self, now_ns: int) -> int:
        idle = [k for k, f in self.flows.items() if now_ns - f.last_seen > self.idle_ns]
        for k in idle:
            del self.flows[k]
        for k in [k for k, s in self.paths.items() if now_ns - s[-1][0] > self.idle_ns]:
            del self.paths[k]
        return len(idle)
