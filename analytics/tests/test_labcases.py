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
