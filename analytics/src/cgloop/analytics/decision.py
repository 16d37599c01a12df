"""When the classifier's output becomes a decision: one rule for the streaming engine,
`cgloop analytics classify` and `cgloop evaluate`.

A conversation is checked at successive prefixes (the engine every 0.5 s of event time, the
offline paths at `datasets.PREFIXES_S`). At a check, the top class j is decided when its
probability reaches the class's threshold. A cloud-gaming decision is final (the loop acts on
it); another label stays provisional, re-examined while the conversation is younger than
`settle_s`, and the last one decided stands. The time to decision is when the label that stands
was decided.

The cloud-gaming threshold is a fitted value, chosen on training data only
(`choose_threshold`): from out-of-fold predictions on the training captures (grouped by capture),
the lowest threshold at which at most `false_alarm_target` of the other flows (issue 21: one in
1,000) would ever be decided cloud gaming, and never below 0.5 (the forest's majority for gaming
over every other class together). The other classes keep `DEFAULT_CONFIDENCE`: their labels are
provisional and no lever acts on them.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

GAMING = "cloud_gaming"
# The former fixed confidence, kept for the classes whose threshold is not fitted.
DEFAULT_CONFIDENCE = 0.8
# Lowest cloud-gaming threshold: the forest's probability for gaming at least that of every
# other class together.
THRESHOLD_FLOOR = 0.5
THRESHOLD_STEP = 0.01
# Issue 21's target: at most one false cloud-gaming alarm per 1,000 other flows.
FALSE_ALARM_TARGET = 1e-3
# A non-gaming label is re-examined until the conversation has been seen this long (engine).
SETTLE_S = 5.0


def alarm_scores(proba: np.ndarray, classes: Sequence[str], y: np.ndarray,
                 flow: np.ndarray) -> np.ndarray:
    """Per flow whose true class is not cloud gaming, the highest gaming probability over its
    prefixes at which gaming is the top class (0 if never): the flow is a false alarm under any
    threshold at or below it."""
    classes = list(classes)
    if GAMING not in classes:
        return np.zeros(0)
    g = classes.index(GAMING)
    top = proba.argmax(1) == g
    score = np.where(top, proba[:, g], 0.0)
    neg = np.asarray(y) != GAMING
    out: dict[object, float] = {}
    for f, s in zip(np.asarray(flow)[neg], score[neg], strict=True):
        out[f] = max(out.get(f, 0.0), float(s))
    return np.array(list(out.values()))


def choose_threshold(scores: np.ndarray, target: float = FALSE_ALARM_TARGET) -> float:
    """The lowest threshold (a multiple of THRESHOLD_STEP, at least THRESHOLD_FLOOR, at most 1)
    at which at most floor(target * negatives) of the negative flows' `scores` reach it."""
    scores = np.asarray(scores, dtype=float)
    allowed = int(np.floor(target * len(scores) + 1e-9))
    for t in np.arange(THRESHOLD_FLOOR, 1.0 + THRESHOLD_STEP / 2, THRESHOLD_STEP):
        t = round(float(t), 6)
        if int((scores >= t).sum()) <= allowed:
            return t
    return 1.0


def thresholds_for(classes: Sequence[str], gaming: float) -> np.ndarray:
    """Per class (`classes` order): `gaming` for cloud gaming, DEFAULT_CONFIDENCE otherwise."""
    return np.array([gaming if c == GAMING else DEFAULT_CONFIDENCE for c in classes])


def decided(p: np.ndarray, thresholds: np.ndarray) -> int | None:
    """Index of the class decided by one probability row, None if the top class is under its
    threshold."""
    j = int(np.argmax(p))
    return j if p[j] >= thresholds[j] else None


def decide(proba: np.ndarray, times: Sequence[float], classes: Sequence[str],
           thresholds: np.ndarray, settle_s: float = SETTLE_S) -> tuple[str, float | None]:
    """(label, time decided) over one conversation's checks in time order (rows of `proba` at
    conversation ages `times`), as the engine decides: ("", None) when never decided."""
    label, at = "", None
    for p, t in zip(proba, times, strict=True):
        if label == GAMING or (label and t >= settle_s):
            break
        j = decided(p, thresholds)
        if j is not None and str(classes[j]) != label:
            label, at = str(classes[j]), float(t)
    return label, at
