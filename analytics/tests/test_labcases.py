"""The non-circular lab cases: another generator, outside the training range, impaired."""

from __future__ import annotations

import numpy as np
import pytest
from cgloop.analytics.datasets import lab_case_flows
from cgloop.analytics.features import INDEX, window_features
from cgloop.analytics.labcases import CONDITIONS, LabCase, case_records, draw_cases
from cgloop.analytics.synthetic import TRAIN_RATE_MBPS


def test_cases_lie_outside_the_training_range_under_every_condition():
    cases = draw_cases(40)
    lo, hi = TRAIN_RATE_MBPS
    assert all(c.rate_mbps < lo or c.rate_mbps > hi for c in cases)
    assert any(c.rate_mbps < lo for c in cases) and any(c.rate_mbps > hi for c in cases)
    assert {c.condition for c in cases} == set(CONDITIONS)
    assert draw_cases(8, seed=1) != draw_cases(8, seed=0)


@pytest.mark.parametrize("fps", [30.0, 60.0, 120.0])
def test_a_clean_case_has_its_rate_and_cadence(fps):
    x = window_features(case_records(LabCase(40.0, fps, "clean", 7), 4.0))
    assert x[INDEX["dn_bps"]] == pytest.approx(40e6, rel=0.35)
    # a few display ticks are skipped (render stalls)
    assert x[INDEX["dn_burst_rate"]] == pytest.approx(fps, rel=0.15)


def test_a_rate_cap_queues_drops_and_the_encoder_adapts():
    clean = case_records(LabCase(40.0, 60.0, "clean", 9), 6.0)
    capped = case_records(LabCase(40.0, 60.0, "rate_cap", 9), 6.0)
    xc, xk = window_features(clean), window_features(capped)
    assert xk[INDEX["dn_bps"]] < 0.85 * xc[INDEX["dn_bps"]]
    start = min(r.interval_start_ns for r in capped)
    late = window_features(capped, start + 3 * 10**9, start + 6 * 10**9)
    assert late[INDEX["dn_bps"]] < 0.8 * 40e6 * 0.8  # retargeted below the bottleneck


def test_loss_and_jitter_change_the_stream():
    clean = window_features(case_records(LabCase(40.0, 60.0, "clean", 11), 4.0))
    lossy = window_features(case_records(LabCase(40.0, 60.0, "loss", 11), 4.0))
    jittered = window_features(case_records(LabCase(40.0, 60.0, "jitter", 11), 4.0))
    assert lossy[INDEX["dn_pps"]] < clean[INDEX["dn_pps"]]
    assert not np.allclose(jittered, clean)


def test_lab_flows_are_marked_synthetic_and_named_by_condition():
    flows = lab_case_flows(4, duration_s=2.0)
    assert all(f.synthetic and f.label == "cloud_gaming" for f in flows)
    assert [f.name.split("/")[1] for f in flows] == ["clean", "clean", "loss", "loss"]


# ---------------------------------------------------------------- other traffic (labothers.py)


def test_other_cases_cycle_kinds_and_conditions_and_are_marked_synthetic():
    from cgloop.analytics.datasets import lab_other_flows
    from cgloop.analytics.labothers import KINDS, draw_other_cases

    cases = draw_other_cases(24)
    assert {(c.kind, c.condition) for c in cases} == {(k, c) for k in KINDS for c in CONDITIONS}
    assert draw_other_cases(6, seed=1) != draw_other_cases(6, seed=0)
    flows = lab_other_flows(3, duration_s=2.0)
    assert [f.label for f in flows] == list(KINDS)
    assert all(f.synthetic and f.name.startswith("lab/clean/") for f in flows)


def test_a_bulk_download_fills_its_rate_and_is_acknowledged():
    from cgloop.analytics.labothers import OtherCase, other_records

    clean = window_features(other_records(OtherCase("bulk", 20.0, "clean", 3), 4.0))
    assert clean[INDEX["is_tcp"]] == 1.0
    assert clean[INDEX["dn_bps"]] == pytest.approx(20e6, rel=0.3)
    # an ack every second data packet
    assert clean[INDEX["up_pps"]] == pytest.approx(clean[INDEX["dn_pps"]] / 2, rel=0.1)
    capped = window_features(other_records(OtherCase("bulk", 20.0, "rate_cap", 3), 4.0))
    assert capped[INDEX["dn_bps"]] < 0.85 * clean[INDEX["dn_bps"]]


def test_adaptive_video_fetches_segments_faster_than_it_plays_them():
    from cgloop.analytics.labothers import OtherCase, other_records

    recs = other_records(OtherCase("video_streaming", 3.0, "clean", 4), 6.0)
    x = window_features(recs)
    assert x[INDEX["is_tcp"]] == 1.0
    # the player fills its buffer: segments arrive well above the video's own rate
    assert x[INDEX["dn_bps"]] > 1.5 * 3e6
    assert x[INDEX["up_small_frac"]] > 0.8  # acks and a few requests


def test_a_video_call_carries_rtp_media_both_ways():
    from cgloop.analytics.labothers import OtherCase, other_packets, other_records

    case = OtherCase("realtime_call", 2.0, "clean", 5)
    packets = other_packets(case, 4.0)
    assert {p.key[4] for p in packets} == {17} and all(p.rtp_ssrc for p in packets)
    assert len({p.key for p in packets}) == 2  # one bundled five-tuple, both directions
    audio = [p for p in packets if p.rtp_pt == 111]
    assert len(audio) == pytest.approx(2 * 50 * 4.0, rel=0.05)  # 20 ms frames each way
    x = window_features(other_records(case, 4.0))
    assert x[INDEX["rtp_present"]] == 1.0 and x[INDEX["is_udp"]] == 1.0
    with pytest.raises(ValueError, match="unknown kind"):
        other_packets(OtherCase("telnet", 1.0, "clean", 1), 1.0)
