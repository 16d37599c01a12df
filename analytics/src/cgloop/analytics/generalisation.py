"""What `cgloop evaluate` adds to the held-out captures (issue 21): figures per data source,
the non-circular lab cases (`labcases.py`) and the ablations.

* **per source**: per class and per data source (the Xbox data set, nDPI's pcaps), precision,
  recall, F1 and time to decision p50/p90 of the real held-out flows;
* **lab cases**: a model trained on every training capture (real and synthetic) classifies
  sessions of a generator training never uses, at bitrates outside the training range, clean
  and under loss, jitter and a rate cap. Their F1 counts the lab's gaming sessions as the
  positives and the false alarms of the real held-out negatives (the cross-validation's) as
  false positives, as before the lab had negatives; a second F1 adds the false alarms on the
  lab's own negatives (`labothers.py`: adaptive video streaming, video calls, bulk downloads
  from the same generator), whose false cloud-gaming alarms per 1,000 are reported apart, at
  the longest prefix and under the decision rule (`decision.py`);
* **ablations**: the same two evaluations with the synthetic sessions left out of training,
  with each feature group (`features.FEATURE_GROUPS`) left out, with the downstream's volume
  added, and with the former model's mean-based features.
"""

from __future__ import annotations

import html
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

import numpy as np
from cgloop.analytics.datasets import Examples, LabelledFlow
from cgloop.analytics.evaluate import Evaluation, _flow_level, _pct, cross_validate
from cgloop.analytics.features import CLASSIFIER_FEATURES, FEATURE_GROUPS, VOLUME_FEATURES
from cgloop.analytics.model import FlowClassifier, FlowModel

# The classifier before issue 21: per-flow means, the downstream's rate among them.
FORMER_FEATURES: tuple[str, ...] = (
    "dn_bps", "dn_pps", "dn_size_mean", "dn_iat_mean_ms", "dn_burst_rate", "dn_pkts_per_burst",
    "up_bps", "up_pps", "up_size_mean", "up_iat_mean_ms", "byte_ratio_up", "pkt_ratio_up",
    "is_udp", "is_tcp",
)


def variants() -> list[tuple[str, tuple[str, ...], bool]]:
    """(name, features, synthetic sessions in training) of each evaluated model."""
    out = [("deployed", CLASSIFIER_FEATURES, True), ("without synthetic", CLASSIFIER_FEATURES,
                                                     False)]
    for g, names in FEATURE_GROUPS.items():
        out.append((f"without {g}", tuple(n for n in CLASSIFIER_FEATURES if n not in names),
                    True))
    out.append(("with volume", CLASSIFIER_FEATURES + VOLUME_FEATURES, True))
    out.append(("former features", FORMER_FEATURES, True))
    return out


@dataclass
class CaseResult:
    name: str
    condition: str
    predicted: str
    p: float
    decision_s: float  # inf: the decision rule never settles on the right label
    decided: str = ""  # the label the decision rule settles on ("": never decided)
    label: str = "cloud_gaming"  # the session's true class

    @property
    def gaming(self) -> bool:
        return self.label == "cloud_gaming"


@dataclass
class VariantResult:
    name: str
    features: int
    synthetic: bool
    real_f1: float
    false_alarms: int
    negatives: int
    alarms_per_1000: float
    decision_alarms_per_1000: float  # real negatives the decision rule ever decides gaming
    real_ttd_p50: float | None
    real_ttd_p90: float | None
    lab_detected: int
    lab_cases: int
    lab_f1: float
    lab_ttd_p90: float | None
    lab_negatives: int = 0
    lab_false_alarms: int = 0  # lab negatives taken for gaming at their longest prefix
    lab_decision_alarms: int = 0  # lab negatives the decision rule ever decides gaming
    lab_f1_own_negatives: float = 0.0  # lab_f1 with the lab negatives' false alarms added


def classify_cases(model: FlowModel, ex: Examples, flows: Sequence[LabelledFlow]):
    """Flow-level verdicts on the lab cases (rows of `ex`; `flows` their LabelledFlows)."""
    if not len(ex.y):
        return []
    out = []
    thresholds = np.tile(model.decision_threshold_, (len(ex.y), 1))
    levels = _flow_level(ex, model.predict_proba(ex.X), model.classes_, thresholds)
    for f, _, proba, decision, _, decided in levels:
        j = int(np.argmax(proba))
        flow = flows[f]
        out.append(CaseResult(flow.name, flow.name.split("/")[1], str(model.classes_[j]),
                              float(proba[j]), decision, decided, flow.label))
    return out


def lab_f1(cases: Sequence[CaseResult], false_alarms: int) -> float:
    """Game-stream F1 of the lab's gaming sessions (the positives; negatives among `cases` are
    not counted) with `false_alarms` false positives."""
    pos = [c for c in cases if c.gaming]
    tp = sum(1 for c in pos if c.predicted == "cloud_gaming")
    fn = len(pos) - tp
    return 2 * tp / (2 * tp + fn + false_alarms) if tp else 0.0


def lab_alarms(cases: Sequence[CaseResult]) -> dict[str, float]:
    """False cloud-gaming alarms on the lab's negatives: at the longest prefix (`predicted`)
    and under the decision rule (`decided`), with their rates per 1,000."""
    neg = [c for c in cases if not c.gaming]
    fp = sum(1 for c in neg if c.predicted == "cloud_gaming")
    fd = sum(1 for c in neg if c.decided == "cloud_gaming")
    n = len(neg)
    return {"negatives": float(n), "false_alarms": float(fp), "decision_alarms": float(fd),
            "per_1000": 1000 * fp / n if n else 0.0,
            "decision_per_1000": 1000 * fd / n if n else 0.0}


def per_source(ev: Evaluation) -> dict[str, dict[str, dict[str, float | None]]]:
    """source → class → precision, recall, F1, flows, time to decision p50/p90 (real flows).
    A class's precision counts the source's flows predicted as it."""
    out: dict[str, dict[str, dict[str, float | None]]] = {}
    for src in sorted({f[1].split("/")[0] for f in ev.flows}):
        rows = [f for f in ev.flows if f[1].split("/")[0] == src]
        for c in sorted({f[2] for f in rows}):
            tp = sum(1 for f in rows if f[2] == c and f[3] == c)
            pred = sum(1 for f in rows if f[3] == c)
            n = sum(1 for f in rows if f[2] == c)
            p, r = (tp / pred if pred else 0.0), tp / n
            ttd = [f[4] for f in rows if f[2] == c]
            out.setdefault(src, {})[c] = {
                "precision": p, "recall": r, "f1": 2 * p * r / (p + r) if p + r else 0.0,
                "flows": float(n), "ttd_p50_s": _pct(ttd, 50), "ttd_p90_s": _pct(ttd, 90),
            }
    return out


def run(
    ex: Examples,
    flows: Sequence[LabelledFlow],
    lab_ex: Examples,
    lab_flows: Sequence[LabelledFlow],
    folds: int = 5,
    n_estimators: int = 80,
    ablation: bool = True,
    progress: Callable[[str], None] | None = None,
) -> tuple[Evaluation, list[CaseResult], list[VariantResult]]:
    """The deployed model's held-out evaluation and lab-case verdicts, and one VariantResult per
    variant (only the deployed one without `ablation`)."""
    chosen = variants() if ablation else variants()[:1]
    results, main_ev, main_cases = [], None, []
    for name, feats, synthetic in chosen:
        if progress is not None:
            progress(name)

        def est(feats=feats):
            return FlowClassifier(n_estimators=n_estimators, features=feats)

        ev = cross_validate(ex, n_splits=folds, estimator=est, flows_meta=flows,
                            train_synthetic=synthetic)
        keep = np.ones(len(ex.y), dtype=bool) if synthetic else ~ex.synthetic
        model = FlowModel.fit(ex.X[keep], ex.y[keep], ex.platform[keep],
                              groups=ex.groups[keep], flow=ex.flow[keep],
                              n_estimators=n_estimators, features=feats)
        cases = classify_cases(model, lab_ex, lab_flows)
        gs = ev.game_stream_scores()
        ttd = ev.decision_s.get("cloud_gaming", [])
        pos = [c for c in cases if c.gaming]
        la = lab_alarms(cases)
        results.append(VariantResult(
            name=name, features=len(feats), synthetic=synthetic, real_f1=gs["f1"],
            false_alarms=int(gs["false_positives"]), negatives=int(gs["negatives"]),
            alarms_per_1000=gs["false_alarms_per_1000"],
            decision_alarms_per_1000=ev.decision_alarms()["per_1000"], real_ttd_p50=_pct(ttd, 50),
            real_ttd_p90=_pct(ttd, 90),
            lab_detected=sum(1 for c in pos if c.predicted == "cloud_gaming"),
            lab_cases=len(pos), lab_f1=lab_f1(cases, int(gs["false_positives"])),
            lab_ttd_p90=_pct([c.decision_s for c in pos], 90),
            lab_negatives=int(la["negatives"]), lab_false_alarms=int(la["false_alarms"]),
            lab_decision_alarms=int(la["decision_alarms"]),
            lab_f1_own_negatives=lab_f1(cases, int(gs["false_positives"] + la["false_alarms"])),
        ))
        if main_ev is None:
            main_ev, main_cases = ev, cases
    assert main_ev is not None
    return main_ev, main_cases, results


def metrics(ev: Evaluation, cases: Sequence[CaseResult], rows: Sequence[VariantResult]) -> dict:
    """The part of metrics.json this module adds, with the issue's targets."""
    main = rows[0]
    by_cond: dict[str, dict[str, float | None]] = {}
    pos = [c for c in cases if c.gaming]
    for cond in sorted({c.condition for c in pos}):
        sub = [c for c in pos if c.condition == cond]
        by_cond[cond] = {
            "detected": float(sum(1 for c in sub if c.predicted == "cloud_gaming")),
            "cases": float(len(sub)), "ttd_p50_s": _pct([c.decision_s for c in sub], 50),
            "ttd_p90_s": _pct([c.decision_s for c in sub], 90),
        }
    by_kind: dict[str, dict[str, float]] = {}
    for kind in sorted({c.label for c in cases if not c.gaming}):
        sub = [c for c in cases if c.label == kind]
        by_kind[kind] = {**lab_alarms(sub),
                         "right": float(sum(1 for c in sub if c.predicted == kind))}
    return {
        "targets": {
            "game_stream_f1_real": {"value": main.real_f1, "target": ">= 0.95"},
            "game_stream_f1_lab_cases": {"value": main.lab_f1, "target": ">= 0.95"},
            "false_alarms_per_1000_other_real_flows": {"value": main.alarms_per_1000,
                                                       "target": "<= 1"},
            "false_alarms_per_1000_other_real_flows_decision_rule": {
                "value": main.decision_alarms_per_1000, "target": "<= 1"},
            "cloud_gaming_ttd_p90_s_real": {"value": main.real_ttd_p90, "target": "<= 1"},
            "cloud_gaming_ttd_p90_s_lab_cases": {"value": main.lab_ttd_p90, "target": "<= 1"},
            "game_stream_f1_lab_cases_own_negatives": {"value": main.lab_f1_own_negatives,
                                                       "target": ">= 0.95"},
            "false_alarms_per_1000_lab_negatives_decision_rule": {
                "value": 1000 * main.lab_decision_alarms / main.lab_negatives
                if main.lab_negatives else None, "target": "<= 1"},
        },
        "per_source": per_source(ev),
        "lab_cases": {"by_condition": by_cond, "negatives": by_kind,
                      "cases": [asdict(c) for c in cases]},
        "ablation": [asdict(r) for r in rows],
    }


def _fmt(v: float | None) -> str:
    return "never" if v is None else f"{v:g}"


def html_section(ev: Evaluation, cases: Sequence[CaseResult],
                 rows: Sequence[VariantResult]) -> str:
    src = "".join(
        f"<tr><td>{html.escape(s)}</td><td>{c}</td><td>{m['precision']:.3f}</td>"
        f"<td>{m['recall']:.3f}</td><td>{m['f1']:.3f}</td><td>{int(m['flows'] or 0)}</td>"
        f"<td>{_fmt(m['ttd_p50_s'])}</td><td>{_fmt(m['ttd_p90_s'])}</td></tr>"
        for s, by in per_source(ev).items() for c, m in by.items()
    )
    abl = "".join(
        f"<tr><td>{html.escape(r.name)}</td><td>{r.features}</td><td>{r.real_f1:.3f}</td>"
        f"<td>{r.false_alarms}/{r.negatives} ({r.alarms_per_1000:.2f}‰)</td>"
        f"<td>{_fmt(r.real_ttd_p50)}</td><td>{_fmt(r.real_ttd_p90)}</td>"
        f"<td>{r.lab_detected}/{r.lab_cases}</td><td>{r.lab_f1:.3f}</td>"
        f"<td>{_fmt(r.lab_ttd_p90)}</td>"
        f"<td>{r.lab_false_alarms}/{r.lab_negatives} ({r.lab_decision_alarms})</td>"
        f"<td>{r.lab_f1_own_negatives:.3f}</td></tr>"
        for r in rows
    )
    missed = "".join(
        f"<tr><td>{html.escape(c.name)}</td><td>{c.label}</td><td>{c.predicted}</td>"
        f"<td>{c.decided or 'never'}</td><td>{c.p:.2f}</td></tr>"
        for c in cases if (c.predicted == "cloud_gaming") != c.gaming
        or (not c.gaming and c.decided == "cloud_gaming")
    )
    pos = [c for c in cases if c.gaming]
    neg = lab_alarms(cases)
    by_cond = "".join(
        f"<tr><td>{html.escape(cond)}</td><td>{int(m['detected'] or 0)}/{int(m['cases'] or 0)}"
        f"</td><td>{_fmt(m['ttd_p50_s'])}</td><td>{_fmt(m['ttd_p90_s'])}</td></tr>"
        for cond, m in metrics(ev, cases, rows)["lab_cases"]["by_condition"].items()
    )
    every = [c.decision_s for c in pos]
    by_cond += (f"<tr><td>all</td><td>{sum(1 for c in pos if c.predicted == 'cloud_gaming')}/"
                f"{len(pos)}</td><td>{_fmt(_pct(every, 50))}</td><td>{_fmt(_pct(every, 90))}"
                "</td></tr>")
    return f"""<h2>Per data source (real held-out flows)</h2><table><tr><th>source</th>
<th>class</th><th>precision</th><th>recall</th><th>F1</th><th>flows</th><th>decision p50 s</th>
<th>p90 s</th></tr>{src}</table>
<h2>Non-circular lab cases</h2><p>{len(pos)} cloud-gaming sessions from a generator training
never uses (labcases.py), at bitrates outside the training range, clean and under loss, jitter
and a rate cap, and {int(neg["negatives"])} sessions of other traffic from the same generator
(labothers.py: adaptive video streaming, video calls, bulk downloads); classified by a model
trained on every training capture. Lab F1 counts the gaming sessions as positives and the real
held-out negatives' false alarms as false positives; "with own negatives" adds the lab
negatives taken for gaming. False gaming alarms on the lab negatives:
{int(neg["false_alarms"])} of {int(neg["negatives"])} at the longest prefix,
{int(neg["decision_alarms"])} decided by the rule ({neg["decision_per_1000"]:.0f} per 1,000).
Marked synthetic.</p>
<table><tr><th>lab gaming sessions</th><th>detected</th><th>decision p50 s</th><th>p90 s</th>
</tr>{by_cond}</table>
<table><tr><th>wrong case</th><th>true</th><th>predicted</th><th>decided</th><th>p</th></tr>
{missed}</table>
<h2>Ablation</h2><table><tr><th>model</th><th>features</th><th>game-stream F1 (real)</th>
<th>false alarms (real)</th><th>decision p50 s</th><th>p90 s</th><th>lab detected</th>
<th>lab F1</th><th>lab decision p90 s</th><th>lab negatives taken for gaming (decided)</th>
<th>lab F1 with own negatives</th></tr>{abl}</table>"""
