"""The chain-function catalogue is read alike on both sides of the node agent's contract.

It is declared once, by the options of the function messages in proto/cgloop/v1/node_agent.proto.
The agent reads them through a table its build generates (cgloop_proto::catalogue, printed by
`cgloop-vectors chain-catalogue`); the policy engine through the Python descriptors
(cgloop.policy.planners.catalogue). The two readings must be the same table: a parameter one side
thought optional, or a bound one side missed, would let the planner order what the agent refuses.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
from cgloop.policy.planners import catalogue

REPO = Path(__file__).resolve().parents[1]


def test_rust_and_python_read_the_same_catalogue() -> None:
    cargo = shutil.which("cargo") or shutil.which(str(Path.home() / ".cargo" / "bin" / "cargo"))
    if cargo is None:
        pytest.skip("cargo is not installed: the Rust side cannot be checked")
    run = subprocess.run(
        [cargo, "run", "-q", "-p", "cgloop-proto", "--bin", "cgloop-vectors", "--",
         "chain-catalogue"],
        cwd=REPO, capture_output=True, text=True, timeout=1200, check=False,
    )  # fmt: skip
    assert run.returncode == 0, f"cgloop-vectors chain-catalogue failed:\n{run.stderr}"
    rust = json.loads(run.stdout)
    python = catalogue.table()
    assert [f["name"] for f in rust] == [f["name"] for f in python]
    for r, p in zip(rust, python, strict=True):
        assert r == p, f"{p['name']}: Rust and Python read the declaration differently"
    # Not an empty agreement: every function has a kind, and the bounds are there.
    assert all(f["kind"] != "FUNCTION_KIND_UNSPECIFIED" for f in python)
    assert any(p["max"] is not None for f in python for p in f["params"])
