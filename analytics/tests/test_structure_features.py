"""The structural features (issue 21): frame cadence, frame sizes and key frames, the input
stream, coupling and RTP, from the probe's records of generated sessions."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from cgloop.analytics.features import (
    CLASSIFIER_FEATURES,
    INDEX,
    VOLUME_FEATURES,
    window_features,
)
from cgloop.analytics.packets import Packet, records_from_packets
from cgloop.analytics.records import NS
from cgloop.analytics.synthetic import (
    TRAIN_RATE_MBPS,
    SessionDraw,
    draw_session,
    random_session_packets,
)

BASE = SessionDraw(
    down_mbps=10.0, fps=60.0, gop_frames=0, key_factor=4.0, frame_sigma=0.1, mtu_payload=1400,
    pace_frac=0.0, input_ms=8.0, input_bytes=120, feedback_ms=100.0, rtp=True, jitter_ms=0.0,
    loss=0.0, adapt_every_s=10.0, idle_input_frac=0.0,
)


def _x(d: SessionDraw, seconds: float = 4.0, seed: int = 3) -> np.ndarray:
    recs = records_from_packets(random_session_packets(d, seconds, seed=seed), "test/session")
    return window_features(recs)


def f(x: np.ndarray, name: str) -> float:
    return float(x[INDEX[name]])


@pytest.mark.parametrize("fps", [30.0, 60.0, 120.0])
def test_cadence_is_the_frame_rate(fps):
    x = _x(dataclasses.replace(BASE, fps=fps))
    assert f(x, "dn_burst_rate") == pytest.approx(fps, rel=0.1)
    assert f(x, "dn_cadence_fit") < 0.1
    assert f(x, "dn_active_frac") > 0.95
    assert f(x, "rtp_pt_dynamic") == 1.0
    assert f(x, "rtp_markers_per_frame") == pytest.approx(1.0, rel=0.1)


def test_an_odd_cadence_does_not_fit():
    x = _x(dataclasses.replace(BASE, fps=42.0))  # half-way (in log2) between 30 and 60
    assert f(x, "dn_cadence_fit") > 0.3


def test_structure_does_not_follow_the_bitrate():
    low, high = _x(dataclasses.replace(BASE, down_mbps=3.0)), _x(
        dataclasses.replace(BASE, down_mbps=45.0))
    assert f(high, "dn_bps") > 10 * f(low, "dn_bps")
    for name in ("dn_cadence_fit", "dn_active_frac", "up_input_frac", "both_active_frac",
                 "rtp_markers_per_frame"):
        assert f(low, name) == pytest.approx(f(high, name), abs=0.12), name
    assert f(low, "dn_burst_rate") == pytest.approx(f(high, "dn_burst_rate"), rel=0.1)
    # not every feature is: a frame's last, partial packet weighs more at a low rate
    assert f(low, "dn_large_frac") < f(high, "dn_large_frac")


def test_key_frames_show_as_peaks_of_frame_size():
    smooth = _x(dataclasses.replace(BASE, gop_frames=0))
    keyed = _x(dataclasses.replace(BASE, gop_frames=60, key_factor=8.0))
    assert f(smooth, "dn_frame_peak") < 1.5
    assert f(keyed, "dn_frame_peak") > 2.0
    assert f(keyed, "dn_frame_bytes_cv") > f(smooth, "dn_frame_bytes_cv")


def test_input_stream_and_coupling():
    x = _x(BASE)
    assert f(x, "up_input_frac") > 0.8  # gaps of ~8 ms
    assert f(x, "both_active_frac") > 0.95
    # a slow upstream (every 40 ms) is no input stream; one direction alone couples nothing
    start = 1_700_000_000 * NS
    down = (bytes([192, 0, 2, 1]), bytes([10, 0, 0, 1]), 443, 50000, 17)
    up = (down[1], down[0], 50000, 443, 17)
    pk = [Packet(start + i * 16_000_000, down, 1200) for i in range(200)]
    slow = window_features(records_from_packets(
        pk + [Packet(start + i * 40_000_000, up, 100) for i in range(80)], "test/slow"))
    assert f(slow, "up_input_frac") < 0.1
    alone = window_features(records_from_packets(pk, "test/alone"))
    assert f(alone, "both_active_frac") == 0.0 and f(alone, "up_input_frac") == 0.0


def test_no_rtp_header_no_rtp_features():
    x = _x(dataclasses.replace(BASE, rtp=False))
    assert f(x, "rtp_present") == 0.0 and f(x, "rtp_pt_dynamic") == 0.0
    assert f(x, "rtp_markers_per_frame") == 0.0


def test_the_classifier_leaves_the_downstream_volume_out():
    assert not set(VOLUME_FEATURES) & set(CLASSIFIER_FEATURES)
    assert len(set(CLASSIFIER_FEATURES)) == len(CLASSIFIER_FEATURES)


def test_random_sessions_are_drawn_within_the_training_range():
    rng = np.random.default_rng(0)
    draws = [draw_session(rng) for _ in range(200)]
    lo, hi = TRAIN_RATE_MBPS
    assert all(lo <= d.down_mbps <= hi for d in draws)
    assert {d.fps for d in draws} == {30.0, 60.0, 120.0}
    for name in ("rtp", "gop_frames", "loss", "jitter_ms", "bottleneck", "pace_frac"):
        assert len({getattr(d, name) for d in draws}) > 1, name  # each one varies
    assert all(4.0 <= d.input_ms <= 16.0 for d in draws)


def test_a_final_record_without_packets_is_no_interval_of_video():
    recs = records_from_packets(random_session_packets(BASE, 2.0, seed=4), "test/final")
    x = window_features(recs)
    last = max((r for r in recs if r.packets), key=lambda r: (r.bytes, r.interval_end_ns))
    empty = type(last)()
    empty.CopyFrom(last)
    empty.packets = empty.bytes = empty.burst_count = 0
    empty.interval_start_ns = max(r.interval_end_ns for r in recs)
    empty.interval_end_ns = empty.interval_start_ns + 100_000_000
    y = window_features([*recs, empty])
    for name in ("dn_cadence_cv", "dn_frame_bytes_cv", "dn_frame_peak", "both_active_frac"):
        assert f(y, name) == pytest.approx(f(x, name)), name


def _call(start: int, camera_up: bool) -> list[Packet]:
    """A bundled call: video (30 fps, 3 packets of ~1100 B a frame) and audio (150 B every
    20 ms) downstream; the same upstream, or audio alone with the camera off."""
    down = (bytes([192, 0, 2, 9]), bytes([10, 0, 0, 9]), 3478, 50000, 17)
    up = (down[1], down[0], 50000, 3478, 17)
    pk = []
    for key, video in ((down, True), (up, camera_up)):
        pk += [Packet(start + i * 20_000_000 + 3_000_000, key, 150) for i in range(200)]
        if video:
            pk += [Packet(start + i * 33_333_333 + j * 2_000_000, key, 1100 - 40 * j)
                   for i in range(120) for j in range(3)]
    return sorted(pk, key=lambda p: p.ts_ns)


def test_size_symmetry_tells_a_call_from_a_game():
    game = _x(BASE)
    # a game's upstream is small input reports against full video packets
    assert f(game, "size_max_ratio_up") < 0.3 and f(game, "size_mean_ratio_up") < 0.3
    start = 1_700_000_000 * NS
    both = window_features(records_from_packets(_call(start, True), "test/call"))
    assert f(both, "size_max_ratio_up") > 0.9 and f(both, "size_mean_ratio_up") > 0.8
    # the camera off upstream: audio against video, as asymmetric in sizes as a game
    # (what separates them is the upstream's cadence, 20 ms against 4-16 ms: up_input_frac)
    audio = window_features(records_from_packets(_call(start, False), "test/audio-up"))
    assert f(audio, "size_mean_ratio_up") < 0.4
    assert f(audio, "up_input_frac") < 0.1 < 0.8 < f(game, "up_input_frac")
    alone = [p for p in _call(start, True) if p.key[0] == bytes([192, 0, 2, 9])]
    x = window_features(records_from_packets(alone, "test/alone"))
    assert f(x, "size_max_ratio_up") == 0.0 and f(x, "size_mean_ratio_up") == 0.0


def test_size_symmetry_does_not_follow_the_bitrate():
    low, high = _x(dataclasses.replace(BASE, down_mbps=3.0)), _x(
        dataclasses.replace(BASE, down_mbps=45.0))
    assert f(low, "size_max_ratio_up") == pytest.approx(f(high, "size_max_ratio_up"), abs=0.02)
