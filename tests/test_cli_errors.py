"""No `cgloop` command answers bad input with a traceback: one line naming the input, exit != 0.

Each case is a reproduction from the security audit (issue 17, finding 6) or an input the
commands did not guard; they run the real command in a subprocess, as a user would.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import shutil
import struct
import zipfile
from pathlib import Path

import pytest
from cgloop.analytics.model import FORMAT_VERSION, MODEL_FORMAT
from cgloop.testing import ROOT
from typer.testing import CliRunner

BUNDLE = ROOT / "datasets" / "bundles" / "loop-demo"
POLICY = "id: x\nmatch:\n  kinds: [slo_latency]\naction:\n  operation: notify\n"


def _non_utf8_policy(tmp: Path) -> tuple[list[str], str]:
    path = tmp / "latin1.yaml"
    path.write_bytes(POLICY.encode() + "# caf\xe9\n".encode("latin-1"))
    return ["policy", "validate", str(path)], f"{path}:6: not UTF-8 text"


def _missing_policy(tmp: Path) -> tuple[list[str], str]:
    path = tmp / "nope.yaml"
    return ["policy", "validate", str(path)], f"{path}: no such file"


def _non_utf8_plan(tmp: Path) -> tuple[list[str], str]:
    path = tmp / "spec.yaml"
    path.write_bytes(b"functions: [\xff]\n")
    return ["policy", "plan", "natif", str(path)], f"{path}: cannot read"


def _damaged_pcap(tmp: Path) -> tuple[list[str], str]:
    path = tmp / "cut.pcap"
    path.write_bytes(struct.pack("<IHHiIII", 0xA1B2C3D4, 2, 4, 0, 0, 65535, 101) + b"\0" * 9)
    return ["analytics", "pcap", str(path)], (
        f"{path}: packet 1 at byte offset 24: truncated record header (9 of 16 bytes)"
    )


def _gzip_cut_pcap(tmp: Path) -> tuple[list[str], str]:
    path = tmp / "cut.pcap.gz"
    head = struct.pack("<IHHiIII", 0xA1B2C3D4, 2, 4, 0, 0, 65535, 101)
    path.write_bytes(gzip.compress(head + b"\0" * 400)[:-12])
    return ["analytics", "pcap", str(path)], f"{path}: damaged or unreadable capture"


def _escaping_bundle(tmp: Path) -> tuple[list[str], str]:
    bundle = tmp / "b"
    shutil.copytree(BUNDLE, bundle)
    manifest = json.loads((bundle / "manifest.json").read_text())
    table = next(iter(manifest["tables"]))
    manifest["tables"][table]["file"] = "../../../../etc/passwd"
    (bundle / "manifest.json").write_text(json.dumps(manifest))
    return ["dataset", "describe", str(bundle)], f"tables.{table}.file"


def _unsigned_model(tmp: Path) -> tuple[list[str], str]:
    # A sound model file whose card has no signature: refused before anything reads the trees.
    path = tmp / "m.skops"
    card = {
        "format": MODEL_FORMAT, "format_version": FORMAT_VERSION, "version": "v", "created": "c",
        "features": [], "classes": [], "platforms": [], "training_data_sha256": "",
        "training_examples": 0, "training_captures": [], "synthetic_captures": [],
        "metrics": {}, "content_sha256": hashlib.sha256().hexdigest(),  # no other member
        "hmac_sha256": "",
    }
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("cgloop-card.json", json.dumps(card))
    return ["analytics", "detect-pcap", str(tmp / "any.pcap"), "--model", str(path)], (
        f"{path}: unsigned model: refused"
    )


def _bad_sfc_nodes(tmp: Path) -> tuple[list[str], str]:
    return ["policy", "plan", "sfc", "--nodes", "a:x", "--chain", "2", "--service", "a"], (
        "'a:x' is not NAME:SLOTS[:LOAD]"
    )


CASES = [
    _non_utf8_policy, _missing_policy, _non_utf8_plan, _damaged_pcap, _gzip_cut_pcap,
    _escaping_bundle, _unsigned_model, _bad_sfc_nodes,
]


@pytest.fixture(scope="module")
def cgloop():
    """The real `cgloop` command in this process (one import of every component, not one per
    case); stdout and stderr kept apart."""
    from cgloop.cli.main import app, load_components

    load_components(app)
    return lambda *args: CliRunner().invoke(app, list(args), prog_name="cgloop")


@pytest.mark.parametrize("case", CASES, ids=[c.__name__.strip("_") for c in CASES])
def test_bad_input_gives_one_line_and_a_non_zero_exit(
    cgloop, tmp_path: Path, monkeypatch, case
) -> None:
    monkeypatch.delenv("CGLOOP_DEBUG", raising=False)
    monkeypatch.delenv("CGLOOP_MODEL_ALLOW_UNSIGNED", raising=False)
    args, message = case(tmp_path)
    res = cgloop(*args)
    assert res.exit_code not in (0, None), res.output
    assert res.exception is None or isinstance(res.exception, SystemExit), res.exception
    assert "Traceback" not in res.output + res.stderr
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert message in " ".join(" ".join(lines).split()), res.stderr
    if case is not _bad_sfc_nodes:  # typer's own usage box for a bad option
        assert len(lines) == 1, res.stderr


def test_the_cgloop_command_itself_answers_in_one_line(run_cgloop, tmp_path: Path) -> None:
    # Once through the installed entry point, as a shell would run it.
    args, message = _non_utf8_policy(tmp_path)
    res = run_cgloop(*args)
    assert res.returncode == 1 and "Traceback" not in res.stderr
    offset = len(POLICY) + len("# caf")
    assert [ln for ln in res.stderr.splitlines() if ln.strip()] == [
        f"error {message} (byte 0xe9 at offset {offset})"
    ]
