"""The `cgloop policy` commands, run as a user would."""

from __future__ import annotations

from pathlib import Path

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def test_validate_shipped_and_bad_files(run_cgloop, tmp_path: Path) -> None:
    ok = run_cgloop("policy", "validate")
    assert ok.returncode == 0, ok.stderr
    assert "8 policies valid" in ok.stdout
    bad = tmp_path / "bad.yaml"
    bad.write_text("id: x\nmatch:\n  kinds: [slo_latency]\naction:\n  operation: teleport\n")
    res = run_cgloop("policy", "validate", str(bad))
    assert res.returncode == 1
    assert f"{bad}:5: action.operation: Input should be" in res.stderr.replace("\n", "")


def test_plan_natif_prints_the_fig_6_2_mapping(run_cgloop) -> None:
    res = run_cgloop("policy", "plan", "natif", str(EXAMPLES / "natif-fig-6-2.yaml"), "--baseline")
    assert res.returncode == 0, res.stderr
    assert "instances: {'X': 3, 'Y': 3}" in res.stdout
    assert "c,a,d" in res.stdout and "a,f,b" in res.stdout
    assert "throughput-only" in res.stdout


def test_schema_command_prints_json(run_cgloop) -> None:
    res = run_cgloop("policy", "schema")
    assert res.returncode == 0 and '"title": "cgloop policy file"' in res.stdout
