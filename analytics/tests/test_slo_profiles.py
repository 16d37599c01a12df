"""The SLO detector's thresholds are the SLO table's (cgloop.slo), never numbers of its own."""

from __future__ import annotations

import os
import subprocess

import pytest
from cgloop.analytics.detectors.slo import PLATFORM_SLOS, SloDetector, platform_slos
from cgloop.analytics.engine import AnalyticsEngine, EngineConfig
from cgloop.errors import CgloopError
from cgloop.slo import GENERIC, LAB, table
from cgloop.testing import cgloop_cmd
from cgloop.v1.common_pb2 import FiveTuple


def _thresholds(det: SloDetector, platform: str) -> dict[str, float]:
    ft = FiveTuple(src_port=1, dst_port=2, ip_protocol=17)
    det.watch(ft, platform)
    return {m: s.threshold for m, s in det.flows[next(iter(det.flows))].series.items()}


@pytest.mark.parametrize("platform", ["gfn", "std", "psn", "xc", GENERIC, "unknown-platform"])
def test_each_platform_is_held_to_its_table_profile(platform: str) -> None:
    want = table().platform(platform)
    assert _thresholds(SloDetector(), platform) == {
        "latency": want.latency_ms, "jitter": want.jitter_ms, "loss": want.loss,
        "throughput": want.min_down_mbps,
    }  # fmt: skip
    assert set(PLATFORM_SLOS) == set(table().platforms)


def test_a_deployment_profile_replaces_what_it_sets() -> None:
    lab = table().deployment(LAB)
    assert lab.latency_ms is not None
    eng = AnalyticsEngine(None, "", EngineConfig(slo_profile=LAB))
    for name, prof in eng.slo.profiles.items():
        own = table().platforms[name]
        assert prof.latency_ms == lab.latency_ms
        # the lab sets latency only: jitter, loss and rate stay the platform's
        assert (prof.jitter_ms, prof.loss, prof.min_down_mbps) == (
            own.jitter_ms, own.loss, own.min_down_mbps)
    assert AnalyticsEngine(None, "", EngineConfig()).slo.profiles == platform_slos()


def test_an_unknown_deployment_profile_is_refused_by_name() -> None:
    with pytest.raises(CgloopError, match=r"no SLO deployment profile 'nope' \(known: lab\)"):
        AnalyticsEngine(None, "", EngineConfig(slo_profile="nope"))


def test_the_worker_refuses_an_unknown_profile_at_start_naming_the_option() -> None:
    run = subprocess.run(
        cgloop_cmd("analytics", "run", "--slo-profile", "nope", "--max-idle-s", "0"),
        capture_output=True, text=True, timeout=120, env={**os.environ, "COLUMNS": "200"},
    )  # fmt: skip
    assert run.returncode == 2, run.stderr
    assert "Invalid value for --slo-profile: 'nope' is not a deployment profile" in run.stderr
    assert "known: lab" in run.stderr
