"""Detection records and alert suppression (detectors/base.py), value by value.

Written against the surviving mutants of bench/mutation (mutmut): every field a consumer keys
on (the id, the subject, the header) is checked exactly, and the suppressor at its boundaries.
"""

from __future__ import annotations

import time

import pytest
from cgloop.analytics.detectors.base import (
    DETECTOR_VERSION,
    Suppressor,
    ev,
    make_detection,
    now_ns,
    subject_text,
)
from cgloop.contracts import SCHEMA_VERSION
from cgloop.v1.common_pb2 import FiveTuple
from cgloop.v1.detection_pb2 import Detection, QueueRef

FT = FiveTuple(
    src_addr=bytes([10, 0, 0, 1]), dst_addr=bytes([10, 0, 0, 2]), src_port=1000, dst_port=2000,
    ip_protocol=17,
)  # fmt: skip
QUEUE = QueueRef(node_id="n", interface_name="i", queue_id=1)
NS = 1_000_000_000


def test_subject_text_per_kind_of_subject() -> None:
    assert subject_text(FT) == "0a040a00000112040a00000218e80720d00f2811"
    assert subject_text(QUEUE) == "q/n/i/1"
    assert subject_text("node1") == "node1"


def test_detection_ids_are_stable_per_detector_kind_subject_and_episode() -> None:
    # Golden ids: a replay of the same episode, in any process, must give the same id.
    assert make_detection(3, 2, 0.5, [], "slo", (1, 2), FT, 7).id == (
        "ffc5b99f-fc96-58dd-809d-a5dae46b6c03"
    )
    assert make_detection(3, 2, 0.5, [], "slo", (1, 2), QUEUE, 7).id == (
        "705f4b70-07b0-5781-9d52-244d8018c7aa"
    )
    assert make_detection(3, 2, 0.5, [], "slo", (1, 2), "node1", 7).id == (
        "e662c066-f01b-5450-b7f4-ebcd2152a6db"
    )
    base = make_detection(3, 2, 0.5, [], "slo", (1, 2), FT, 7).id
    # the window, severity, confidence and evidence are not part of the identity
    assert make_detection(3, 1, 0.9, [ev("x", 1, 1, 1, "s")], "slo", (5, 9), FT, 7).id == base
    for other in (
        make_detection(4, 2, 0.5, [], "slo", (1, 2), FT, 7),
        make_detection(3, 2, 0.5, [], "l4s", (1, 2), FT, 7),
        make_detection(3, 2, 0.5, [], "slo", (1, 2), FT, 8),
        make_detection(3, 2, 0.5, [], "slo", (1, 2), "node1", 7),
    ):
        assert other.id != base


def test_detection_fields() -> None:
    evidence = [ev("rho", 0.95, 0.9, 0.5, "ratio")]
    d = make_detection(3, 2, 0.7, evidence, "overload", (100, 250), FT, 90, {"a": "b"})
    assert d.header.schema_version == SCHEMA_VERSION
    assert d.header.source_id == "analytics/overload"
    assert d.header.timestamp_ns == 250
    assert (d.kind, d.severity, d.detector) == (3, 2, "overload")
    assert d.confidence == pytest.approx(0.7)
    assert (d.window_start_ns, d.window_end_ns) == (100, 250)
    assert d.model_version == DETECTOR_VERSION == "2026.11.1"
    assert list(d.evidence) == evidence
    assert dict(d.labels) == {"a": "b"}
    assert d.WhichOneof("subject") == "flow" and d.flow == FT
    q = make_detection(3, 2, 0.7, [], "overload", (1, 2), QUEUE, 1, model_version="m1")
    assert q.WhichOneof("subject") == "queue" and q.queue == QUEUE and q.model_version == "m1"
    n = make_detection(3, 2, 0.7, [], "overload", (1, 2), "edge", 1)
    assert n.WhichOneof("subject") == "node_id" and n.node_id == "edge"


@pytest.mark.parametrize(("given", "kept"), [(-0.5, 0.0), (0.0, 0.0), (1.0, 1.0), (1.5, 1.0)])
def test_confidence_is_clamped_to_unit_interval(given: float, kept: float) -> None:
    assert make_detection(1, 1, given, [], "d", (1, 2), "n", 1).confidence == kept


def test_empty_label_keys_and_values_are_dropped() -> None:
    d = make_detection(1, 1, 0.5, [], "d", (1, 2), "n", 1, {"": "x", "k": "", "p": "gfn"})
    assert dict(d.labels) == {"p": "gfn"}
    assert dict(make_detection(1, 1, 0.5, [], "d", (1, 2), "n", 1).labels) == {}


def test_evidence_values_are_floats() -> None:
    e = ev("bursty_bins", 3, 2, 1, "bins")
    assert (e.name, e.value, e.threshold, e.baseline, e.unit) == (
        "bursty_bins",
        3.0,
        2.0,
        1.0,
        "bins",
    )


def _det(t: int, subject: FiveTuple | QueueRef | str = "n", kind: int = 1, detector: str = "d"):
    return make_detection(kind, 1, 0.5, [], detector, (t - 1, t), subject, 0)


def test_suppressor_alerts_once_per_episode_until_the_realert_time() -> None:
    s = Suppressor(realert_after_ns=10 * NS)
    assert s.allow(_det(100 * NS))
    assert not s.allow(_det(105 * NS))
    # a suppressed repeat moves the mark: the episode is ongoing
    assert s.state() == {f"d|1|{subject_text('n')}": 105 * NS}
    assert not s.allow(_det(114 * NS)), "9 s after the last repeat"
    assert s.allow(_det(124 * NS)), "exactly realert_after after the last one alerts again"
    # an older record (a replay) does not move the mark back
    assert not s.allow(_det(120 * NS))
    assert s.state()[f"d|1|{subject_text('n')}"] == 124 * NS


def test_suppressor_keys_by_detector_kind_and_subject() -> None:
    s = Suppressor()
    assert s.allow(_det(NS))
    assert s.allow(_det(NS, subject="other"))
    assert s.allow(_det(NS, kind=2))
    assert s.allow(_det(NS, detector="e"))
    assert s.allow(_det(NS, subject=FT))
    assert s.allow(_det(NS, subject=QUEUE))
    assert not s.allow(_det(2 * NS, subject=FT))
    assert not s.allow(_det(2 * NS, subject=QUEUE))
    assert len(s.state()) == 6


def test_suppressor_forgets_the_least_recently_alerted_first() -> None:
    s = Suppressor(realert_after_ns=10 * NS, max_keys=2)
    assert Suppressor().realert_after_ns == 60 * NS and Suppressor().max_keys == 100_000
    s.allow(_det(1 * NS, subject="a"))
    s.allow(_det(2 * NS, subject="b"))
    s.allow(_det(3 * NS, subject="a"))  # suppressed, but "a" is now the most recent
    s.allow(_det(4 * NS, subject="c"))  # over max_keys: "b" goes
    assert set(s.state()) == {"d|1|a", "d|1|c"}
    assert s.allow(_det(5 * NS, subject="b")), "forgotten, so it alerts"
    assert set(s.state()) == {"d|1|c", "d|1|b"}


def test_suppressor_state_survives_a_restart_oldest_first() -> None:
    s = Suppressor(max_keys=2)
    s.load({"d|1|a-late": 9 * NS, "d|1|b-early": 1 * NS})
    assert list(s.last) == ["d|1|b-early", "d|1|a-late"], "by time, not by key"
    assert not s.allow(_det(10 * NS, subject="a-late"))
    s.allow(_det(11 * NS, subject="new"))
    assert set(s.state()) == {"d|1|a-late", "d|1|new"}


def test_a_detection_without_subject_is_keyed_by_detector_and_kind() -> None:
    s = Suppressor()
    bare = Detection(detector="d", kind=1, window_end_ns=NS)
    assert s.allow(bare)
    assert s.state() == {"d|1|": NS}
    assert not s.allow(Detection(detector="d", kind=1, window_end_ns=2 * NS))


def test_now_ns_is_the_wall_clock() -> None:
    before = time.time_ns()
    assert before <= now_ns() <= time.time_ns()
