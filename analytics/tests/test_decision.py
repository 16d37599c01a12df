"""The decision rule (decision.py): its threshold chosen on training data only, one rule for the
engine, `classify` and `evaluate`, and the threshold kept in the model file."""

from __future__ import annotations

import numpy as np
import pytest
from cgloop.analytics import decision
from cgloop.analytics.decision import choose_threshold, decide, thresholds_for
from cgloop.analytics.engine import AnalyticsEngine
from cgloop.analytics.model import FlowClassifier, load, save
from cgloop.analytics.records import sweeps
from cgloop.analytics.synthetic import gaming_records
from cgloop.v1.detection_pb2 import DetectionKind as K

CLASSES = np.array(["cloud_gaming", "video_streaming", "web_other"])


def test_the_threshold_is_the_lowest_keeping_false_alarms_within_the_target():
    scores = np.zeros(2000)  # 2,000 negative flows: 2 alarms allowed at 1 per 1,000
    scores[:3] = [0.9, 0.7, 0.6]
    assert choose_threshold(scores) == pytest.approx(0.61)
    scores[3] = 0.95  # a fourth: the two highest (0.95, 0.9) may stay, 0.7 may not
    assert choose_threshold(scores) == pytest.approx(0.71)
    # never below the floor, however clean the negatives
    assert choose_threshold(np.zeros(500)) == decision.THRESHOLD_FLOOR
    # negatives the forest is sure of: nothing but certainty decides
    assert choose_threshold(np.ones(500)) == 1.0


def test_alarm_scores_count_a_flow_once_and_only_where_gaming_is_on_top():
    proba = np.array([[0.6, 0.3, 0.1], [0.7, 0.2, 0.1],  # flow 1: two prefixes
                      [0.45, 0.5, 0.05],  # flow 2: gaming not the top class
                      [0.9, 0.05, 0.05]])  # flow 3: a gaming flow
    y = np.array(["web_other", "web_other", "video_streaming", "cloud_gaming"])
    scores = decision.alarm_scores(proba, CLASSES, y, np.array([1, 1, 2, 3]))
    assert sorted(scores.tolist()) == [0.0, 0.7]


def test_gaming_is_final_other_labels_settle():
    t = thresholds_for(CLASSES, 0.6)
    assert t.tolist() == [0.6, decision.DEFAULT_CONFIDENCE, decision.DEFAULT_CONFIDENCE]
    times = [0.5, 1.0, 2.0, 5.0]
    gaming_then_video = np.array([[0.65, 0.3, 0.05], [0.1, 0.85, 0.05], [0.1, 0.85, 0.05],
                                  [0.1, 0.85, 0.05]])
    assert decide(gaming_then_video, times, CLASSES, t) == ("cloud_gaming", 0.5)
    # a provisional video label gives way to gaming while the conversation is young
    video_then_gaming = gaming_then_video[::-1]
    assert decide(video_then_gaming, times, CLASSES, t) == ("video_streaming", 0.5)
    late = np.array([[0.1, 0.85, 0.05], [0.7, 0.2, 0.1], [0.7, 0.2, 0.1], [0.7, 0.2, 0.1]])
    assert decide(late, times, CLASSES, t) == ("cloud_gaming", 1.0)
    unsure = np.full((4, 3), 1 / 3)
    assert decide(unsure, times, CLASSES, t) == ("", None)
    # after settle_s a non-gaming label stands, as the engine stops re-examining it
    web_then_gaming = np.array([[0.0, 0.1, 0.9], [0.0, 0.1, 0.9], [0.0, 0.1, 0.9],
                                [0.9, 0.1, 0.0]])
    assert decide(web_then_gaming, times, CLASSES, t, settle_s=5.0) == ("web_other", 0.5)


def test_fit_chooses_the_threshold_on_training_folds_only(small_examples):
    _, ex = small_examples
    plain = FlowClassifier(n_estimators=10).fit(ex.X, ex.y)
    assert plain.thresholds()["cloud_gaming"] == decision.DEFAULT_CONFIDENCE
    clf = FlowClassifier(n_estimators=10).fit(ex.X, ex.y, groups=ex.groups, flow=ex.flow)
    fit = clf.threshold_fit_
    t = clf.thresholds()["cloud_gaming"]
    assert decision.THRESHOLD_FLOOR <= t <= 1.0 and fit["threshold"] == t
    negatives = len({f for f, y in zip(ex.flow, ex.y, strict=True) if y != "cloud_gaming"})
    assert fit["negative_flows"] == negatives
    assert fit["false_alarms"] <= np.floor(decision.FALSE_ALARM_TARGET * negatives)
    with pytest.raises(ValueError, match="groups"):
        FlowClassifier(n_estimators=5).fit(ex.X, ex.y, groups=ex.groups)


def test_the_engine_decides_with_the_models_threshold(small_model):
    model, card = small_model
    recs = gaming_records("psn", 4, seed=5)

    def classified(thresholds) -> int:
        model.classifier.decision_threshold_ = thresholds
        eng = AnalyticsEngine(model, card.version)
        out = [d for b in sweeps(recs) for d in eng.on_flows(b)]
        return sum(1 for d in out if d.kind == K.DETECTION_KIND_GAMING_FLOW_CLASSIFIED)

    fitted = model.classifier.decision_threshold_.copy()
    try:
        assert classified(fitted) == 1
        assert classified(np.full_like(fitted, 1.01)) == 0  # above any probability
    finally:
        model.classifier.decision_threshold_ = fitted


def test_the_threshold_is_saved_with_the_model(small_model, tmp_path, monkeypatch):
    monkeypatch.setenv("CGLOOP_MODEL_KEY_FILE", str(tmp_path / "model.key"))
    monkeypatch.delenv("CGLOOP_MODEL_KEY", raising=False)
    model, card = small_model
    saved = save(model, card, tmp_path / "m.skops")
    loaded, card2 = load(tmp_path / "m.skops")
    np.testing.assert_array_equal(loaded.decision_threshold_, model.decision_threshold_)
    assert card2.decision_thresholds == saved.decision_thresholds == model.classifier.thresholds()
    assert "decision_threshold_fit" in card2.metrics
