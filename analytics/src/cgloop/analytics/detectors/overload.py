"""Queue, node and function overload, ahead of time (Gallenmüller thesis: overload is the
dominant effect), and switch-queue congestion as INT reports it.

Every subject (a switch queue from INT, a node, a network-function instance) gets a
utilisation series rho(t). With the capacity model R_max = (1 s - d_Σ) / t_CPU (Gallenmüller
thesis, docs/sources.md), a core's capacity is the time it does not spend on interrupts, so:

* a node's rho is its busiest core's busy share (`CoreSample.utilization`): near 1 the offered
  load is at R_max. `warn_rho` 0.9 keeps the thesis' margin below it;
* a function instance's rho is the share of the interval its AF_XDP worker spent processing
  frames (`FunctionCounters.busy_ratio`, the instance's own R_max), or its packet rate over a
  configured capacity (`capacity_pps`), whichever is higher. Its threshold is lower,
  `function_warn_rho` 0.85: with Natif's M/D/1 model (Hajji thesis ch. 5-6) a packet waits
  rho / (2 (1 - rho)) service times, which for the shipped chain's `dpi` (7 µs a packet)
  passes CALVIN's 20 µs budget of an advanced function (CALVIN §III) above rho = 0.85. A ring
  overflow (`rx_dropped` growing) is overload already: it fires at once (trigger `rx_dropped`).
  So does a starved worker: frames waiting in its ring (`rx_waiting` > 0) while it has made no
  progress for `function_stall_ns` (`stalled_ns`, default 50 ms) fires at once, critical
  (trigger `stalled`). Why: a worker whose core another task holds does nothing, so its
  `busy_ratio` reads idle, and its ring only overflows once full, ~0.7-1.1 s after the onset at
  a gaming stream's rate; the stall shows in the first sample. 50 ms is 2500 times the 20 µs
  budget of the frames it holds, and five times the 10 ms a worker that keeps up can read (its
  sleep between looks at an empty ring, docs/node-agent.md);
* a switch queue's rho is its egress utilisation or its queueing delay over the
  `queue_latency_ns` budget, whichever is higher.

A subject fires when rho stays >= its warn level for its minimum duration (`min_duration` for
queues and nodes, `function_min_duration` for functions), or when a line fitted over the last
`trend_window` predicts rho >= 1 within `horizon` while rho has stayed >= `trend_floor` for
half of the minimum duration (noise at low load and lone spikes are never extrapolated). It
clears below `clear_rho` (hysteresis).

Switch queues also fire per report, without a window: an IntQueueRecord with `congested` set
is the INT collector saying the queue crossed its threshold (occupancy >= its congestion_on
cells, or the switch's Q flag, with hysteresis; docs/int-collector.md), in the report that
crossed it. It fires at once (trigger `congested`), so the detection's event time is the
crossing's; the record with `congested` cleared ends the episode.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import numpy as np
from cgloop.analytics.detectors.base import ev, make_detection
from cgloop.analytics.records import NS
from cgloop.v1.detection_pb2 import Detection, DetectionKind, QueueRef, Severity
from cgloop.v1.int_pb2 import IntQueueRecord
from cgloop.v1.node_pb2 import FunctionCounters, NodeSample


@dataclass
class _Subject:
    kind: int
    subject: QueueRef | str
    samples: deque = field(default_factory=deque)
    above_since: int | None = None
    floor_since: int | None = None
    in_episode: bool = False
    last_seen: int = 0
    # per kind of subject: the warn level and the minimum duration it must hold
    warn_rho: float = 0.9
    min_duration_ns: int = NS
    labels: dict[str, str] = field(default_factory=dict)
    # the episode was opened by the collector's congested flag (ends when the flag clears)
    flagged: bool = False


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
        function_warn_rho: float = 0.85,
        function_min_duration_ns: int = 300_000_000,
        function_stall_ns: int = 50_000_000,
        switch_nodes: dict[int, str] | None = None,
        switch_ports: dict[tuple[int, int], str] | None = None,
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
        self.function_warn_rho = function_warn_rho
        self.function_min_duration_ns = function_min_duration_ns
        if function_stall_ns <= 0:
            raise ValueError(f"function_stall_ns must be > 0, got {function_stall_ns}")
        self.function_stall_ns = function_stall_ns
        # INT switch id -> node id, (switch id, egress port) -> interface name, where known
        self.switch_nodes = switch_nodes or {}
        self.switch_ports = switch_ports or {}
        self.subjects: dict[str, _Subject] = {}
        # per function instance: (time, packets, rx_dropped) of its previous sample
        self._fn_last: dict[str, tuple[int, int, int]] = {}

    def _get(self, key: str, kind: int, subject: QueueRef | str, warn_rho: float | None = None,
             min_duration_ns: int | None = None) -> _Subject:
        s = self.subjects.get(key)
        if s is None:
            if len(self.subjects) >= self.max_subjects:
                oldest = min(self.subjects, key=lambda k: self.subjects[k].last_seen)
                del self.subjects[oldest]
                self._fn_last.pop(oldest.removeprefix("f/"), None)
            s = self.subjects[key] = _Subject(
                kind, subject,
                warn_rho=self.warn_rho if warn_rho is None else warn_rho,
                min_duration_ns=self.min_duration_ns if min_duration_ns is None
                else min_duration_ns,
            )
        return s

    def _update(self, s: _Subject, t: int, rho: float, extra: list,
                now: str | None = None) -> list[Detection]:
        """One sample of a subject; `now` names a trigger that fires at once (the collector's
        congested flag, a ring overflow) unless an episode is open."""
        s.last_seen = t
        s.samples.append((t, rho))
        while s.samples and t - s.samples[0][0] > self.trend_window_ns:
            s.samples.popleft()
        if s.in_episode:
            if rho < self.clear_rho and now is None and not s.flagged:
                s.in_episode, s.above_since = False, None
            return []
        s.above_since = (s.above_since or t) if rho >= s.warn_rho else None
        s.floor_since = (s.floor_since or t) if rho >= self.trend_floor else None
        sustained = s.above_since is not None and t - s.above_since >= s.min_duration_ns
        predicted, eta_s = rho, float("inf")
        # extrapolate only a rise that has held above the floor for half the minimum duration:
        # a lone spike is never a trend
        rising = s.floor_since is not None and t - s.floor_since >= s.min_duration_ns // 2
        if len(s.samples) >= 4 and rising:
            ts = np.array([x[0] for x in s.samples], dtype=float) / NS
            ys = np.array([x[1] for x in s.samples])
            slope, icpt = np.polyfit(ts - ts[-1], ys, 1)
            predicted = float(icpt + slope * self.horizon_ns / NS)
            if slope > 0:
                eta_s = max(0.0, (1.0 - icpt) / slope)
        ahead = predicted >= 1.0 and eta_s <= self.horizon_ns / NS
        if not (sustained or ahead or now):
            return []
        s.in_episode = True
        s.flagged = now == "congested"
        start = t if now else (s.above_since or s.samples[0][0])
        trigger = now or ("sustained" if sustained else "trend")
        sev = (Severity.SEVERITY_CRITICAL if rho >= 1.0 or now in ("rx_dropped", "stalled")
               else Severity.SEVERITY_MAJOR)
        return [make_detection(
            s.kind, sev, min(1.0, 0.5 + 0.5 * min(1.0, max(rho, predicted))),
            [
                ev("rho", rho, s.warn_rho, float(np.median([x[1] for x in s.samples])),
                   "ratio"),
                ev("predicted_rho", predicted, 1.0, rho, "ratio"),
                ev("seconds_to_overload", min(eta_s, 1e9), self.horizon_ns / NS, 0.0, "s"),
                ev("above_floor_s", (t - (s.floor_since or t)) / NS, s.min_duration_ns / 2 / NS,
                   0.0, "s"),
                *extra,
            ],
            self.name, (s.samples[0][0], t), s.subject, start,
            # the episode's start names it: the worker's suppressor lets a new episode through
            labels={**s.labels, "trigger": trigger, "episode": str(start)},
            subject_field="function_name"
            if s.kind == DetectionKind.DETECTION_KIND_FUNCTION_OVERLOAD else "node_id",
        )]

    def on_int_queue(self, q: IntQueueRecord) -> list[Detection]:
        ref = QueueRef(node_id=str(q.switch_id), interface_name=str(q.egress_port),
                       queue_id=q.queue_id)
        s = self._get(f"q/{q.switch_id}/{q.egress_port}/{q.queue_id}",
                      DetectionKind.DETECTION_KIND_QUEUE_CONGESTION, ref)
        s.labels = {
            "switch_id": str(q.switch_id), "egress_port": str(q.egress_port),
            "queue_id": str(q.queue_id), "node_id": self.switch_nodes.get(q.switch_id, ""),
            "interface": self.switch_ports.get((q.switch_id, q.egress_port), ""),
        }
        # a queue's delay against its budget is a load measure too (1.0 = at the budget)
        rho = max(float(q.egress_tx_utilization), q.queue_latency_ns / self.queue_latency_ns)
        extra = [ev("queue_latency_ns", q.queue_latency_ns, self.queue_latency_ns, 0.0, "ns"),
                 ev("queue_occupancy_cells", q.queue_occupancy_cells, 0.0, 0.0, "cells")]
        if s.flagged and not q.congested:  # the collector says the queue is back below
            s.in_episode, s.flagged, s.above_since = False, False, None
        return self._update(s, q.header.timestamp_ns, rho, extra,
                            now="congested" if q.congested else None)

    def on_node(self, n: NodeSample) -> list[Detection]:
        t = n.header.timestamp_ns
        out: list[Detection] = []
        # Functions first: when one sample shows both, the more specific diagnosis (a starved
        # chain function) comes first in the batch, and a policy engine deciding in order acts
        # on it first (its lever relieves the function; the node's power lever can follow).
        for f in n.functions:
            out += self._function(n.node_id, t, f)
        if n.cores:
            busiest = max(n.cores, key=lambda c: c.utilization)
            s = self._get(f"n/{n.node_id}", DetectionKind.DETECTION_KIND_NODE_OVERLOAD, n.node_id)
            s.labels = {"node_id": n.node_id, "core": str(busiest.core)}
            out += self._update(s, t, busiest.utilization, [])
        return out

    def _function(self, node: str, t: int, f: FunctionCounters) -> list[Detection]:
        key = f"{node}/{f.function_name}/{f.instance}"
        prev = self._fn_last.get(key)
        self._fn_last[key] = (t, f.packets, f.rx_dropped)
        if prev is not None and t <= prev[0]:
            return []  # a repeat or an older sample: no interval
        cap = self.capacity_pps.get(f.function_name)
        busy = f.busy_ratio if f.HasField("busy_ratio") else None
        pps = (f.packets - prev[1]) / ((t - prev[0]) / NS) if prev is not None else None
        # a counter that went back (the instance restarted) is no growth
        dropped = max(0, f.rx_dropped - prev[2]) if prev is not None else 0
        loads = [x for x in (busy, pps / cap if pps is not None and cap else None)
                 if x is not None]
        # a starved worker: frames wait and it has not taken any for the stall threshold (its
        # busy share reads idle; the ring overflows only later). Needs no previous sample.
        stalled = f.rx_waiting > 0 and f.stalled_ns >= self.function_stall_ns
        if not loads and not dropped and not stalled:
            return []
        rho = max(loads, default=1.0)
        s = self._get(f"f/{key}", DetectionKind.DETECTION_KIND_FUNCTION_OVERLOAD,
                      f.function_name, self.function_warn_rho, self.function_min_duration_ns)
        s.labels = {"node_id": node, "function_name": f.function_name,
                    "instance": str(f.instance), "core": str(f.core)}
        extra = []
        if busy is not None:
            extra.append(ev("busy_ratio", busy, self.function_warn_rho, 0.0, "ratio"))
        if pps is not None and cap:
            extra.append(ev("rate_pps", pps, cap, 0.0, "pps"))
        extra.append(ev("rx_dropped", dropped, 0.0, 0.0, "packets"))
        extra.append(ev("stalled_ns", f.stalled_ns, self.function_stall_ns, 0.0, "ns"))
        extra.append(ev("rx_waiting", f.rx_waiting, 0.0, 0.0, "packets"))
        now = "rx_dropped" if dropped else "stalled" if stalled else None
        return self._update(s, t, rho, extra, now=now)

    def evict(self, now_ns: int) -> int:
        idle = [k for k, s in self.subjects.items() if now_ns - s.last_seen > self.idle_ns]
        for k in idle:
            del self.subjects[k]
        for k in [k for k, v in self._fn_last.items() if now_ns - v[0] > self.idle_ns]:
            del self._fn_last[k]
        return len(idle)
