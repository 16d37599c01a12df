"""The daemons' metrics endpoints are declared once (proto/cgloop/v1/ops.proto) and both
languages read that declaration: `cgloop-vectors ops-table` (cgloop_proto::ops) prints what
Python's `cgloop.contracts.ops.table()` returns; every port is distinct, on loopback, in the
documented block; and the docs' table is the proto's."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from cgloop.contracts.ops import PORT_BLOCK, Daemon, default_metrics_addr, endpoint, table

REPO = Path(__file__).resolve().parents[1]
ARCHITECTURE = REPO / "docs" / "architecture.md"
ROW = re.compile(r"^\|\s*`([^`]+)`\s*\|\s*(\d+)\s*\|\s*`([^`]+)`\s*\|", re.M)


def test_every_daemon_has_a_distinct_port_in_the_block() -> None:
    daemons = table()["daemons"]
    assert len(daemons) == len(Daemon.DESCRIPTOR.values) - 1, "a daemon without an endpoint"
    ports = [d["port"] for d in daemons.values()]
    assert len(set(ports)) == len(ports), f"a port declared twice: {ports}"
    assert all(p in PORT_BLOCK for p in ports), ports
    assert all(d["command"] and d["description"] for d in daemons.values())
    assert default_metrics_addr(Daemon.DAEMON_ANALYTICS) == (
        f"127.0.0.1:{endpoint(Daemon.DAEMON_ANALYTICS).port}"
    )
    with pytest.raises(KeyError, match="DAEMON_UNSPECIFIED"):
        endpoint(Daemon.DAEMON_UNSPECIFIED)


def test_the_architecture_doc_lists_the_table() -> None:
    rows = {
        name: (int(port), command)
        for name, port, command in ROW.findall(ARCHITECTURE.read_text())
        if name.startswith("DAEMON_")
    }
    declared = {name: (d["port"], d["command"]) for name, d in table()["daemons"].items()}
    assert rows == declared, (
        "docs/architecture.md's 'Self-monitoring' table differs from proto/cgloop/v1/ops.proto"
    )


def test_rust_reads_the_same_table() -> None:
    cargo = shutil.which("cargo") or shutil.which(str(Path.home() / ".cargo" / "bin" / "cargo"))
    if cargo is None:
        pytest.skip("cargo is not installed: the Rust side cannot be checked")
    run = subprocess.run(
        [cargo, "run", "-q", "-p", "cgloop-proto", "--bin", "cgloop-vectors", "--", "ops-table"],
        cwd=REPO, capture_output=True, text=True, timeout=1200, check=False,
    )  # fmt: skip
    assert run.returncode == 0, f"cgloop-vectors ops-table failed:\n{run.stderr}"
    assert json.loads(run.stdout) == table()
