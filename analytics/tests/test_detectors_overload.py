"""Queue, node and function overload (detectors/overload.py) on hand-made series: when it fires
(sustained or trend), exactly, what it says, hysteresis, and its bounded state."""

from __future__ import annotations

import pytest
from cgloop.analytics.detectors import QueueOverloadDetector, make_detection
from cgloop.v1.common_pb2 import RecordHeader
from cgloop.v1.detection_pb2 import DetectionKind as K
from cgloop.v1.detection_pb2 import QueueRef, Severity
from cgloop.v1.int_pb2 import IntQueueRecord
from cgloop.v1.node_pb2 import CoreSample, FunctionCounters, NodeSample

NS = 1_000_000_000
MS = 1_000_000
T0 = 1_000 * NS  # record times are wall-clock ns, never 0
QLABELS = {"switch_id": "1", "egress_port": "2", "queue_id": "3"}  # queue(): no names known


def queue(t_ns: int, util: float, latency_ns: int = 0, cells: int = 7, port: int = 2):
    return IntQueueRecord(
        header=RecordHeader(timestamp_ns=T0 + t_ns), switch_id=1, egress_port=port, queue_id=3,
        egress_tx_utilization=util, queue_latency_ns=latency_ns, queue_occupancy_cells=cells,
    )  # fmt: skip


def node(t_ns: int, cores=(), functions=()) -> NodeSample:
    return NodeSample(
        header=RecordHeader(timestamp_ns=T0 + t_ns),
        node_id="edge",
        cores=[CoreSample(core=i, utilization=u) for i, u in enumerate(cores)],
        functions=[FunctionCounters(function_name=n, packets=p) for n, p in functions],
    )


def feed(det: QueueOverloadDetector, series: list[tuple[float, float]], **kw) -> list:
    """(seconds, rho) samples of one queue; (time of each detection, detection)."""
    out = []
    for t_s, rho in series:
        for d in det.on_int_queue(queue(int(t_s * NS), rho, **kw)):
            out.append((t_s, d))
    return out


def evidence(d) -> dict[str, tuple[float, float, float, str]]:
    return {e.name: (e.value, e.threshold, e.baseline, e.unit) for e in d.evidence}


def test_sustained_load_fires_after_min_duration_exactly() -> None:
    det = QueueOverloadDetector()
    hits = feed(det, [(0.0, 0.95), (0.5, 0.95), (1.0, 0.95), (1.5, 0.95)])
    assert [t for t, _ in hits] == [1.0], "fires once, when rho held >= warn for 1 s"
    d = hits[0][1]
    assert d.kind == K.DETECTION_KIND_QUEUE_CONGESTION and d.detector == "overload"
    assert d.severity == Severity.SEVERITY_MAJOR
    assert d.queue == QueueRef(node_id="1", interface_name="2", queue_id=3)
    assert dict(d.labels) == {**QLABELS, "trigger": "sustained", "episode": str(T0)}
    assert (d.window_start_ns, d.window_end_ns) == (T0, T0 + NS)
    assert d.confidence == pytest.approx(0.5 + 0.5 * 0.95)
    ev = evidence(d)
    assert ev["rho"] == pytest.approx((0.95, 0.9, 0.95, "ratio"))
    assert ev["predicted_rho"] == pytest.approx((0.95, 1.0, 0.95, "ratio"))
    assert ev["seconds_to_overload"] == (1e9, 2.0, 0.0, "s")
    assert ev["above_floor_s"] == pytest.approx((1.0, 0.5, 0.0, "s"))
    assert ev["queue_latency_ns"] == (0.0, 5e6, 0.0, "ns")
    assert ev["queue_occupancy_cells"] == (7.0, 0.0, 0.0, "cells")
    assert list(ev)[:4] == ["rho", "predicted_rho", "seconds_to_overload", "above_floor_s"]


def test_warn_and_clear_thresholds_are_inclusive_and_exclusive() -> None:
    det = QueueOverloadDetector()
    # exactly warn_rho counts as above it
    assert [t for t, _ in feed(det, [(0, 0.9), (0.5, 0.9), (1.0, 0.9)])] == [1.0]
    # in the episode: exactly clear_rho does not clear it, below does
    assert feed(det, [(1.5, 0.5), (2.0, 0.95), (2.5, 0.95), (3.0, 0.95)]) == []
    assert feed(det, [(3.5, 0.49)]) == []
    assert [t for t, _ in feed(det, [(4.0, 0.95), (4.5, 0.95), (5.0, 0.95)])] == [5.0]


def test_a_dip_below_warn_restarts_the_duration() -> None:
    det = QueueOverloadDetector()
    assert feed(det, [(0, 0.95), (0.6, 0.95), (0.9, 0.89), (1.2, 0.95), (2.0, 0.95)]) == []
    assert [t for t, _ in feed(det, [(2.2, 0.95)])] == [2.2]


def test_over_capacity_is_critical() -> None:
    det = QueueOverloadDetector()
    ((_, d),) = feed(det, [(0, 1.2), (1.0, 1.2)])
    assert d.severity == Severity.SEVERITY_CRITICAL and d.confidence == 1.0


def test_a_rising_trend_fires_ahead_of_overload() -> None:
    """rho = 0.6 + 0.2 t: with 4 samples over the floor for >= 0.5 s the fitted line reaches
    1.0 in 1.25 s, inside the 2 s horizon, long before rho itself is >= 0.9."""
    det = QueueOverloadDetector()
    hits = feed(det, [(t, 0.6 + 0.2 * t) for t in (0.0, 0.25, 0.5, 0.75, 1.0)])
    assert [t for t, _ in hits] == [0.75]
    d = hits[0][1]
    assert dict(d.labels) == {**QLABELS, "trigger": "trend", "episode": str(T0)}
    assert d.severity == Severity.SEVERITY_MAJOR
    assert d.window_start_ns == T0 and d.window_end_ns == T0 + int(0.75 * NS)
    ev = evidence(d)
    assert ev["rho"][0] == pytest.approx(0.75)
    assert ev["rho"][2] == pytest.approx(0.675)  # median of the window's samples
    assert ev["predicted_rho"][:3] == pytest.approx((1.15, 1.0, 0.75))
    assert ev["seconds_to_overload"][0] == pytest.approx(1.25)
    assert ev["above_floor_s"][0] == pytest.approx(0.75)
    assert d.confidence == 1.0


def test_a_slower_trend_or_a_lone_spike_is_not_extrapolated() -> None:
    # reaches 1.0 only in 3.25 s: beyond the horizon
    slow = QueueOverloadDetector()
    assert feed(slow, [(t, 0.6 + 0.1 * t) for t in (0.0, 0.25, 0.5, 0.75)]) == []
    # a steep rise from below the floor: not yet half the minimum duration above it
    spike = QueueOverloadDetector()
    assert feed(spike, [(0, 0.1), (0.25, 0.1), (0.5, 0.1), (0.75, 0.85)]) == []
    # three samples are too few to fit
    few = QueueOverloadDetector(min_duration_ns=10 * NS)
    assert feed(few, [(0, 0.6), (5.0, 0.8)]) == []
    # falling load never predicts overload
    falling = QueueOverloadDetector()
    assert feed(falling, [(t, 0.89 - 0.05 * t) for t in (0.0, 0.25, 0.5, 0.75, 1.0)]) == []


def test_the_trend_window_is_bounded_in_time() -> None:
    det = QueueOverloadDetector(trend_window_ns=2 * NS)
    feed(det, [(t * 0.5, 0.1) for t in range(10)])
    (s,) = det.subjects.values()
    assert [t - T0 for t, _ in s.samples] == [int(x * NS) for x in (2.5, 3.0, 3.5, 4.0, 4.5)]


def test_queue_delay_over_its_budget_is_load_too() -> None:
    det = QueueOverloadDetector(queue_latency_ns=5 * MS)
    hits = feed(det, [(0, 0.1), (1.0, 0.1)], latency_ns=6 * MS)
    ((_, d),) = hits
    assert d.severity == Severity.SEVERITY_CRITICAL  # 6 ms / 5 ms = 1.2
    assert evidence(d)["rho"][0] == pytest.approx(1.2)
    assert evidence(d)["queue_latency_ns"] == (6e6, 5e6, 0.0, "ns")
    below = QueueOverloadDetector(queue_latency_ns=5 * MS)
    assert feed(below, [(0, 0.1), (1.0, 0.1)], latency_ns=4 * MS) == []


def test_queues_are_told_apart_by_switch_port_and_queue() -> None:
    det = QueueOverloadDetector()
    det.on_int_queue(queue(0, 0.95, port=1))
    det.on_int_queue(queue(0, 0.95, port=2))
    assert set(det.subjects) == {"q/1/1/3", "q/1/2/3"}
    assert det.on_int_queue(queue(NS, 0.95, port=1))[0].queue.interface_name == "1"


def test_a_node_is_as_loaded_as_its_busiest_core() -> None:
    det = QueueOverloadDetector()
    assert det.on_node(node(0, cores=(0.2, 0.95))) == []
    (d,) = det.on_node(node(NS, cores=(0.95, 0.3)))
    assert d.kind == K.DETECTION_KIND_NODE_OVERLOAD and d.node_id == "edge"
    assert evidence(d)["rho"][0] == pytest.approx(0.95)
    assert det.on_node(node(2 * NS)) == [], "no cores: no node sample"


def test_a_function_is_loaded_by_its_packet_rate_over_its_capacity() -> None:
    # the queues' and nodes' level and duration, to see the rate model alone
    det = QueueOverloadDetector(capacity_pps={"dpi": 1000.0}, function_warn_rho=0.9,
                                function_min_duration_ns=NS)
    assert det.on_node(node(0, functions=[("dpi", 0), ("fwd", 0)])) == []
    assert det.on_node(node(0, functions=[("dpi", 500)])) == [], "same time: no rate"
    assert det.on_node(node(NS // 2, functions=[("dpi", 975)])) == []  # 950 pps
    assert det.on_node(node(NS, functions=[("dpi", 1450)])) == []  # 950 pps for 0.5 s
    (d,) = det.on_node(node(3 * NS // 2, functions=[("fwd", 10**9), ("dpi", 1925)]))
    assert d.kind == K.DETECTION_KIND_FUNCTION_OVERLOAD and d.function_name == "dpi"
    labels = dict(d.labels)
    assert int(labels.pop("episode")) <= d.window_end_ns  # the episode's start names it
    assert labels == {"node_id": "edge", "function_name": "dpi", "instance": "0",
                      "core": "0", "trigger": "sustained"}
    assert evidence(d)["rate_pps"] == pytest.approx((950.0, 1000.0, 0.0, "pps"))
    assert evidence(d)["rho"][0] == pytest.approx(0.95)
    assert "f/edge/dpi/0" in det.subjects and "f/edge/fwd/0" not in det.subjects


def test_subjects_are_bounded_and_idle_ones_evicted() -> None:
    assert QueueOverloadDetector().max_subjects == 10_000
    det = QueueOverloadDetector(max_subjects=2, idle_ns=10 * NS)
    det.on_int_queue(queue(1 * NS, 0.1, port=2))
    det.on_int_queue(queue(3 * NS, 0.1, port=1))
    det.on_int_queue(queue(2 * NS, 0.1, port=2))  # seen again, still before port 1
    det.on_int_queue(queue(4 * NS, 0.1, port=3))  # full: the least recently seen (port 2) goes
    assert set(det.subjects) == {"q/1/1/3", "q/1/3/3"}
    assert det.evict(T0 + 13 * NS) == 0, "port 1 idle exactly idle_ns: kept"
    assert det.evict(T0 + 13 * NS + 1) == 1
    assert set(det.subjects) == {"q/1/3/3"}


def test_a_node_sample_reports_every_overload_it_shows() -> None:
    det = QueueOverloadDetector(capacity_pps={"dpi": 100.0, "nat": 100.0},
                                function_min_duration_ns=NS)
    for k in range(4):  # every 0.5 s: the core from 0.5 s, 92 and 96 packets/s from 0.5 s
        cores = (0.95,) if k else ()
        out = det.on_node(
            node(k * NS // 2, cores=cores, functions=[("dpi", 46 * k), ("nat", 48 * k)])
        )
    assert sorted(d.kind for d in out) == [
        K.DETECTION_KIND_NODE_OVERLOAD,
        K.DETECTION_KIND_FUNCTION_OVERLOAD,
        K.DETECTION_KIND_FUNCTION_OVERLOAD,
    ]
    assert {d.node_id or d.function_name for d in out} == {"edge", "dpi", "nat"}
    assert set(det.subjects) == {"n/edge", "f/edge/dpi/0", "f/edge/nat/0"}


def _id(d, start_s: float) -> str:
    return make_detection(d.kind, 0, 0, [], "overload", (0, 0), d.queue, at_ns(start_s)).id


def at_ns(seconds: float) -> int:
    return T0 + int(seconds * NS)


def test_the_episode_starts_when_the_load_crossed_warn() -> None:
    det = QueueOverloadDetector()
    ((t, d),) = feed(det, [(0, 0.5), (0.5, 0.95), (1.0, 0.95), (1.5, 0.95)])
    assert t == 1.5 and d.window_start_ns == T0, "the window is the samples'"
    assert d.id == _id(d, 0.5), "the episode is the breach's"
    ((_, trend),) = feed(
        QueueOverloadDetector(), [(t, 0.6 + 0.2 * t) for t in (0, 0.25, 0.5, 0.75)]
    )
    assert trend.id == _id(trend, 0.0), "a trend's episode starts with its first sample"


def test_exactly_at_capacity_is_critical() -> None:
    ((_, d),) = feed(QueueOverloadDetector(), [(0, 1.0), (0.5, 1.0), (1.0, 1.0)])
    assert d.severity == Severity.SEVERITY_CRITICAL


def test_a_trend_needs_exactly_half_the_duration_above_the_floor() -> None:
    # above the floor from 0.25 s: at 0.75 s exactly 0.5 s
    rising = [(0, 0.45), (0.25, 0.65), (0.5, 0.8), (0.75, 0.89)]
    assert [t for t, _ in feed(QueueOverloadDetector(), rising)] == [0.75]
    # above the floor for 0.4 s only
    early = [(0, 0.1), (0.2, 0.1), (0.4, 0.7), (0.6, 0.8), (0.8, 0.89)]
    assert feed(QueueOverloadDetector(), early) == []


def test_an_imminent_overload_says_how_soon() -> None:
    ((t, d),) = feed(QueueOverloadDetector(), [(t, 0.6 + 0.5 * t) for t in (0, 0.25, 0.5, 0.75)])
    assert t == 0.75
    assert evidence(d)["seconds_to_overload"][0] == pytest.approx(0.05)


def test_a_high_but_falling_load_waits_for_the_duration() -> None:
    det = QueueOverloadDetector()
    falling = [(0, 1.3), (0.25, 1.29), (0.5, 1.28), (0.75, 1.27), (1.0, 1.26)]
    assert [(t, dict(d.labels)) for t, d in feed(det, falling)] == [
        (1.0, {**QLABELS, "trigger": "sustained", "episode": str(T0)})
    ]
