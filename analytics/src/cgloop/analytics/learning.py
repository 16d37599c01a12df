"""How much data a class needs: a learning curve by subsampling the training captures.

The held-out folds are those of the evaluation (grouped by capture) and stay whole; each fold's
training captures are subsampled to a fraction (the synthetic sessions, gaming only, are kept),
`repeats` times with different draws. Per class, the F1 on the real held-out flows (top class at
the longest prefix, as the evaluation's per-class table) is set against the number of real
training flows of that class the fold's model saw.

The extrapolation is a power law of the error, the usual shape of learning curves (Cortes et
al. 1994; Hestness et al. 2017): 1 - F1 = a * n^-b, a straight line in log-log, fitted by least
squares; the flows needed for F1 0.8 follow from it. Its uncertainty is a bootstrap over the
curve's points. A class whose curve does not rise (slope b not above zero in most resamples)
is reported flat: no amount follows from it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
from cgloop.analytics.datasets import CLASSES, Examples
from cgloop.analytics.model import FlowClassifier
from sklearn.metrics import f1_score
from sklearn.model_selection import GroupKFold

FRACTIONS = (0.25, 0.5, 0.75, 1.0)
TARGET_F1 = 0.8
# Beyond this multiple of the data there is, the extrapolation says nothing worth stating.
MAX_MULTIPLE = 1000.0


def curve(
    ex: Examples,
    fractions: Sequence[float] = FRACTIONS,
    repeats: int = 3,
    folds: int = 5,
    n_estimators: int = 80,
    seed: int = 0,
    progress: Callable[[], None] | None = None,
) -> list[dict]:
    """One point per (fraction, repeat): the real training flows and captures per class (summed
    over the folds' models, divided by the folds: what one model saw on average) and the
    per-class F1 on every real held-out flow."""
    for f in fractions:
        if not 0 < f <= 1:
            raise ValueError(f"learning-curve fraction {f} is not in (0, 1]")
    rng = np.random.default_rng(seed)
    classes = np.array(sorted(set(ex.y)))
    splits = list(GroupKFold(n_splits=min(folds, len(np.unique(ex.groups))))
                  .split(ex.X, ex.y, ex.groups))
    flow_rows = _last_rows(ex)
    real = ~ex.synthetic[flow_rows]
    y_true = ex.y[flow_rows][real]
    present = [c for c in CLASSES if c in set(y_true)]
    points = []
    real_rows = ~ex.synthetic
    for frac in fractions:
        for r in range(repeats if frac < 1 else 1):  # all captures: one draw is all draws
            proba = np.zeros((len(ex.y), len(classes)))
            seen = {c: 0.0 for c in present}
            captures = {c: 0.0 for c in present}
            for train, test in splits:
                keep = _subsample(ex, train, frac, rng)
                clf = FlowClassifier(n_estimators=n_estimators, random_state=r).fit(
                    ex.X[keep], ex.y[keep])
                cols = np.searchsorted(classes, clf.classes_)
                proba[np.ix_(test, cols)] = clf.predict_proba(ex.X[test])
                kept_flows = {(f, y) for f, y, s in zip(ex.flow[keep], ex.y[keep],
                                                         ex.synthetic[keep], strict=True) if not s}
                for _, y in kept_flows:
                    if y in seen:
                        seen[y] += 1 / len(splits)
                kept_real = keep[real_rows[keep]]
                for c in present:
                    n_caps = len(np.unique(ex.groups[kept_real][ex.y[kept_real] == c]))
                    captures[c] += n_caps / len(splits)
                if progress is not None:
                    progress()
            y_pred = classes[proba[flow_rows][real].argmax(1)]
            f1 = f1_score(y_true, y_pred, labels=present, average=None, zero_division=0)
            points.append({"fraction": frac, "repeat": r, "flows": seen, "captures": captures,
                           "f1": dict(zip(present, map(float, f1), strict=True))})
    return points


def _last_rows(ex: Examples) -> np.ndarray:
    """Each flow's row at its longest prefix."""
    order = np.lexsort((ex.prefix_s, ex.flow))
    last = np.r_[ex.flow[order][1:] != ex.flow[order][:-1], True]
    return order[last]


def _subsample(ex: Examples, train: np.ndarray, frac: float, rng) -> np.ndarray:
    """`frac` of the fold's real training captures (at least one), every synthetic row."""
    syn = ex.synthetic[train]
    caps = np.unique(ex.groups[train][~syn])
    if frac >= 1:
        return train
    pick = set(rng.choice(caps, size=max(1, round(frac * len(caps))), replace=False).tolist())
    return train[syn | np.isin(ex.groups[train], list(pick))]


def extrapolate(points: Sequence[dict], cls: str, target: float = TARGET_F1,
                boot: int = 500, seed: int = 0) -> dict:
    """Flows of `cls` for F1 `target` from the power law of its curve: the point estimate, an
    80 % bootstrap interval, the share of resamples whose curve does not rise, and a verdict
    (`reached`, `estimate`, `flat`, `beyond`: more than MAX_MULTIPLE times the data)."""
    n = np.array([p["flows"][cls] for p in points], dtype=float)
    f1 = np.array([p["f1"][cls] for p in points], dtype=float)
    have = float(n.max()) if len(n) else 0.0
    caps = max((p.get("captures", {}).get(cls, 0.0) for p in points), default=0.0)
    out = {"class": cls, "flows_now": have, "captures_now": caps,
           "f1_now": float(f1[n == have].mean()) if len(n) else 0.0,
           "flows_needed": None, "interval": None, "flat_share": 1.0}
    ok = n > 0
    if ok.sum() < 3 or len(set(n[ok].round(6))) < 2:
        return {**out, "verdict": "flat"}
    if out["f1_now"] >= target:
        return {**out, "verdict": "reached", "flat_share": 0.0}
    x, e = np.log(n[ok]), np.log(np.clip(1 - f1[ok], 1e-3, 1))

    def needed(xs, es) -> float | None:
        if len(set(xs.round(9))) < 2:
            return None
        slope, icpt = np.polyfit(xs, es, 1)
        b = -slope
        if b <= 1e-6:
            return None
        log_n = (icpt - np.log(1 - target)) / b
        return float(np.exp(min(log_n, 700.0)))  # past ~1e304 flows: "beyond" all the same

    est = needed(x, e)
    rng = np.random.default_rng(seed)
    draws = [needed(x[i], e[i]) for i in (rng.integers(0, len(x), len(x)) for _ in range(boot))]
    rising = np.array([d for d in draws if d is not None])
    flat_share = 1 - len(rising) / boot
    out["flat_share"] = round(flat_share, 3)
    if est is None or flat_share > 0.5:
        return {**out, "verdict": "flat"}
    lo, hi = np.percentile(rising, [10, 90])
    out.update(flows_needed=est, interval=[float(lo), float(hi)])
    return {**out, "verdict": "beyond" if est > MAX_MULTIPLE * have else "estimate"}


def summary(points: Sequence[dict]) -> dict[str, dict]:
    """`extrapolate` for every class of the curve."""
    classes = list(points[0]["f1"]) if points else []
    return {c: extrapolate(points, c) for c in classes}


def _n(v: float | None) -> str:
    if v is None:
        return "-"
    return f"{v:.0f}" if v < 1e6 else f"{v:.1e}"


def html_section(points: Sequence[dict], summ: dict[str, dict]) -> str:
    """The report's learning-curve section: F1 per class at each fraction, and what follows."""
    import html

    fracs = sorted({p["fraction"] for p in points})
    head = "".join(f"<th>{f:g}</th>" for f in fracs)
    rows = []
    for c, s in summ.items():
        cells = []
        for f in fracs:
            sub = [p for p in points if p["fraction"] == f]
            f1 = [p["f1"][c] for p in sub]
            flows = np.mean([p["flows"][c] for p in sub])
            cells.append(f"<td>{np.mean(f1):.2f} ± {np.std(f1):.2f} ({flows:.0f})</td>")
        interval = s["interval"]
        needed = {"reached": "reached", "flat": "flat: none follows",
                  "beyond": f"beyond {MAX_MULTIPLE:g}x the data ({_n(s['flows_needed'])})",
                  "estimate": f"{_n(s['flows_needed'])} (80 %: {_n(interval[0])} to "
                              f"{_n(interval[1])})" if interval else ""}[s["verdict"]]
        rows.append(f"<tr><td>{html.escape(c)}</td>{''.join(cells)}<td>{s['flows_now']:.0f} "
                    f"flows, {s['captures_now']:.1f} captures</td><td>{needed}</td></tr>")
    return f"""<h2>Learning curve: how much data a class needs</h2><p>Each fold's real training
captures subsampled to a fraction (synthetic sessions kept), {len(points)} models per fold in
all; F1 on every real held-out flow, mean ± std over the draws (real training flows of the
class a model saw). Flows for F1 {TARGET_F1}: a power law of the error (1 - F1 = a n^-b)
fitted to the points, 80 % bootstrap interval; "flat" when the curve does not rise in most
resamples. Flows counted at today's mix: more flows of the same captures would not do.</p>
<table><tr><th>class</th>{head}<th>a model sees now</th><th>flows for F1 {TARGET_F1}</th></tr>
{''.join(rows)}</table>"""
