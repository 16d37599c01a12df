"""SLO breaches (detectors/slo.py) on hand-made series: the robust baseline, the CUSUM and the
duration at their thresholds, hysteresis, what a detection reports, the path corroboration of
jitter, and the bounded state."""

from __future__ import annotations

from dataclasses import replace

import pytest
from cgloop.analytics.detectors import SloDetector, make_detection
from cgloop.analytics.detectors.slo import PLATFORM_SLOS, SeriesParams, _Series
from cgloop.slo import GENERIC
from cgloop.v1.common_pb2 import FiveTuple
from cgloop.v1.detection_pb2 import DetectionKind as K
from cgloop.v1.detection_pb2 import Severity
from cgloop.v1.flow_pb2 import FlowRecord, RtpStats

NS = 1_000_000_000
MS = 1_000_000
T0 = 1_000 * NS


def at(seconds: float) -> int:
    return T0 + int(seconds * NS)


def ft(port: int = 49004, reverse: bool = False) -> FiveTuple:
    a, b = bytes([10, 0, 0, 1]), bytes([10, 0, 0, 2])
    if reverse:
        return FiveTuple(src_addr=b, dst_addr=a, src_port=443, dst_port=port, ip_protocol=17)
    return FiveTuple(src_addr=a, dst_addr=b, src_port=port, dst_port=443, ip_protocol=17)


# --- one series ------------------------------------------------------------------------------


def test_baseline_before_any_normal_sample() -> None:
    assert _Series(10.0, True, SeriesParams()).baseline() == pytest.approx((3.0, 1.0))
    assert _Series(8.0, False, SeriesParams()).baseline() == pytest.approx((24.0, 0.8))


def test_baseline_is_the_median_and_scaled_mad_of_normal_samples() -> None:
    s = _Series(10.0, True, SeriesParams())
    for i, x in enumerate([1.0, 2.0, 4.0, 5.0, 6.0]):
        s.update(at(i), x)
    med, sigma = s.baseline()
    assert med == 4.0 and sigma == pytest.approx(2.0 * 1.4826)
    flat = _Series(10.0, True, SeriesParams())
    for i in range(3):
        flat.update(at(i), 2.0)
    assert flat.baseline() == (2.0, 0.5), "MAD 0: floored at 5 % of the threshold"


def test_only_clearly_normal_samples_feed_the_baseline_and_history_is_bounded() -> None:
    s = _Series(10.0, True, SeriesParams(history=3))
    for i, x in enumerate([1.0, 6.99, 7.0, 8.0, 2.0, 3.0]):
        s.update(at(i), x)
    assert list(s.normal) == [6.99, 2.0, 3.0]


def test_an_episode_needs_cusum_and_duration_and_fires_once() -> None:
    s = _Series(10.0, True, SeriesParams())
    for i in range(5):
        assert s.update(at(i), 2.0) is None
    assert s.update(at(5), 12.0) is None  # CUSUM tripped at once, but not for 1 s yet
    assert s.cusum == pytest.approx(19.5)
    assert s.update(at(5.5), 11.0) is None
    hit = s.update(at(6), 11.0)
    assert hit == pytest.approx(
        {"value": 11.0, "peak": 12.0, "baseline": 2.0, "cusum": 54.5, "start": at(5)}
    )
    assert s.in_episode and s.episode_start == at(5)
    assert s.update(at(7), 30.0) is None, "ongoing: no second hit"
    assert s.peak == 30.0


def test_a_dip_under_the_threshold_restarts_the_duration() -> None:
    s = _Series(10.0, True, SeriesParams())
    s.update(at(0), 12.0)
    s.update(at(0.9), 9.0)
    assert s.over_since is None
    s.update(at(1.0), 12.0)
    assert s.update(at(1.9), 12.0) is None
    assert s.update(at(2.0), 12.0)["start"] == at(1.0)


def test_the_cusum_must_exceed_its_decision_interval() -> None:
    p = SeriesParams(min_duration_ns=0, cusum_k=2.0, cusum_h=5.0)
    s = _Series(10.0, True, p)
    assert s.update(at(0), 10.0) is None  # z = (10 - 3) / 1 = 7: cusum 5, not above 5
    assert s.cusum == pytest.approx(5.0)
    assert s.update(at(0.1), 10.0) is not None


def test_hysteresis_clears_after_the_hold_below_the_clear_ratio() -> None:
    s = _Series(10.0, True, SeriesParams())
    s.update(at(0), 12.0)
    assert s.update(at(1), 12.0) is not None
    s.update(at(2), 6.9)
    s.update(at(3), 7.0)  # not below 0.7 x threshold: the hold restarts
    assert s.below_since is None
    s.update(at(4), 6.9)
    s.update(at(5.9), 6.9)
    assert s.in_episode
    s.update(at(6), 6.9)
    assert not s.in_episode and (s.cusum, s.peak, s.below_since) == (0.0, 0.0, None)
    assert list(s.normal) == [], "samples during an episode are not normal"
    s.update(at(7), 12.0)
    assert s.update(at(8), 12.0)["start"] == at(7), "a new episode fires again"


def test_a_downward_series_breaches_below_its_threshold() -> None:
    s = _Series(8.0, False, SeriesParams())
    for i in range(3):
        s.update(at(i), 20.0)
    assert list(s.normal) == [20.0, 20.0, 20.0]
    s.update(at(3), 6.0)
    s.update(at(3.5), 4.0)
    hit = s.update(at(4), 7.0)
    assert hit is not None and hit["peak"] == 4.0 and hit["value"] == 7.0
    assert hit["baseline"] == 20.0


def test_an_uncorroborated_breach_is_held_until_it_is() -> None:
    s = _Series(10.0, True, SeriesParams())
    s.update(at(0), 12.0)
    asked: list[int] = []

    def no() -> bool:
        asked.append(1)
        return False

    assert s.update(at(1), 12.0, no) is None and asked == [1]
    assert s.update(at(2), 12.0, lambda: True)["start"] == at(0)


# --- the detector ------------------------------------------------------------------------------


def rtp_rec(t_s: float, jitter_ms: float = 1.0, lost: int = 0, packets: int = 100,
            nbytes: int = 250_000, five_tuple: FiveTuple | None = None) -> FlowRecord:  # fmt: skip
    return FlowRecord(
        five_tuple=five_tuple or ft(), interval_start_ns=at(t_s - 0.1), interval_end_ns=at(t_s),
        packets=packets, bytes=nbytes,
        rtp=RtpStats(jitter_ns=int(jitter_ms * MS), lost_packets=lost),
    )  # fmt: skip


def evidence(d) -> dict[str, tuple[float, float, float, str]]:
    return {e.name: (e.value, e.threshold, e.baseline, e.unit) for e in d.evidence}


def test_profiles_per_platform() -> None:
    det = SloDetector()
    det.watch(ft(1), "gfn")
    det.watch(ft(2), "nobody-knows")
    det.watch(ft(3), "psn", down=False)
    flows = list(det.flows.values())
    series = [f.series for f in flows]
    assert {m: s.threshold for m, s in series[0].items()} == {
        "latency": 100.0,
        "jitter": 2.0,
        "loss": 0.05,
        "throughput": 15.0,
    }
    assert series[1]["jitter"].threshold == PLATFORM_SLOS[GENERIC].jitter_ms == 5.0
    assert series[2]["loss"].threshold == 0.02 and not flows[2].down
    assert [f.platform for f in flows] == ["gfn", "nobody-knows", "psn"]
    assert series[0]["throughput"].upward is False and series[0]["latency"].upward is True
    assert PLATFORM_SLOS["std"].min_down_mbps == 10.0 and PLATFORM_SLOS["xc"].loss == 0.05


def test_latency_has_its_own_timing() -> None:
    fast = SeriesParams(min_duration_ns=0)
    det = SloDetector(latency_params=fast)
    det.watch(ft(), "gfn")
    (fl,) = det.flows.values()
    assert fl.series["latency"].p is fast and fl.series["jitter"].p is det.params
    plain = SloDetector()
    assert plain.latency_params is plain.params


def test_watch_is_idempotent_and_bounded() -> None:
    assert SloDetector().max_flows == 10_000
    det = SloDetector(max_flows=2)
    det.watch(ft(9), "gfn", t_ns=at(1))
    det.flows[next(iter(det.flows))].series["jitter"].cusum = 3.0
    det.watch(ft(9), "std", t_ns=at(9))
    assert det.flows[next(iter(det.flows))].series["jitter"].cusum == 3.0
    assert det.flows[next(iter(det.flows))].platform == "gfn"
    det.watch(ft(2), "gfn", t_ns=at(3))
    det.watch(ft(3), "gfn", t_ns=at(2))  # full: the least recently seen (port 9) goes
    assert det.watching(ft(2)) and det.watching(ft(3)) and not det.watching(ft(9))


def test_flow_records_feed_jitter_loss_and_downstream_throughput() -> None:
    det = SloDetector()
    assert det.on_flow(rtp_rec(1)) == [], "not watched"
    det.watch(ft(), "gfn", down=True)
    det.on_flow(rtp_rec(1, jitter_ms=1.25, lost=25, packets=75, nbytes=250_000))
    (fl,) = det.flows.values()
    assert list(fl.series["jitter"].normal) == [1.25]
    assert not fl.series["loss"].normal
    assert fl.series["loss"].over_since == at(1)  # 25 / (75 + 25) = 0.25 > 0.05
    assert list(fl.series["throughput"].normal) == [pytest.approx(20.0, rel=1e-9)]  # 250 kB/0.1 s
    assert fl.last_seen == at(1)
    det.on_flow(rtp_rec(2, lost=0, packets=0))
    assert fl.series["loss"].over_since == at(1), "no packets: no loss sample"
    up = SloDetector()
    up.watch(ft(), "gfn", down=False)
    up.on_flow(rtp_rec(1))
    assert not next(iter(up.flows.values())).series["throughput"].normal


def test_a_jitter_episode_without_path_measurements() -> None:
    det = SloDetector()
    det.watch(ft(), "gfn")
    for i in range(5):
        assert det.on_flow(rtp_rec(1 + i * 0.1, jitter_ms=0.5)) == []
    hits = [d for i in range(13) for d in det.on_flow(rtp_rec(2 + i * 0.1, jitter_ms=5.0))]
    (d,) = hits
    assert d.kind == K.DETECTION_KIND_SLO_JITTER and d.detector == "slo"
    assert d.severity == Severity.SEVERITY_MAJOR  # 5 ms peak / 2 ms objective >= 2
    assert dict(d.labels) == {"platform": "gfn", "metric": "jitter"}
    assert d.flow == ft()
    assert (d.window_start_ns, d.window_end_ns) == (at(2), at(3))
    ev = evidence(d)
    assert ev["rtp_jitter_ms"] == pytest.approx((5.0, 2.0, 0.5, "ms"))
    assert ev["peak_rtp_jitter_ms"] == pytest.approx((5.0, 2.0, 0.5, "ms"))
    assert ev["cusum"][1:] == (5.0, 0.0, "sigma")
    assert ev["duration_s"] == pytest.approx((1.0, 1.0, 0.0, "s"))
    assert ev["path_jitter_ms"] == (0.0, 1.0, 0.0, "ms")
    assert ev["path_samples"] == (0.0, 5.0, 0.0, "samples")
    assert d.confidence == pytest.approx(min(1.0, 0.5 + ev["cusum"][0] / 20))
    kind = K.DETECTION_KIND_SLO_JITTER
    assert d.id == make_detection(kind, 0, 0, [], "slo", (0, 0), ft(), at(2)).id


def test_confidence_grows_with_the_cusum() -> None:
    det = SloDetector(params=SeriesParams(min_duration_ns=0, cusum_k=0.0, cusum_h=5.0))
    det.watch(ft(), "std")
    # baseline 1.5 ms +- 0.5 before any normal sample: 6 ms is 9 sigma
    (d,) = det.on_flow(rtp_rec(1, jitter_ms=6.0))
    assert evidence(d)["cusum"][0] == pytest.approx(9.0)
    assert d.confidence == pytest.approx(0.5 + 9.0 / 20)


def test_a_minor_breach_and_a_throughput_breach() -> None:
    det = SloDetector(params=SeriesParams(min_duration_ns=0, cusum_k=0.0, cusum_h=0.5))
    det.watch(ft(), "std")
    (d,) = [d for d in det.on_flow(rtp_rec(1, jitter_ms=6.0, nbytes=1_000_000))]
    assert d.kind == K.DETECTION_KIND_SLO_JITTER and d.severity == Severity.SEVERITY_MINOR
    assert d.confidence == pytest.approx(min(1.0, 0.5 + (3.0 - 0.0) / 2.0))
    # 10 Mbit/s objective; 1 Mbit/s is a tenth: major
    (t,) = det.on_flow(rtp_rec(2, jitter_ms=0.1, nbytes=12_500))
    assert t.kind == K.DETECTION_KIND_SLO_THROUGHPUT and t.severity == Severity.SEVERITY_MAJOR
    assert evidence(t)["down_mbps"][:2] == pytest.approx((1.0, 10.0))
    assert evidence(t)["down_mbps"][3] == "Mbit/s"


@pytest.mark.parametrize(
    ("objective", "mbps", "severity"),
    [
        (10.0, 6.0, Severity.SEVERITY_MINOR),  # 10 / 6 < 2
        (10.0, 4.0, Severity.SEVERITY_MAJOR),
        (1.5, 0.7, Severity.SEVERITY_MAJOR),  # under 1 Mbit/s too
    ],
)
def test_throughput_severity_is_the_shortfall(objective, mbps, severity) -> None:
    det = SloDetector(
        profiles={GENERIC: replace(PLATFORM_SLOS[GENERIC], min_down_mbps=objective)},
        params=SeriesParams(min_duration_ns=0, cusum_k=0.0, cusum_h=0.5),
    )
    det.watch(ft(), "")
    (t,) = det.on_flow(rtp_rec(1, jitter_ms=0.1, nbytes=int(mbps * 12_500)))
    assert t.kind == K.DETECTION_KIND_SLO_THROUGHPUT and t.severity == severity


def test_an_empty_interval_has_no_throughput() -> None:
    det = SloDetector()
    det.watch(ft(), "gfn")
    r = rtp_rec(1)
    r.interval_start_ns = r.interval_end_ns
    assert det.on_flow(r) == []
    assert not next(iter(det.flows.values())).series["throughput"].normal


def test_loss_breach() -> None:
    det = SloDetector(params=SeriesParams(min_duration_ns=0, cusum_k=0.0, cusum_h=0.5))
    det.watch(ft(), "gfn", down=False)
    for i in range(6):  # a steady path holds jitter breaches, never loss ones
        det.on_path_delay(ft(), at(0.5 + i * 0.05), 5 * MS)
    (d,) = det.on_flow(rtp_rec(1, lost=10, packets=90))
    assert d.kind == K.DETECTION_KIND_SLO_LOSS
    assert evidence(d)["loss_fraction"][:2] == pytest.approx((0.1, 0.05))
    assert d.severity == Severity.SEVERITY_MAJOR


def test_latency_samples() -> None:
    det = SloDetector(latency_params=SeriesParams(min_duration_ns=0, cusum_k=0.0, cusum_h=0.5))
    assert det.on_latency(ft(), at(1), 150 * MS) == []
    det.watch(ft(), "gfn")
    assert det.on_latency(ft(), at(1), 50 * MS) == []
    (d,) = det.on_latency(ft(), at(2), 150 * MS)
    assert d.kind == K.DETECTION_KIND_SLO_LATENCY and d.severity == Severity.SEVERITY_MINOR
    assert evidence(d)["latency_ms"][:2] == pytest.approx((150.0, 100.0))
    assert evidence(d)["latency_ms"][3] == "ms"
    assert (d.window_start_ns, d.window_end_ns) == (at(2), at(2))
    assert next(iter(det.flows.values())).last_seen == at(2)
    assert d.evidence[0].value == 150.0, "ns to ms exactly"


def test_path_delays_are_kept_for_watched_conversations_in_a_window() -> None:
    det = SloDetector(path_window_ns=NS)
    det.on_path_delay(ft(), at(0), 5 * MS)
    assert det.paths == {}, "not watched: not kept"
    det.watch(ft(), "gfn")
    det.on_path_delay(ft(reverse=True), at(0), 5 * MS)  # either direction of it
    assert len(det.paths) == 1
    det.on_path_delay(ft(port=1), at(0), 5 * MS)
    det.on_path_delay(ft(port=443), at(0), 5 * MS)
    assert len(det.paths) == 1, "other flows of the same hosts are not the watched one"
    for i in range(1, 6):
        det.on_path_delay(ft(), at(i * 0.25), (5 + i) * MS)
    (samples,) = det.paths.values()
    assert [t for t, _ in samples] == [at(0.25 * i) for i in range(1, 5 + 1)][-5:]
    assert samples[0] == (at(0.25), 6.0)
    det.on_path_delay(ft(), at(2), 5 * MS)
    assert [t for t, _ in samples] == [at(1.0), at(1.25), at(2)]


def test_path_jitter_is_the_median_change_since_the_breach_began() -> None:
    det = SloDetector(path_window_ns=10 * NS, path_min_samples=3)
    det.watch(ft(), "gfn")
    assert det.path_jitter(ft(), at(0), at(9)) is None
    delays = [5, 9, 5, 6, 5, 5, 5]  # ms, at 0..6 s
    for i, d in enumerate(delays):
        det.on_path_delay(ft(), at(i), d * MS)
    # since 3 s: 6, 5, 5, 5 -> changes 1, 0, 0 -> median 0
    assert det.path_jitter(ft(), at(3), at(6)) == (0.0, 4)
    # since 0 s up to 2 s: 5, 9, 5 -> 4, 4
    assert det.path_jitter(ft(), at(0), at(2)) == (4.0, 3)
    # fewer than 3 in the span: the last 3 before t
    assert det.path_jitter(ft(), at(5.5), at(6)) == (0.0, 3)
    assert det.path_jitter(ft(), at(1), at(1.5)) is None, "only 2 samples up to 1.5 s"


def test_jitter_is_held_while_the_path_is_steady_and_fires_when_it_varies() -> None:
    det = SloDetector(path_min_samples=3, path_window_ns=5 * NS)
    det.watch(ft(), "gfn")
    for i in range(5):
        det.on_flow(rtp_rec(1 + i * 0.1, jitter_ms=0.5))
    for i in range(6):
        det.on_path_delay(ft(), at(1.5 + i * 0.1), 5 * MS)
    steady = [d for i in range(13) for d in det.on_flow(rtp_rec(2 + i * 0.1, jitter_ms=5.0))]
    assert steady == [] and det.held_jitter == 3  # 3.0 ... 3.2 s held
    for i in range(4):  # changes of exactly the 1 ms needed (half the 2 ms objective)
        det.on_path_delay(ft(), at(3.3 + i * 0.01), (5 + i % 2) * MS)
    (d,) = det.on_flow(rtp_rec(3.4, jitter_ms=5.0))
    ev = evidence(d)
    assert ev["path_jitter_ms"][:2] == pytest.approx((1.0, 1.0))
    assert ev["path_samples"][0] >= 3


def test_the_path_must_vary_during_the_breach_not_only_lately() -> None:
    det = SloDetector(path_min_samples=3, path_window_ns=5 * NS)
    det.watch(ft(), "gfn")
    for i in range(5):
        det.on_flow(rtp_rec(1 + i * 0.1, jitter_ms=0.5))
    det.on_flow(rtp_rec(2.0, jitter_ms=5.0))  # the breach begins
    for i in range(8):  # the path varies at its start (2 ms changes), then holds still
        det.on_path_delay(ft(), at(2.05 + i * 0.1), (5 + 2 * (i % 2) if i < 6 else 5) * MS)
    hits = [d for i in range(1, 11) for d in det.on_flow(rtp_rec(2 + i * 0.1, jitter_ms=5.0))]
    assert len(hits) == 1 and det.held_jitter == 0


def test_idle_flows_and_paths_are_evicted() -> None:
    det = SloDetector(idle_ns=10 * NS, max_flows=2)
    det.watch(ft(1), "gfn", t_ns=at(0))
    det.watch(ft(2), "gfn", t_ns=at(5))
    det.on_path_delay(ft(1), at(0), MS)
    det.on_path_delay(ft(2), at(5), MS)
    assert det.evict(at(10)) == 0, "idle exactly idle_ns: kept"
    assert len(det.paths) == 2
    assert det.evict(at(10) + 1) == 1
    assert det.watching(ft(2)) and not det.watching(ft(1)) and len(det.paths) == 1


def test_path_table_is_bounded_by_last_measurement() -> None:
    det = SloDetector(max_flows=2)
    det.watch(ft(9), "gfn", t_ns=at(1))
    det.watch(ft(2), "gfn", t_ns=at(2))
    det.on_path_delay(ft(9), at(1), 9 * MS)  # the largest key and delay, measured first
    det.on_path_delay(ft(2), at(2), 1 * MS)
    det.watch(ft(3), "gfn", t_ns=at(3))
    det.on_path_delay(ft(3), at(3), 5 * MS)  # full: the least recently measured path goes
    assert sorted(s[-1] for s in det.paths.values()) == [(at(2), 1.0), (at(3), 5.0)]
