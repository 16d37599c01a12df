"""L4S abuse (detectors/l4s.py) on hand-made flows, one record per 0.5 s bin: each rule at its
thresholds, what it reports, once per episode, and the bounded flow table."""

from __future__ import annotations

import pytest
from cgloop.analytics.detectors import L4sAbuseDetector, make_detection
from cgloop.v1.common_pb2 import FiveTuple
from cgloop.v1.detection_pb2 import DetectionKind as K
from cgloop.v1.detection_pb2 import Severity
from cgloop.v1.flow_pb2 import FlowRecord

NS = 1_000_000_000
BIN = NS // 2
T0 = 1_000 * NS  # a whole number of bins


def _slow(**kw) -> L4sAbuseDetector:
    """The 0.5 s x 5 s window alone (these records are one per 0.5 s bin; the fast verdict
    over 100 ms bins has tests of its own below)."""
    return L4sAbuseDetector(fast_bins=0, **kw)


def ft(port: int = 5000) -> FiveTuple:
    return FiveTuple(
        src_addr=bytes([10, 0, 0, 1]), dst_addr=bytes([10, 0, 0, 2]), src_port=port,
        dst_port=443, ip_protocol=17,
    )  # fmt: skip


def rec(i, packets=100, nbytes=100_000, ect1=70, ce=30, burst=0, port=5000, offset=0):
    start = T0 + i * BIN + offset
    return FlowRecord(
        five_tuple=ft(port), interval_start_ns=start, interval_end_ns=start + BIN // 2,
        packets=packets, bytes=nbytes, ecn_ect1_packets=ect1, ecn_ce_packets=ce,
        max_burst_packets=burst,
    )  # fmt: skip


def run(det: L4sAbuseDetector, records: list[FlowRecord]) -> list[tuple[int, object]]:
    """(index of the record that produced it, detection)."""
    return [(i, d) for i, r in enumerate(records) for d in det.on_flow(r)]


def evidence(d) -> dict[str, tuple[float, float, float, str]]:
    return {e.name: (e.value, e.threshold, e.baseline, e.unit) for e in d.evidence}


def test_unresponsive_ecn_fires_once_the_window_is_complete() -> None:
    det = _slow()
    hits = run(det, [rec(i) for i in range(13)])
    # record 10 opens bin 10: bins 0-9 are complete, a full window
    assert [i for i, _ in hits] == [10], "one detection per episode"
    d = hits[0][1]
    assert d.kind == K.DETECTION_KIND_L4S_UNRESPONSIVE_ECN and d.detector == "l4s-abuse"
    assert d.severity == Severity.SEVERITY_MAJOR
    assert d.flow == ft()
    assert (d.window_start_ns, d.window_end_ns) == (T0, T0 + 10 * BIN)
    assert d.confidence == pytest.approx(0.5 + (0.3 - 0.2) + 0.25 * (1.0 - 0.8))
    ev = evidence(d)
    assert ev["ce_fraction"] == pytest.approx((0.3, 0.2, 0.0, "ratio"))
    assert ev["l_queue_share"] == pytest.approx((1.0, 0.5, 0.0, "ratio"))
    assert ev["rate_response"] == pytest.approx((1.0, 0.8, 1.0, "ratio"))
    assert ev["rate_bps"] == pytest.approx((1.6e6, 2e5, 1.6e6, "bps"))
    assert list(ev) == ["ce_fraction", "l_queue_share", "rate_response", "rate_bps", "decision_s"]
    # decided by record 10, which ends 10.5 bins after the flow's first record started
    assert ev["decision_s"] == pytest.approx((5.25, 5.0, 0.0, "s"))
    # the episode starts with the window: its id is the one a replay of it gets
    kind = K.DETECTION_KIND_L4S_UNRESPONSIVE_ECN
    assert d.id == make_detection(kind, 0, 0, [], "l4s-abuse", (0, 0), ft(), T0).id
    assert L4sAbuseDetector().max_flows == 50_000


@pytest.mark.parametrize(
    ("kw", "fires"),
    [
        ({"ce": 20, "ect1": 80}, True),  # CE fraction exactly the threshold
        ({"ce": 19, "ect1": 81}, False),
        ({"ce": 30, "ect1": 20}, True),  # L-queue share exactly one half
        ({"ce": 30, "ect1": 19}, False),
        ({"nbytes": 12_500}, True),  # exactly 200 kbit/s
        ({"nbytes": 12_499}, False),
    ],
)
def test_unresponsive_ecn_thresholds(kw: dict, fires: bool) -> None:
    hits = run(_slow(), [rec(i, **kw) for i in range(11)])
    kinds = [d.kind for _, d in hits]
    assert (K.DETECTION_KIND_L4S_UNRESPONSIVE_ECN in kinds) is fires, hits


@pytest.mark.parametrize(("second_half_bytes", "fires"), [(80_000, True), (79_000, False)])
def test_a_flow_that_cuts_its_rate_responds(second_half_bytes: int, fires: bool) -> None:
    records = [rec(i, nbytes=100_000 if i < 5 else second_half_bytes) for i in range(11)]
    assert bool(run(_slow(), records)) is fires


def test_a_silent_first_half_counts_as_no_response() -> None:
    records = [rec(i, nbytes=0 if i < 5 else 200_000) for i in range(11)]
    ((_, d),) = run(_slow(), records)
    assert evidence(d)["rate_response"][0] == 1.0
    assert evidence(d)["rate_bps"][:3] == pytest.approx((1.6e6, 2e5, 0.0))


def test_an_episode_ends_when_the_flow_responds_and_a_new_one_alerts_again() -> None:
    det = _slow(window_bins=2)
    hits = run(det, [rec(0), rec(1), rec(2), rec(3, ce=0), rec(4, ce=0), rec(5), rec(6), rec(7)])
    assert [i for i, _ in hits] == [2, 7]
    assert hits[1][1].window_start_ns == T0 + 5 * BIN


def test_no_packets_no_judgement() -> None:
    assert run(_slow(), [rec(i, packets=0, ect1=0, ce=0) for i in range(12)]) == []


def test_records_of_one_bin_add_up() -> None:
    det = _slow()
    det.on_flow(rec(0, packets=10, nbytes=1000, ect1=4, ce=1, burst=3))
    det.on_flow(rec(0, packets=5, nbytes=500, ect1=2, ce=2, burst=9, offset=BIN // 2))
    det.on_flow(rec(0, packets=1, nbytes=50, ect1=0, ce=0, burst=2, offset=BIN // 4))
    (st,) = det.flows.values()
    (b,) = st.bins
    assert (b.start, b.packets, b.bytes, b.ect1, b.ce, b.max_burst) == (T0, 16, 1550, 6, 3, 9)
    assert st.last_seen == T0 + BIN // 4 + BIN // 2
    for i in range(1, 20):
        det.on_flow(rec(i))
    assert len(st.bins) == 11 and st.bins[0].start == T0 + 9 * BIN


def _bursty(i: int, burst: int, bursty_bins=(2, 5, 8), **kw) -> FlowRecord:
    return rec(i, burst=burst if i in bursty_bins else 1, **kw)


def test_micro_bursts_in_the_l_queue() -> None:
    det = _slow()
    ((i, d),) = run(det, [_bursty(i, 16, ect1=100, ce=0) for i in range(12)])
    assert i == 10
    assert d.kind == K.DETECTION_KIND_L4S_MICROBURST and d.severity == Severity.SEVERITY_MINOR
    assert d.confidence == pytest.approx(0.6)
    ev = evidence(d)
    assert ev["max_burst_packets"] == (16.0, 16.0, 0.0, "packets")
    assert ev["bursty_bins"] == (3.0, 3.0, 0.0, "bins")
    assert ev["l_queue_share"] == (1.0, 0.5, 0.0, "ratio")
    assert ev["rate_cv"] == (0.0, 0.5, 0.0, "ratio")
    assert run(_slow(), [_bursty(i, 15, ect1=100, ce=0) for i in range(12)]) == []
    two = [_bursty(i, 16, bursty_bins=(2, 5), ect1=100, ce=0) for i in range(12)]
    assert run(_slow(), two) == []


def _classic(i: int, burst: int, erratic: bool) -> FlowRecord:
    nbytes = 100_000 if not erratic or i % 2 else 10_000
    return _bursty(i, burst, nbytes=nbytes, ect1=0, ce=0)


def test_classic_queue_bursts_count_only_when_the_rate_is_erratic() -> None:
    ((i, d),) = run(_slow(), [_classic(i, 48, erratic=True) for i in range(12)])
    assert d.kind == K.DETECTION_KIND_CLASSIC_QUEUE_BURST and i == 10
    ev = evidence(d)
    assert ev["max_burst_packets"] == (48.0, 48.0, 0.0, "packets")
    assert ev["l_queue_share"] == (0.0, 0.5, 0.0, "ratio")
    assert ev["rate_cv"][0] == pytest.approx(0.72 / 0.88)
    # a steady stream bursting every frame is video, not an attack
    assert run(_slow(), [_classic(i, 48, erratic=False) for i in range(12)]) == []
    # bursts the L queue would flag are ordinary in the classic one
    assert run(_slow(), [_classic(i, 47, erratic=True) for i in range(12)]) == []


def test_the_flow_table_is_bounded_and_idle_flows_evicted() -> None:
    det = _slow(max_flows=2, idle_ns=10 * NS)
    det.on_flow(rec(0, port=9))
    det.on_flow(rec(2, port=2))
    det.on_flow(rec(4, port=3))  # full, nobody idle: the least recently seen goes
    assert sorted(s.five_tuple.src_port for s in det.flows.values()) == [2, 3]
    last_2 = T0 + 2 * BIN + BIN // 2
    assert det.evict(last_2 + 10 * NS) == 0, "idle exactly idle_ns: kept"
    assert det.evict(last_2 + 10 * NS + 1) == 1
    assert [s.five_tuple.src_port for s in det.flows.values()] == [3]
    assert det.evict(0, force=True) == 1 and det.flows == {}
    assert det.evict(0, force=True) == 0


def test_a_flow_that_speeds_up_is_no_more_suspect_than_a_steady_one() -> None:
    records = [rec(i, nbytes=100_000 if i < 5 else 200_000) for i in range(11)]
    ((_, d),) = run(_slow(), records)
    assert evidence(d)["rate_response"][0] == 2.0
    assert d.confidence == pytest.approx(0.5 + 0.1 + 0.25)


def test_the_response_compares_the_window_halves() -> None:
    # medians: first half (100, 100, 50, 50, 50) = 50 kB, second half 45 kB: 0.9, no response
    sizes = [100_000, 100_000, 50_000, 50_000, 50_000] + [45_000] * 6
    ((_, d),) = run(_slow(), [rec(i, nbytes=n) for i, n in enumerate(sizes)])
    assert evidence(d)["rate_response"][0] == pytest.approx(0.9)


def test_an_unresponsive_and_bursty_flow_gets_both_detections() -> None:
    hits = run(_slow(), [_bursty(i, 16) for i in range(11)])
    assert sorted(d.kind for _, d in hits) == sorted(
        [K.DETECTION_KIND_L4S_UNRESPONSIVE_ECN, K.DETECTION_KIND_L4S_MICROBURST]
    )


def test_a_burst_episode_ends_with_the_bursts() -> None:
    det = _slow(window_bins=3, burst_bins=2)
    bursts = [16, 16, 16, 1, 1, 1, 16, 16, 16]
    hits = run(det, [rec(i, burst=b, ect1=100, ce=0) for i, b in enumerate([*bursts, 1])])
    assert [i for i, _ in hits] == [3, 8]
    assert {d.kind for _, d in hits} == {K.DETECTION_KIND_L4S_MICROBURST}


def test_classic_erratic_threshold_is_inclusive_and_silence_is_not_erratic() -> None:
    # rates 4.8 and 1.6 Mbit/s in turn: coefficient of variation exactly 0.5
    cv_half = [
        _bursty(i, 48, nbytes=300_000 if i % 2 else 100_000, ect1=0, ce=0) for i in range(11)
    ]
    ((_, d),) = run(_slow(), cv_half)
    assert evidence(d)["rate_cv"][0] == 0.5
    # packets counted, no bytes: no rate, nothing erratic about it
    silent = [_bursty(i, 48, nbytes=0, ect1=0, ce=0) for i in range(11)]
    assert run(_slow(), silent) == []


# ---------------------------------------------------------------- the fast verdict (100 ms bins)

FAST = NS // 10


def frec(i, packets=20, nbytes=12_500, ect1=14, ce=6, offset=0):
    """One 100 ms record; 12 500 bytes = 1 Mbit/s, 30 % CE by default."""
    start = T0 + i * FAST + offset
    return FlowRecord(
        five_tuple=ft(), interval_start_ns=start, interval_end_ns=start + FAST, packets=packets,
        bytes=nbytes, ecn_ect1_packets=ect1, ecn_ce_packets=ce,
    )  # fmt: skip


def test_the_fast_verdict_comes_once_four_bins_are_covered() -> None:
    hits = run(L4sAbuseDetector(), [frec(i) for i in range(4)])
    assert [i for i, _ in hits] == [3]
    d = hits[0][1]
    assert d.kind == K.DETECTION_KIND_L4S_UNRESPONSIVE_ECN
    assert (d.window_start_ns, d.window_end_ns) == (T0, T0 + 4 * FAST)
    ev = evidence(d)
    assert ev["decision_s"] == pytest.approx((0.4, 0.4, 0.0, "s"))
    assert ev["ce_fraction"][0] == pytest.approx(0.3)
    assert ev["rate_bps"][0] == pytest.approx(1e6)
    assert run(L4sAbuseDetector(), [frec(i) for i in range(3)]) == [], "three bins: no verdict"


def test_a_flow_starting_mid_bin_is_judged_from_its_first_bin() -> None:
    hits = run(L4sAbuseDetector(), [frec(i, offset=FAST // 2) for i in range(5)])
    assert [i for i, _ in hits] == [3]
    # records end at 0.45 s: the bins from 0 to 0.4 s are covered, 0.4 s after its start
    assert evidence(hits[0][1])["decision_s"][0] == pytest.approx(0.4)


@pytest.mark.parametrize(
    ("kw", "fires"),
    [
        ({}, True),
        ({"ce": 3, "ect1": 17}, False),  # 15 % CE: below the threshold
        ({"ce": 6, "ect1": 0}, False),  # 30 % of the packets in the L queue: a classic flow
        ({"nbytes": 2_000}, False),  # 160 kbit/s: too sparse to have to respond
    ],
)
def test_the_fast_verdict_applies_the_unresponsive_ecn_rule(kw: dict, fires: bool) -> None:
    assert bool(run(L4sAbuseDetector(), [frec(i, **kw) for i in range(4)])) is fires


def test_a_flow_that_halves_its_rate_under_ce_gets_no_fast_verdict() -> None:
    sizes = [12_500, 12_500, 6_000, 6_000]
    assert run(L4sAbuseDetector(), [frec(i, nbytes=n) for i, n in enumerate(sizes)]) == []


def test_one_episode_until_both_windows_are_clean_then_a_new_one() -> None:
    abusive = [frec(i) for i in range(60)]  # 6 s
    clean = [frec(i, ce=0, ect1=20) for i in range(60, 120)]  # 6 s: the 5 s window clears
    again = [frec(i) for i in range(120, 130)]
    hits = run(L4sAbuseDetector(), abusive + clean + again)
    # record 122 covers bins 119-122: one clean bin and three at 30 % CE, 22.5 % in all
    assert [i for i, _ in hits] == [3, 122]
    assert len(run(L4sAbuseDetector(), abusive)) == 1, "no repeat within an episode"


def test_silent_bins_count_as_silence() -> None:
    # packets in bins 0 and 3 only: the window is half silent, its mean rate 0.5 Mbit/s
    recs = [frec(0), frec(3)]
    ((_, d),) = run(L4sAbuseDetector(), recs)
    assert evidence(d)["rate_bps"][0] == pytest.approx(0.5e6)
