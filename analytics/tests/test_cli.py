"""The analytics commands, run as a user would."""

from __future__ import annotations

import json

from .conftest import need_data


def test_evaluate_writes_a_self_contained_report(run_cgloop, tmp_path):
    need_data("xbox-cloud-gaming")
    out = tmp_path / "report"
    res = run_cgloop("evaluate", "--out-dir", str(out), "--max-background", "10",
                     "--synthetic", "1", "--synthetic-random", "8", "--folds", "3",
                     "--lab-cases", "4", "--lab-others", "3", "--curve-repeats", "1",
                     # ~45 s on an idle machine; each fold's model also fits its decision
                     # threshold, and the shared 2 cores run 10-20 jobs deep at times
                     timeout=600)
    assert res.returncode == 0, res.stderr
    html = (out / "report.html").read_text()
    assert html.count("data:image/png;base64,") == 3  # plots embedded, no external files needed
    for name in ("confusion_matrix", "precision_recall", "time_to_decision_cdf"):
        assert (out / f"{name}.png").read_bytes()[:4] == b"\x89PNG"
    assert "Small data" in html and "Game streams only" in html
    for section in ("Per data source", "Non-circular lab cases", "lab gaming sessions",
                    "Ablation", "Learning curve"):
        assert section in html
    metrics = json.loads((out / "metrics.json").read_text())
    assert [r["name"] for r in metrics["ablation"]][:2] == ["deployed", "without synthetic"]
    assert any(r["name"] == "without cadence" for r in metrics["ablation"])
    assert sum(c["cases"] for c in metrics["lab_cases"]["by_condition"].values()) == 4
    negatives = metrics["lab_cases"]["negatives"]
    assert set(negatives) == {"video_streaming", "realtime_call", "bulk"}
    assert sum(n["negatives"] for n in negatives.values()) == 3
    assert metrics["decision_rule"]["fold_gaming_thresholds"]
    curve = metrics["learning_curve"]
    assert {p["fraction"] for p in curve["points"]} == {0.25, 0.5, 0.75, 1.0}
    assert set(curve["summary"]) == set(metrics["per_class"])
    assert set(metrics["per_source"]) == {"xbox-cloud-gaming", "ndpi-pcaps"}
    assert {"game_stream_f1_real", "game_stream_f1_lab_cases",
            "false_alarms_per_1000_other_real_flows",
            "false_alarms_per_1000_lab_negatives_decision_rule"} <= set(metrics["targets"])


def test_pcap_command_rejects_a_non_capture(run_cgloop, tmp_path):
    bad = tmp_path / "x.pcap"
    bad.write_bytes(b"\x00" * 64)
    res = run_cgloop("analytics", "pcap", str(bad))
    assert res.returncode == 2
    assert "not a pcap" in " ".join(res.stderr.split())


def test_model_info_refuses_a_non_model(run_cgloop, tmp_path):
    bad = tmp_path / "m.skops"
    bad.write_bytes(b"not a zip")
    res = run_cgloop("analytics", "model-info", str(bad))
    assert res.returncode == 1 and "not a readable model" in " ".join(res.stderr.split())


def test_run_refuses_a_malformed_int_switch_map(run_cgloop):
    for option, value, says in (
        ("--int-switch", "core=1", "'core' is not a switch id or port number"),
        ("--int-switch", "1", "'1' is not ID=NODE"),
        ("--int-port", "1=edge1", "'' is not a switch id or port number"),
        ("--int-port", "1:x=edge1", "'x' is not a switch id or port number"),
    ):
        res = run_cgloop("analytics", "run", option, value)
        text = " ".join(res.stderr.replace("│", " ").split())  # the error box wraps it
        assert res.returncode == 2 and option in text and says in text, (option, value, text)
