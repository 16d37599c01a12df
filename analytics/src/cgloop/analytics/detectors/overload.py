"""Queue and node overload, ahead of time (Gallenmüller thesis: overload is the dominant effect).

Every subject (a switch queue from INT, a node, a network function) gets a utilisation series
rho(t). With the capacity model R_max = (1 s - d_Σ) / t_CPU, a function's rho is its packet
rate over its capacity (`capacity_pps`); a node's is its busiest core; a switch queue's is
its egress utilisation or its queueing delay over the `queue_latency_ns` budget, whichever
is higher.
A subject fires when rho stays >= `warn_rho` for `min_duration`, or when a line fitted over the
last `trend_window` predicts rho >= 1 within `horizon` while rho has stayed >= `trend_floor`
for half of `min_duration` (noise at low load and lone spikes are never extrapolated). It
clears below `clear_rho` (hysteresis).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import numpy as np
from cgloop.analytics.detectors.base import ev, make_detection
from cgloop.analytics.records import NS
from cgloop.v1.detection_pb2 import Detection, DetectionKind, QueueRef, Severity
from cgloop.v1.int_pb2 import IntQueueRecord
from cgloop.v1.node_pb2 import NodeSample


@dataclass
class _Subject:
    kind: int
    subject: QueueRef | str
    samples: deque = field(default_factory=deque)
    above_since: int | None = None
    floor_since: int | None = None
    in_episode: bool = False
    last_seen: int = 0


class QueueOverloadDetector:
    name = "overload"

    def __init__(
        self,
        warn_rho: float = 0.9,
        clear_rho: float = 0.5,  # below trend_floor: one excursion fires once
        trend_floor: float = 0.6,
        horizon_ns: int = 2 * NS,
        trend_window_ns: int = 5 * NS,
        min_duration_ns: int = NS,
        queue_latency_ns: int = 5_000_000,
        capacity_pps: dict[str, float] | None = None,
        max_subjects: int = 10_000,
        idle_ns: int = 60 * NS,
    ) -> None:
        self.warn_rho = warn_rho
        self.clear_rho = clear_rho
        self.trend_floor = trend_floor
        self.horizon_ns = horizon_ns
        self.trend_window_ns = trend_window_ns
        self.min_duration_ns = min_duration_ns
        self.queue_latency_ns = queue_latency_ns
        self.capacity_pps = capacity_pps or {}
        self.max_subjects = max_subjects
        self.idle_ns = idle_ns
        self.subjects: dict[str, _Subject] = {}
        self._fn_last: dict[str, tuple[int, int]] = {}

    def _get(self, key: str, kind: int, subject: QueueRef | str) -> _Subject:
        s = self.subjects.get(key)
        if s is None:
            if len(self.subjects) >= self.max_subjects:
                oldest = min(self.subjects, key=lambda k: self.subjects[k].last_seen)
                del self.subjects[oldest]
            s = self.subjects[key] = _Subject(kind, subject)
        return s

    def _update(self, s: _Subject, t: int, rho: float, extra: list) -> list[Detection]:
        s.last_seen = t
        s.samples.append((t, rho))
        while s.samples and t - s.samples[0][0] > self.trend_window_ns:
            s.samples.popleft()
        if s.in_episode:
            if rho < self.clear_rho:
                s.in_episode, s.above_since = False, None
            return []
        s.above_since = (s.above_since or t) if rho >= self.warn_rho else None
        s.floor_since = (s.floor_since or t) if rho >= self.trend_floor else None
        sustained = s.above_since is not None and t - s.above_since >= self.min_duration_ns
        predicted, eta_s = rho, float("inf")
        # extrapolate only a rise that has held above the floor for half the minimum duration:
        # a lone spike is never a trend
        rising = s.floor_since is not None and t - s.floor_since >= self.min_duration_ns // 2
        if len(s.samples) >= 4 and rising:
            ts = np.array([x[0] for x in s.samples], dtype=float) / NS
            ys = np.array([x[1] for x in s.samples])
            slope, icpt = np.polyfit(ts - ts[-1], ys, 1)
            predicted = float(icpt + slope * self.horizon_ns / NS)
            if slope > 0:
                eta_s = max(0.0, (1.0 - icpt) / slope)
        ahead = predicted >= 1.0 and eta_s <= self.horizon_ns / NS
        if not (sustained or ahead):
            return []
        s.in_episode = True
        start = s.above_since or s.samples[0][0]
        sev = Severity.SEVERITY_CRITICAL if rho >= 1.0 else Severity.SEVERITY_MAJOR
        return [make_detection(
            s.kind, sev, min(1.0, 0.5 + 0.5 * min(1.0, max(rho, predicted))),
            [
                ev("rho", rho, self.warn_rho, float(np.median([x[1] for x in s.samples])),
                   "ratio"),
                ev("predicted_rho", predicted, 1.0, rho, "ratio"),
                ev("seconds_to_overload", min(eta_s, 1e9), self.horizon_ns / NS, 0.0, "s"),
                ev("above_floor_s", (t - (s.floor_since or t)) / NS, self.min_duration_ns / 2 / NS,
                   0.0, "s"),
                *extra,
            ],
            self.name, (s.samples[0][0], t), s.subject, start,
            labels={"trigger": "sustained" if sustained else "trend"},
        )]

    def on_int_queue(self, q: IntQueueRecord) -> list[Detection]:
        ref = QueueRef(node_id=str(q.switch_id), interface_name=str(q.egress_port),
                       queue_id=q.queue_id)
        s = self._get(f"q/{q.switch_id}/{q.egress_port}/{q.queue_id}",
                      DetectionKind.DETECTION_KIND_QUEUE_CONGESTION, ref)
        # a queue's delay against its budget is a load measure too (1.0 = at the budget)
        rho = max(float(q.egress_tx_utilization), q.queue_latency_ns / self.queue_latency_ns)
        extra = [ev("queue_latency_ns", q.queue_latency_ns, self.queue_latency_ns, 0.0, "ns"),
                 ev("queue_occupancy_cells", q.queue_occupancy_cells, 0.0, 0.0, "cells")]
        return self._update(s, q.header.timestamp_ns, rho, extra)

    def on_node(self, n: NodeSample) -> list[Detection]:
        t = n.header.timestamp_ns
        out: list[Detection] = []
        if n.cores:
            rho = max(c.utilization for c in n.cores)
            s = self._get(f"n/{n.node_id}", DetectionKind.DETECTION_KIND_NODE_OVERLOAD, n.node_id)
            out += self._update(s, t, rho, [])
        for f in n.functions:
            key = f"{n.node_id}/{f.function_name}"
            prev = self._fn_last.get(key)
            self._fn_last[key] = (t, f.packets)
            cap = self.capacity_pps.get(f.function_name)
            if prev is None or cap is None or t <= prev[0]:
                continue
            pps = (f.packets - prev[1]) / ((t - prev[0]) / NS)
            s = self._get(f"f/{key}", DetectionKind.DETECTION_KIND_FUNCTION_OVERLOAD,
                          f"{n.node_id}/{f.function_name}")
            s.subject = f.function_name
            out += self._update(s, t, pps / cap, [ev("rate_pps", pps, cap, 0.0, "pps")])
        return out

    def evict(self, now_ns: int) -> int:
        idle = [k for k, s in self.subjects.items() if now_ns - s.last_seen > self.idle_ns]
        for k in idle:
            del self.subjects[k]
        return len(idle)
