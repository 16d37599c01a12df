"""Training and evaluation on whole held-out captures, and the evaluation report.

Evaluation is grouped cross-validation over captures: every capture (an Xbox session, an nDPI
pcap, a synthetic session) is predicted by a model that never saw any of its flows. Headline
numbers are computed on REAL captures only; synthetic ones help training and are reported
apart. Time to decision follows the engine's rule (decision.py): the prefix at which the label
that stands was decided, each fold's model with the decision thresholds it chose on its own
training captures; a flow whose standing label is wrong, or that is never decided, never is.
"""

from __future__ import annotations

import base64
import html
import io
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from cgloop.analytics import decision
from cgloop.analytics.datasets import CLASSES, PREFIXES_S, Examples, LabelledFlow
from cgloop.analytics.features import CLASSIFIER_FEATURES
from cgloop.analytics.model import (
    FORMAT_VERSION,
    MODEL_FORMAT,
    RECORDS_SOURCE,
    FlowClassifier,
    FlowModel,
    ModelCard,
    new_version,
)
from sklearn.metrics import (
    confusion_matrix,
    precision_recall_curve,
    precision_recall_fscore_support,
)
from sklearn.model_selection import GroupKFold


@dataclass
class Evaluation:
    classes: list[str]
    # flow level, real held-out captures, at the longest prefix of each flow
    per_class: dict[str, dict[str, float]]
    confusion: list[list[int]]
    flows_real: int
    captures_real: int
    flows_synthetic: int
    decision_s: dict[str, list[float]]  # per true class, real flows; inf = never (right)
    platform_accuracy: dict[str, float]
    folds: int
    pr_curves: dict[str, tuple[list[float], list[float]]] = field(default_factory=dict)
    counts: dict[str, dict[str, int]] = field(default_factory=dict)
    # per real flow: (name, source, true class, predicted class, time to decision s)
    flows: list[tuple[str, str, str, str, float]] = field(default_factory=list)
    # per real flow, in `flows` order: the label the decision rule settles on ("": none)
    decided: list[str] = field(default_factory=list)
    # the cloud-gaming threshold each fold's model chose on its training captures
    fold_thresholds: list[float] = field(default_factory=list)

    def decision_alarms(self) -> dict[str, float]:
        """Real non-gaming flows the decision rule ever decides cloud gaming (the engine's
        gaming decision is final), GeForce Now set-up flows left out as in game_stream_scores."""
        rows = [(f, d) for f, d in zip(self.flows, self.decided, strict=True)
                if "geforcenow" not in f[1] and f[2] != "cloud_gaming"]
        fp = sum(1 for _, d in rows if d == "cloud_gaming")
        return {"false_alarms": float(fp), "negatives": float(len(rows)),
                "per_1000": 1000 * fp / len(rows) if rows else 0.0}

    def game_stream_scores(self) -> dict[str, float]:
        """Binary cloud gaming vs rest over real flows, positives being game STREAMS: the
        GeForce Now set-up flows of the nDPI capture (TLS/DTLS signalling) are left out."""
        rows = [f for f in self.flows if "geforcenow" not in f[1]]
        tp = sum(1 for f in rows if f[2] == "cloud_gaming" and f[3] == "cloud_gaming")
        fp = sum(1 for f in rows if f[2] != "cloud_gaming" and f[3] == "cloud_gaming")
        fn = sum(1 for f in rows if f[2] == "cloud_gaming" and f[3] != "cloud_gaming")
        negatives = sum(1 for f in rows if f[2] != "cloud_gaming")
        p = tp / (tp + fp) if tp + fp else 0.0
        r = tp / (tp + fn) if tp + fn else 0.0
        return {"precision": p, "recall": r, "f1": 2 * p * r / (p + r) if p + r else 0.0,
                "streams": float(tp + fn), "false_positives": float(fp),
                "negatives": float(negatives),
                "false_alarms_per_1000": 1000 * fp / negatives if negatives else 0.0}

    def metrics(self) -> dict[str, float | dict[str, float]]:
        cg = self.per_class.get("cloud_gaming", {})
        ttd = [t for t in self.decision_s.get("cloud_gaming", []) if np.isfinite(t)]
        return {
            "cloud_gaming_f1": cg.get("f1", 0.0),
            "cloud_gaming_precision": cg.get("precision", 0.0),
            "cloud_gaming_recall": cg.get("recall", 0.0),
            "macro_f1": float(np.mean([m["f1"] for m in self.per_class.values()])),
            "cloud_gaming_decision_p50_s": float(np.median(ttd)) if ttd else float("nan"),
            # over every real gaming flow, a never-confident one counting as infinitely slow
            "cloud_gaming_decision_p90_s": _pct(self.decision_s.get("cloud_gaming", []), 90)
            or float("inf"),
            "game_stream_f1": self.game_stream_scores()["f1"] if self.flows else float("nan"),
            "per_class_f1": {c: m["f1"] for c, m in self.per_class.items()},
        }


def _flow_level(ex: Examples, proba: np.ndarray, classes: np.ndarray, thresholds: np.ndarray):
    """Per flow: true label, proba at its longest prefix, time to decision (inf unless the
    decision rule settles on the true label), synthetic, the label it settles on.
    `thresholds`: per row, the decision thresholds of the model that predicted it."""
    out = []
    for f in np.unique(ex.flow):
        rows = np.where(ex.flow == f)[0]
        rows = rows[np.argsort(ex.prefix_s[rows])]
        true = ex.y[rows[0]]
        label, at = decision.decide(proba[rows], ex.prefix_s[rows], classes,
                                    thresholds[rows[0]])
        ttd = float(at) if label == true and at is not None else float("inf")
        out.append((f, true, proba[rows[-1]], ttd, bool(ex.synthetic[rows[0]]), label))
    return out


def cross_validate(
    ex: Examples,
    n_splits: int = 5,
    estimator: Callable[[], FlowClassifier] = FlowClassifier,
    progress: Callable[[], None] | None = None,
    flows_meta: Sequence[LabelledFlow] | None = None,
    train_synthetic: bool = True,
) -> Evaluation:
    """Held-out predictions of `estimator()` (a FlowClassifier) per capture group; the platform
    forest of each fold has the same parameters. `train_synthetic=False` leaves the synthetic
    sessions out of every training fold (the ablation "without synthetic data")."""
    groups = np.unique(ex.groups)
    n_splits = min(n_splits, len(groups))
    classes = np.array(sorted(set(ex.y)))
    proba = np.zeros((len(ex.y), len(classes)))
    thresholds = np.ones((len(ex.y), len(classes)))
    fold_thresholds = []
    plat_pred = np.array([""] * len(ex.y), dtype=object)
    for train, test in GroupKFold(n_splits=n_splits).split(ex.X, ex.y, ex.groups):
        if not train_synthetic:
            train = train[~ex.synthetic[train]]
        clf = estimator()
        m = FlowModel.fit(ex.X[train], ex.y[train], ex.platform[train], groups=ex.groups[train],
                          flow=ex.flow[train], **clf.get_params())
        p = m.predict_proba(ex.X[test])
        for j, c in enumerate(m.classes_):
            col = np.searchsorted(classes, c)
            proba[test, col] = p[:, j]
            thresholds[test, col] = m.decision_threshold_[j]
        fold_thresholds.append(m.classifier.thresholds().get(decision.GAMING, 1.0))
        plat_pred[test] = m.predict_platform(ex.X[test])[0]
        if progress is not None:
            progress()
    flows = _flow_level(ex, proba, classes, thresholds)
    real = [f for f in flows if not f[4]]
    y_true = np.array([f[1] for f in real])
    P = np.array([f[2] for f in real])
    y_pred = classes[P.argmax(1)]
    present = [c for c in CLASSES if c in set(y_true)]
    p, r, f1, s = precision_recall_fscore_support(
        y_true, y_pred, labels=present, zero_division=0
    )
    per_class = {
        c: {"precision": float(p[i]), "recall": float(r[i]), "f1": float(f1[i]),
            "support": float(s[i])}
        for i, c in enumerate(present)
    }
    pr = {}
    for c in present:
        j = int(np.searchsorted(classes, c))
        prec, rec, _ = precision_recall_curve(y_true == c, P[:, j])
        pr[c] = (rec.tolist(), prec.tolist())
    ttd: dict[str, list[float]] = {}
    for f in real:
        ttd.setdefault(f[1], []).append(f[3])
    # platform accuracy on held-out gaming rows that carry a platform label, at the last prefix
    plat_acc = {}
    last = {}
    for i in range(len(ex.y)):
        if (ex.y[i] == "cloud_gaming" and ex.platform[i]) and (
            ex.flow[i] not in last or ex.prefix_s[i] > ex.prefix_s[last[ex.flow[i]]]
        ):
            last[ex.flow[i]] = i
    for kind, want in (("real", False), ("synthetic", True)):
        idx = [i for i in last.values() if ex.synthetic[i] == want]
        if idx:
            plat_acc[kind] = float(np.mean([plat_pred[i] == ex.platform[i] for i in idx]))
    counts: dict[str, dict[str, int]] = {}
    for f in flows:
        kind = "synthetic" if f[4] else "real"
        counts.setdefault(f[1], {"real": 0, "synthetic": 0})[kind] += 1
    per_flow, decided = [], []
    for f in real:
        decided.append(f[5])
        meta = flows_meta[f[0]] if flows_meta is not None else None
        per_flow.append((
            meta.name if meta else str(f[0]), meta.source if meta else "", str(f[1]),
            str(classes[int(np.argmax(f[2]))]), f[3],
        ))
    return Evaluation(
        flows=per_flow,
        decided=decided,
        fold_thresholds=fold_thresholds,
        classes=present,
        per_class=per_class,
        confusion=confusion_matrix(y_true, y_pred, labels=present).tolist(),
        flows_real=len(real),
        captures_real=len({ex.groups[ex.flow == f[0]][0] for f in real}),
        flows_synthetic=len(flows) - len(real),
        decision_s=ttd,
        platform_accuracy=plat_acc,
        folds=n_splits,
        pr_curves=pr,
        counts=counts,
    )


def train(ex: Examples, evaluation: Evaluation | None = None, **params) -> tuple[
    FlowModel, ModelCard
]:
    """The deployed model on every example; `params` are FlowClassifier's."""
    model = FlowModel.fit(ex.X, ex.y, ex.platform, groups=ex.groups, flow=ex.flow, **params)
    captures = sorted(set(ex.groups.tolist()))
    synthetic = sorted(set(ex.groups[ex.synthetic].tolist()))
    card = ModelCard(
        format=MODEL_FORMAT,
        format_version=FORMAT_VERSION,
        version=new_version(),
        created=new_version(),
        features=list(params.get("features") or CLASSIFIER_FEATURES),
        classes=[str(c) for c in model.classes_],
        platforms=[] if model.platform is None else [str(c) for c in model.platform.classes_],
        training_data_sha256=ex.digest(),
        training_examples=len(ex.y),
        training_captures=captures,
        synthetic_captures=synthetic,
        # a card holds finite figures only (JSON has no infinity: a never-decided p90 is left out)
        metrics={**{k: v for k, v in (evaluation.metrics() if evaluation else {}).items()
                    if not isinstance(v, float) or np.isfinite(v)},
                 "decision_threshold_fit": model.classifier.threshold_fit_},
        records_source=RECORDS_SOURCE,
    )
    return model, card


# ---------------------------------------------------------------- report


def _png(fig) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    return base64.b64encode(buf.getvalue()).decode()


def write_report(
    ev: Evaluation,
    out_dir: Path,
    card: ModelCard | None = None,
    extra_html: str = "",
    extra_metrics: dict | None = None,
) -> Path:
    """report.html, metrics.json and the plots; `extra_*` (generalisation.py's lab cases,
    per-source figures and ablations) are added to both."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    images: dict[str, str] = {}

    fig, ax = plt.subplots(figsize=(6.5, 5.5))
    cm = np.array(ev.confusion)
    ax.imshow(cm, cmap="Blues")
    ax.set_xticks(range(len(ev.classes)), ev.classes, rotation=40, ha="right")
    ax.set_yticks(range(len(ev.classes)), ev.classes)
    for i in range(len(cm)):
        for j in range(len(cm)):
            ax.text(j, i, str(cm[i, j]), ha="center", va="center",
                    color="white" if cm[i, j] > cm.max() / 2 else "black")
    ax.set_xlabel("predicted")
    ax.set_ylabel("true")
    ax.set_title("Confusion matrix (real held-out flows)")
    images["confusion_matrix"] = _png(fig)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(6.5, 5))
    for c, (rec, prec) in ev.pr_curves.items():
        ax.plot(rec, prec, label=c)
    ax.set_xlabel("recall")
    ax.set_ylabel("precision")
    ax.set_title("Precision-recall per class (one vs rest)")
    ax.legend(fontsize=8)
    images["precision_recall"] = _png(fig)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(6.5, 5))
    for c, ts in sorted(ev.decision_s.items()):
        t = np.sort(np.array(ts))
        finite = t[np.isfinite(t)]
        xs = [0.0, *np.repeat(finite, 2).tolist(), max(PREFIXES_S) * 1.2]
        ys = [0.0, 0.0]
        for k in range(1, len(finite) + 1):
            ys += [k / len(t), k / len(t)]
        ys = [*ys[: len(xs) - 1], len(finite) / len(t)]
        ax.plot(xs, ys, label=f"{c} (n={len(t)})")
    ax.set_xscale("symlog", linthresh=0.5)
    ax.set_xlabel("seconds of flow until decided right (decision rule, decision.py)")
    ax.set_ylabel("fraction of flows")
    ax.set_title("Time-to-decision CDF (real held-out flows)")
    ax.legend(fontsize=8)
    images["time_to_decision_cdf"] = _png(fig)
    plt.close(fig)

    for name, b64 in images.items():
        (out_dir / f"{name}.png").write_bytes(base64.b64decode(b64))
    metrics = {
        "per_class": ev.per_class,
        "confusion": {"labels": ev.classes, "matrix": ev.confusion},
        "flows_real": ev.flows_real,
        "captures_real": ev.captures_real,
        "flows_synthetic": ev.flows_synthetic,
        "folds": ev.folds,
        "platform_accuracy": ev.platform_accuracy,
        "time_to_decision_s": {
            c: {
                "p50": _pct(ts, 50), "p90": _pct(ts, 90),
                "never_decided_right": int(sum(1 for t in ts if not np.isfinite(t))), "n": len(ts),
            }
            for c, ts in ev.decision_s.items()
        },
        "counts": ev.counts,
        "game_streams": ev.game_stream_scores(),
        "decision_rule": {"false_alarms": ev.decision_alarms(),
                          "fold_gaming_thresholds": ev.fold_thresholds},
        "misclassified": [f[:4] for f in ev.flows if f[2] != f[3]],
        "summary": ev.metrics(),
        **(extra_metrics or {}),
    }
    (out_dir / "metrics.json").write_text(json.dumps(metrics, indent=2, default=str))
    rows = "".join(
        f"<tr><td>{c}</td><td>{m['precision']:.3f}</td><td>{m['recall']:.3f}</td>"
        f"<td>{m['f1']:.3f}</td><td>{int(m['support'])}</td>"
        f"<td>{ev.counts.get(c, {}).get('synthetic', 0)}</td></tr>"
        for c, m in ev.per_class.items()
    )
    ttd = "".join(
        f"<tr><td>{c}</td><td>{v['n']}</td><td>{v['p50']}</td><td>{v['p90']}</td>"
        f"<td>{v['never_decided_right']}</td></tr>"
        for c, v in metrics["time_to_decision_s"].items()
    )
    wrong = "".join(
        f"<tr><td>{html.escape(n)}</td><td>{html.escape(s)}</td><td>{t}</td><td>{p}</td></tr>"
        for n, s, t, p, _ in ev.flows if t != p
    )
    card_html = (
        f"<p>Model {html.escape(card.version)}, training-data SHA-256 "
        f"<code>{card.training_data_sha256[:16]}…</code>, {card.training_examples} examples "
        f"from {len(card.training_captures)} captures ({len(card.synthetic_captures)} synthetic)."
        "</p>" if card else ""
    )
    imgs = "".join(
        f'<figure><img alt="{n}" src="data:image/png;base64,{b}"><figcaption>{n}</figcaption>'
        "</figure>"
        for n, b in images.items()
    )
    page = f"""<!doctype html><html><head><meta charset="utf-8">
<title>cgloop flow classifier evaluation</title>
<style>body{{font-family:sans-serif;max-width:980px;margin:2em auto}}
table{{border-collapse:collapse}}td,th{{border:1px solid #ccc;padding:3px 8px}}
figure{{display:inline-block;margin:8px}}img{{max-width:460px}}</style></head><body>
<h1>Gaming-flow classifier: evaluation on held-out real captures</h1>
{card_html}
<p>{ev.folds}-fold cross-validation grouped by capture: each capture's flows are predicted by a
model trained without that capture. Numbers below are on <b>{ev.flows_real} real flows from
{ev.captures_real} captures</b> (flow level, longest prefix ≤ {max(PREFIXES_S)} s);
{ev.flows_synthetic} synthetic flows (platform profiles, MOSAICO D234 §2.1, and sessions drawn at
random) were used in training folds only and are not counted.</p>
<h2>Per class</h2><table><tr><th>class</th><th>precision</th><th>recall</th><th>F1</th>
<th>real flows</th><th>synthetic flows</th></tr>{rows}</table>
<p>Game streams only (binary cloud gaming vs everything else, GeForce Now set-up flows left
out): {html.escape(json.dumps({k: round(v, 3) for k, v in ev.game_stream_scores().items()}))}</p>
<h2>Time to decision (s)</h2><p>The engine's decision rule (decision.py): the top class is
decided at its threshold, cloud gaming's chosen by each fold's model on its own training
captures (out-of-fold, at most 1 false gaming decision per 1,000 other training flows):
{html.escape(", ".join(f"{t:g}" for t in ev.fold_thresholds))}; a gaming decision is final.
Real non-gaming flows ever decided cloud gaming:
{html.escape(json.dumps({k: round(v, 3) for k, v in ev.decision_alarms().items()}))}.</p>
<table><tr><th>class</th><th>flows</th><th>p50</th><th>p90</th>
<th>never decided right</th></tr>{ttd}</table>
<p>Platform accuracy on held-out gaming flows: {html.escape(json.dumps(ev.platform_accuracy))}
(real platforms present: xc from the Xbox dataset, gfn from nDPI's set-up capture only).</p>
<h2>Read this before trusting the numbers</h2><ul>
<li>Small data: cloud gaming has 32 real Xbox flow pairs from 22 sessions and 2 GeForce Now
set-up flows; several nDPI classes have fewer than 10 flows from one or two pcaps.</li>
<li>The Xbox data set publishes per-flow means only; its flows are expanded into stationary
interval records, so time-to-decision for them is optimistic. The nDPI pcaps are real packet
timing but mostly session set-up, not long streams.</li>
<li>The classifier uses features of a cloud-gaming session's structure, not its bitrate
({", ".join(CLASSIFIER_FEATURES)}). The Xbox flows are stationary expansions of their means,
so their variance features are near zero, positives and negatives alike.</li></ul>
{extra_html}
<h2>Plots</h2>{imgs}
<h2>Misclassified real flows</h2><table><tr><th>flow</th><th>source</th><th>true</th>
<th>predicted</th></tr>{wrong}</table>
<p>Data: Xbox Cloud Gaming (dcomp-leris/VR-AR-CG-network-telemetry, BSD-3-Clause); nDPI test
pcaps (ntop/nDPI, LGPL-3.0).</p></body></html>"""
    path = out_dir / "report.html"
    path.write_text(page)
    return path


def _pct(ts: list[float], q: float) -> float | None:
    finite = [t for t in ts if np.isfinite(t)]
    if not finite:
        return None
    # percentiles over all flows, counting never-confident ones as +inf
    v = float(np.percentile(np.array(ts, dtype=float), q, method="higher"))
    return v if np.isfinite(v) else None
