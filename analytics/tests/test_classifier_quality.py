"""Quality gates of the gaming-flow classifier on whole held-out REAL captures.

Gate: game-stream F1 >= 0.95 on real flows of captures the model never saw (grouped
cross-validation by capture; synthetic sessions only ever train). Positives are the 32 Xbox
Cloud Gaming stream pairs; negatives every other real flow (Xbox background, nDPI captures);
the two GeForce Now set-up flows (TLS/DTLS signalling, not a stream) are left out of the gate
and reported in the evaluation. Gate: half of the real gaming flows are decided (right,
p >= 0.8, and staying right) within 1 s of flow start.

Non-circular gate (issue 21): sessions of a generator training never uses (`labcases.py`), at
bitrates outside the training range, clean and under loss, jitter and a rate cap, classified by
a model trained on every training capture: game-stream F1 >= 0.95, the real negatives' held-out
false alarms counting as its false positives. Its other traffic (`labothers.py`: adaptive video
streams, video calls, bulk downloads): none decided cloud gaming by the decision rule. This
smaller training set's model passes; the full one `cgloop evaluate` trains decides some video
calls gaming (docs/analytics.md): the gate catches a regression, not that miss.
"""

from __future__ import annotations

import numpy as np
import pytest
from cgloop.analytics.datasets import build_examples, lab_case_flows, lab_other_flows
from cgloop.analytics.evaluate import cross_validate
from cgloop.analytics.generalisation import classify_cases, lab_f1
from cgloop.analytics.model import FlowClassifier, FlowModel


@pytest.fixture(scope="module")
def held_out(small_examples):
    flows, ex = small_examples
    return cross_validate(ex, n_splits=4, estimator=lambda: FlowClassifier(n_estimators=60),
                          flows_meta=flows)


def test_cloud_gaming_f1_on_held_out_real_captures(held_out):
    ev = held_out
    gs = ev.game_stream_scores()
    assert gs["streams"] == 32, "expected the 32 Xbox game-stream pairs"
    assert gs["f1"] >= 0.95, (gs, [f for f in ev.flows if f[2] != f[3]][:10])
    # few false gaming alarms among the other real flows (~900 here)
    negatives = sum(1 for f in ev.flows if f[2] != "cloud_gaming")
    assert negatives > 800
    assert gs["false_positives"] / negatives <= 0.01
    ttd = np.array(ev.decision_s["cloud_gaming"])
    assert np.median(ttd) <= 1.0, ttd


def test_no_capture_is_both_trained_and_tested(small_examples):
    from sklearn.model_selection import GroupKFold

    _, ex = small_examples
    for train, test in GroupKFold(n_splits=4).split(ex.X, ex.y, ex.groups):
        assert not set(ex.groups[train]) & set(ex.groups[test])


def test_non_circular_lab_cases(small_examples, held_out):
    _, ex = small_examples
    lab = lab_case_flows(40)
    model = FlowModel.fit(ex.X, ex.y, ex.platform, n_estimators=60)
    cases = classify_cases(model, build_examples(lab), lab)
    assert len(cases) == 40
    false_alarms = int(held_out.game_stream_scores()["false_positives"])
    missed = [(c.name, c.predicted, round(c.p, 2)) for c in cases if c.predicted != "cloud_gaming"]
    assert lab_f1(cases, false_alarms) >= 0.95, (false_alarms, missed)


@pytest.fixture(scope="module")
def lab_others(small_examples):
    _, ex = small_examples
    others = lab_other_flows(30)
    model = FlowModel.fit(ex.X, ex.y, ex.platform, groups=ex.groups, flow=ex.flow,
                          n_estimators=60)
    return classify_cases(model, build_examples(others), others)


@pytest.mark.parametrize("kind", ["video_streaming", "realtime_call", "bulk"])
def test_non_circular_other_traffic_is_not_decided_gaming(lab_others, kind):
    cases = [c for c in lab_others if c.label == kind]
    assert len(cases) == 10
    alarms = [(c.name, c.predicted, round(c.p, 2)) for c in cases if c.decided == "cloud_gaming"]
    assert not alarms
