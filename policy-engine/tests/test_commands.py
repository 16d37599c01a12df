"""The `cgloop policy` commands, run as a user would."""

from __future__ import annotations

from pathlib import Path

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def test_validate_shipped_and_bad_files(run_cgloop, tmp_path: Path) -> None:
    ok = run_cgloop("policy", "validate")
    assert ok.returncode == 0, ok.stderr
    assert "12 policies valid" in ok.stdout
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


def test_validate_refuses_bad_values_and_non_utf8_files_in_one_line(
    run_cgloop, tmp_path: Path
) -> None:
    head = "id: x\nmatch:\n  kinds: [slo_latency]\naction:\n  operation: reprioritise_flow\n"
    dscp = tmp_path / "dscp.yaml"
    dscp.write_text(head + "  parameters: {class_id: 0x10010, rewrite_dscp: 99}\n")
    res = run_cgloop("policy", "validate", str(dscp))
    assert res.returncode == 1
    want = f"{dscp}:6: action.parameters.rewrite_dscp: should be within 0..63"
    assert want in res.stderr.replace("\n", "")
    latin = tmp_path / "latin1.yaml"
    latin.write_bytes(head.encode() + "  # caf\xe9\n".encode("latin-1"))
    res = run_cgloop("policy", "validate", str(latin))
    assert res.returncode == 1
    assert "Traceback" not in res.stderr + res.stdout
    assert res.stderr.strip().splitlines() == [
        f"error {latin}:6: not UTF-8 text (byte 0xe9 at offset {len(head) + 7})"
    ]
