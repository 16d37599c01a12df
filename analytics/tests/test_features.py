"""Window features from FlowRecords."""

from __future__ import annotations

import numpy as np
import pytest
from cgloop.analytics.features import FEATURE_NAMES, INDEX, window_features
from cgloop.analytics.records import NS
from cgloop.analytics.synthetic import PROFILES, gaming_records


@pytest.mark.parametrize("platform", ["gfn", "xc"])
def test_synthetic_profile_rates_are_recovered(platform):
    recs = gaming_records(platform, 6.0, seed=1)
    start = min(r.interval_start_ns for r in recs)
    x = window_features(recs, start + NS, start + 6 * NS)
    prof = PROFILES[platform]
    assert x[INDEX["dn_bps"]] == pytest.approx(prof.down_mbps * 1e6, rel=0.15)
    # client input every ~10 ms
    assert x[INDEX["up_pps"]] == pytest.approx(100, rel=0.15)
    # one burst per video frame
    assert x[INDEX["dn_burst_rate"]] == pytest.approx(prof.fps, rel=0.15)
    assert x[INDEX["rtp_present"]] == 1.0
    assert x[INDEX["rtp_marker_rate"]] == pytest.approx(prof.fps, rel=0.15)
    assert x[INDEX["byte_ratio_up"]] < 0.05
    assert x[INDEX["is_udp"]] == 1.0


def test_window_selects_records_and_empty_window_is_zero():
    recs = gaming_records("psn", 3.0, seed=2)
    x = window_features(recs, 0, 1)
    assert x.shape == (len(FEATURE_NAMES),) and not x.any()
    full = window_features(recs)
    assert np.isfinite(full).all()
    assert full[INDEX["active_s"]] == pytest.approx(3.0, abs=0.2)
