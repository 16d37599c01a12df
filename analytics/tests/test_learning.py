"""The learning curve (learning.py): subsampled training captures, and the extrapolation of how
many flows a class needs for F1 0.8."""

from __future__ import annotations

import numpy as np
import pytest
from cgloop.analytics import learning
from cgloop.analytics.evaluate import cross_validate
from cgloop.analytics.model import FlowClassifier


def _points(ns, f1s):
    return [{"fraction": 0, "repeat": i, "flows": {"c": n}, "captures": {"c": n / 10},
             "f1": {"c": f}} for i, (n, f) in enumerate(zip(ns, f1s, strict=True))]


def test_a_power_law_curve_is_extrapolated_to_its_crossing():
    # 1 - F1 = 2 n^-0.5 reaches F1 0.8 at n = 100
    ns = np.array([10, 10, 20, 20, 40, 40, 60, 60], dtype=float)
    noise = np.array([1.03, 0.97, 1.02, 0.98, 1.03, 0.97, 1.01, 0.99])
    s = learning.extrapolate(_points(ns, 1 - 2 * ns**-0.5 * noise), "c")
    assert s["verdict"] == "estimate" and s["flows_now"] == 60
    assert s["flows_needed"] == pytest.approx(100, rel=0.1)
    lo, hi = s["interval"]
    assert lo < 100 < hi


def test_flat_reached_and_far_curves_say_so():
    ns = [5.0, 5.0, 10.0, 10.0, 15.0]
    assert learning.extrapolate(_points(ns, [0.0] * 5), "c")["verdict"] == "flat"
    assert learning.extrapolate(_points(ns, [0.7, 0.72, 0.8, 0.82, 0.85]), "c")["verdict"] == (
        "reached")
    barely = learning.extrapolate(_points(ns, [0.0, 0.0, 0.01, 0.01, 0.012]), "c")
    assert barely["verdict"] in ("beyond", "flat") and barely["verdict"] != "estimate"


def test_the_whole_training_set_gives_the_evaluations_f1(small_examples):
    _, ex = small_examples
    points = learning.curve(ex, fractions=(0.5, 1.0), repeats=1, folds=3, n_estimators=10)
    assert [p["fraction"] for p in points] == [0.5, 1.0]
    half, whole = points
    assert half["flows"]["web_other"] < whole["flows"]["web_other"]
    assert half["captures"]["web_other"] < whole["captures"]["web_other"]
    ev = cross_validate(ex, n_splits=3, estimator=lambda: FlowClassifier(n_estimators=10))
    for c, m in ev.per_class.items():
        assert whole["f1"][c] == pytest.approx(m["f1"]), c
    assert set(learning.summary(points)) == set(ev.per_class)
    with pytest.raises(ValueError, match="fraction"):
        learning.curve(ex, fractions=(0.0,))
