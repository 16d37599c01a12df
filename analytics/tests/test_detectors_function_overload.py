"""Function and node overload from node samples (detectors/overload.py): a chain function
instance by its AF_XDP worker's busy share, its receive ring's drops and its worker's stall
with frames waiting, a node by its busiest core; what the detections say for the policies
(labels, subjects) and that instances, nodes and functions never stand for each other."""

from __future__ import annotations

import pytest
from cgloop.analytics.detectors import QueueOverloadDetector, Suppressor
from cgloop.v1.common_pb2 import RecordHeader
from cgloop.v1.detection_pb2 import DetectionKind as K
from cgloop.v1.detection_pb2 import Severity
from cgloop.v1.node_pb2 import CoreSample, FunctionCounters, NodeSample

NS = 1_000_000_000
MS = 1_000_000
T0 = 1_000 * NS


def fn(name="dpi", instance=0, core=3, busy=None, dropped=0, packets=0, waiting=0,
       stalled_ms=0) -> FunctionCounters:
    f = FunctionCounters(function_name=name, instance=instance, core=core, rx_dropped=dropped,
                         packets=packets, rx_waiting=waiting, stalled_ns=stalled_ms * MS)
    if busy is not None:
        f.busy_ratio = busy
    return f


def sample(t_ms: int, *functions, node="edge1", cores=()) -> NodeSample:
    return NodeSample(header=RecordHeader(timestamp_ns=T0 + t_ms * MS), node_id=node,
                      functions=list(functions),
                      cores=[CoreSample(core=c, utilization=u) for c, u in cores])


def evidence(d) -> dict[str, tuple[float, float, float, str]]:
    return {e.name: (e.value, e.threshold, e.baseline, e.unit) for e in d.evidence}


def feed(det, series) -> list[tuple[int, object]]:
    return [(t, d) for t, s in series for d in det.on_node(s)]


def test_a_busy_instance_fires_after_the_function_duration() -> None:
    det = QueueOverloadDetector()
    assert (det.function_warn_rho, det.function_min_duration_ns) == (0.85, 300 * MS)
    series = [(t, sample(t, fn(busy=0.97))) for t in range(0, 700, 100)]
    hits = feed(det, series)
    assert [t for t, _ in hits] == [300], "0.85 held 300 ms, once"
    d = hits[0][1]
    assert d.kind == K.DETECTION_KIND_FUNCTION_OVERLOAD and d.detector == "overload"
    assert d.WhichOneof("subject") == "function_name" and d.function_name == "dpi"
    labels = dict(d.labels)
    assert int(labels.pop("episode")) <= d.window_end_ns  # the episode's start names it
    assert labels == {"node_id": "edge1", "function_name": "dpi", "instance": "0",
                      "core": "3", "trigger": "sustained"}
    assert d.severity == Severity.SEVERITY_MAJOR
    assert evidence(d)["busy_ratio"] == pytest.approx((0.97, 0.85, 0.0, "ratio"))
    assert evidence(d)["rx_dropped"] == (0.0, 0.0, 0.0, "packets")


def test_a_rise_toward_saturation_fires_ahead_of_it() -> None:
    det = QueueOverloadDetector()
    series = [(t, sample(t, fn(busy=b))) for t, b in
              ((0, 0.5), (100, 0.7), (200, 0.8), (300, 0.84), (400, 0.86))]
    ((t, d),) = feed(det, series)
    assert t == 300 and d.labels["trigger"] == "trend", "before the 0.85 level is reached"


def test_just_below_the_level_or_too_short_stays_silent() -> None:
    det = QueueOverloadDetector()
    assert feed(det, [(t, sample(t, fn(busy=0.84))) for t in range(0, 2000, 100)]) == []
    short = QueueOverloadDetector()
    # 250 ms above, then a dip: the duration starts again
    flaps = [0.9, 0.9, 0.9, 0.8, 0.9, 0.9, 0.9, 0.5]
    assert feed(short, [(i * 100, sample(i * 100, fn(busy=b))) for i, b in enumerate(flaps)]) \
        == []


def test_a_ring_overflow_fires_at_once_and_is_critical() -> None:
    det = QueueOverloadDetector()
    # the first sample's counter says nothing about this interval; growth does
    assert det.on_node(sample(0, fn(busy=0.3, dropped=40))) == []
    assert det.on_node(sample(100, fn(busy=0.3, dropped=40))) == []
    (d,) = det.on_node(sample(200, fn(busy=0.4, dropped=57)))
    assert d.labels["trigger"] == "rx_dropped" and d.severity == Severity.SEVERITY_CRITICAL
    assert evidence(d)["rx_dropped"][0] == 17
    assert d.window_end_ns == T0 + 200 * MS
    # still dropping: the same episode; load gone and no drops: cleared, then fires again
    assert det.on_node(sample(300, fn(busy=0.4, dropped=80))) == []
    assert det.on_node(sample(400, fn(busy=0.1, dropped=80))) == []
    (again,) = det.on_node(sample(500, fn(busy=0.1, dropped=81)))
    assert again.id != d.id


def test_a_starved_worker_fires_in_the_first_sample_after_the_onset() -> None:
    """The lab's fault: a real-time hog takes the worker's core at 130 ms. The worker does
    nothing, so its busy share reads idle and its ring (2048 frames) has not overflowed at a
    stream's 1 frame/ms; frames wait and the stall passes 50 ms by the 200 ms sample."""
    det = QueueOverloadDetector()
    assert det.function_stall_ns == 50 * MS
    assert det.on_node(sample(0, fn(busy=0.3, packets=100))) == []
    (d,) = det.on_node(sample(200, fn(busy=0.06, packets=230, waiting=70, stalled_ms=70)))
    assert d.kind == K.DETECTION_KIND_FUNCTION_OVERLOAD and d.function_name == "dpi"
    assert d.labels["trigger"] == "stalled" and d.severity == Severity.SEVERITY_CRITICAL
    assert d.window_end_ns == T0 + 200 * MS and d.labels["episode"] == str(T0 + 200 * MS)
    e = evidence(d)
    assert e["stalled_ns"] == (70 * MS, 50 * MS, 0.0, "ns")
    assert e["rx_waiting"] == (70.0, 0.0, 0.0, "packets")
    assert e["rx_dropped"][0] == 0, "before any ring overflow"
    assert e["busy_ratio"][0] == pytest.approx(0.06), "the starved worker reads idle"


def test_a_stall_needs_no_previous_sample_of_the_instance() -> None:
    det = QueueOverloadDetector()
    (d,) = det.on_node(sample(0, fn(waiting=5, stalled_ms=120)))
    assert d.labels["trigger"] == "stalled"


def test_no_stall_without_frames_waiting_or_below_the_threshold() -> None:
    det = QueueOverloadDetector()
    # an agent reads 0 with an empty ring; the detector does not rely on it
    assert det.on_node(sample(0, fn(busy=0.0, waiting=0, stalled_ms=900))) == []
    # a worker that keeps up reads at most its 10 ms sleep between looks at the ring
    assert det.on_node(sample(200, fn(busy=0.1, waiting=3, stalled_ms=10))) == []
    assert det.on_node(sample(400, fn(busy=0.1, waiting=3, stalled_ms=49))) == []
    lower = QueueOverloadDetector(function_stall_ns=5 * MS)
    (d,) = lower.on_node(sample(0, fn(busy=0.1, waiting=3, stalled_ms=10)))
    assert evidence(d)["stalled_ns"][1] == 5 * MS
    with pytest.raises(ValueError, match="function_stall_ns"):
        QueueOverloadDetector(function_stall_ns=0)


def test_a_stall_is_one_episode_that_clears_when_the_worker_runs_again() -> None:
    det = QueueOverloadDetector()
    (d,) = det.on_node(sample(0, fn(busy=0.0, waiting=60, stalled_ms=60)))
    # still starved: the same episode
    assert det.on_node(sample(200, fn(busy=0.0, waiting=260, stalled_ms=260))) == []
    # the core back: the ring drained, the worker idle again: the episode ends ...
    assert det.on_node(sample(400, fn(busy=0.2, waiting=0, stalled_ms=0))) == []
    assert det.on_node(sample(600, fn(busy=0.1))) == []
    # ... and a new starvation is a new episode
    (again,) = det.on_node(sample(800, fn(busy=0.0, waiting=55, stalled_ms=55)))
    assert again.labels["trigger"] == "stalled" and again.id != d.id


def test_a_counter_that_went_back_is_a_restart_not_a_drop() -> None:
    det = QueueOverloadDetector()
    det.on_node(sample(0, fn(busy=0.2, dropped=500)))
    assert det.on_node(sample(100, fn(busy=0.2, dropped=3))) == []


def test_instances_and_nodes_are_subjects_of_their_own() -> None:
    det = QueueOverloadDetector()
    sup = Suppressor()
    out = []
    for t in range(0, 600, 100):
        out += det.on_node(sample(t, fn(instance=0, busy=0.95), fn(instance=1, busy=0.95)))
        out += det.on_node(sample(t, fn(instance=0, busy=0.95), node="edge2"))
    assert sorted((d.labels["node_id"], d.labels["instance"]) for d in out) == [
        ("edge1", "0"), ("edge1", "1"), ("edge2", "0")]
    assert len({d.id for d in out}) == 3, "the same function elsewhere is another episode"
    assert all(sup.allow(d) for d in out), "one does not suppress the other"


def test_the_rate_model_and_the_busy_share_take_the_higher() -> None:
    det = QueueOverloadDetector(capacity_pps={"dpi": 1000.0})
    det.on_node(sample(0, fn(busy=0.2, packets=0)))
    out = []
    for t in range(100, 600, 100):  # 950 pps against 1000: 0.95, busy only 0.2
        out += det.on_node(sample(t, fn(busy=0.2, packets=95 * t // 100)))
    (d,) = out
    assert evidence(d)["rho"][0] == pytest.approx(0.95)
    assert evidence(d)["rate_pps"][:2] == pytest.approx((950.0, 1000.0))


def test_node_overload_names_its_busiest_core() -> None:
    det = QueueOverloadDetector()
    out = feed(det, [(t, sample(t, cores=((0, 0.3), (2, 0.93), (3, 0.5))))
                     for t in range(0, 1200, 200)])
    ((t, d),) = out
    assert t == 1000, "R_max: the busiest core >= 0.9 held 1 s"
    assert d.kind == K.DETECTION_KIND_NODE_OVERLOAD and d.node_id == "edge1"
    labels = dict(d.labels)
    assert int(labels.pop("episode")) <= d.window_end_ns  # the episode's start names it
    assert labels == {"node_id": "edge1", "core": "2", "trigger": "sustained"}


def test_a_starved_function_comes_before_its_nodes_overload_in_one_sample() -> None:
    """One hog overloads the node and starves its chain function: the function's detection
    (the more specific diagnosis) leads, so an engine deciding in order acts on it first."""
    det = QueueOverloadDetector()
    kinds = []
    for t in range(0, 1600, 200):
        dropped = 0 if t < 1000 else 100 * t  # the ring overflows as the node's second ends
        for d in det.on_node(sample(t, fn(dropped=dropped), cores=[(0, 0.2), (1, 0.97)])):
            kinds.append((t, d.kind))
    both = [t for t, _ in kinds if [t2 for t2, _ in kinds].count(t) == 2]
    assert both, kinds  # one sample raised both
    same = [k for t, k in kinds if t == both[0]]
    assert same == [K.DETECTION_KIND_FUNCTION_OVERLOAD, K.DETECTION_KIND_NODE_OVERLOAD], kinds
