"""The bus is declared once (proto/cgloop/v1/bus.proto) and both languages use that declaration.

* Rust reads the table as Python does: `cgloop-vectors bus-table` (cgloop_proto::bus) prints
  what Python's `cgloop.contracts.bus.table()` returns.
* No topic name or header name is written anywhere else: outside tests, a quoted topic or header
  name in Python or Rust source is a second declaration waiting to drift.
* Every Kafka producer is built in one of the places that take their settings from the table
  (BatchProducer in Python; the probe, INT collector and node agent, whose own tests compare
  their ClientConfig with the table).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from cgloop.bus.codec import SCHEMA_HEADER, TYPE_HEADER
from cgloop.bus.topics import TOPICS
from cgloop.contracts.bus import table

REPO = Path(__file__).resolve().parents[1]
TABLE = "proto/cgloop/v1/bus.proto"
LITERAL = re.compile(
    r"""["'](?:cgloop\.[a-z_]+\.v\d+|"""
    + "|".join(re.escape(h) for h in (TYPE_HEADER, SCHEMA_HEADER))
    + r""")["']"""
)
# Where a Kafka producer may be built: each takes its settings from the table.
PRODUCER = re.compile(r"\bProducer\(|ClientConfig::new\(\)")
PRODUCER_HOMES = {
    "core/src/cgloop/bus/kafka.py",
    "telemetry/probe/src/kafka.rs",
    "telemetry/int-collector/src/export.rs",
    "actuators/node-agent/src/export.rs",
}


def _is_test(path: str) -> bool:
    parts = path.split("/")
    return (
        "tests" in parts
        or "test" in parts
        or parts[-1].startswith("test_")
        or parts[-1] == "conftest.py"
        or parts[-1].endswith("_tests.rs")
    )


def _sources() -> list[tuple[str, str]]:
    """(path, text) of every tracked or new Python/Rust file outside tests; a Rust file's
    `#[cfg(test)]` module (at its end, by this repository's habit) is cut off."""
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "*.py", "*.rs"],
        cwd=REPO, capture_output=True, text=True, check=True,
    ).stdout.split()  # fmt: skip
    out = []
    for path in listed:
        file = REPO / path
        if _is_test(path) or not file.is_file():
            continue
        text = file.read_text(errors="replace")
        if path.endswith(".rs"):
            text = text.split("#[cfg(test)]", 1)[0]
        out.append((path, text))
    return out


def _hits(pattern: re.Pattern[str], allowed: set[str]) -> list[str]:
    return [
        f"{path}:{text.count(chr(10), 0, m.start()) + 1}: {m.group(0)}"
        for path, text in _sources()
        if path not in allowed
        for m in pattern.finditer(text)
    ]


def test_the_literal_check_can_fail() -> None:
    assert LITERAL.search('TOPIC = "cgloop.flows.v1"')
    assert LITERAL.search(f"key: '{TYPE_HEADER}'")
    assert not LITERAL.search("Detections go to `cgloop.detections.v1`")
    assert PRODUCER.search("client = ClientConfig::new();")


def test_no_topic_or_header_name_outside_the_table() -> None:
    assert len(_sources()) > 50, "the source listing found almost nothing"
    hits = _hits(LITERAL, set())
    assert not hits, (
        f"topic or header names written outside {TABLE} (use cgloop.bus.topics / "
        "cgloop.bus.codec in Python, cgloop_proto::bus in Rust):\n" + "\n".join(hits)
    )


def test_producers_are_built_only_where_the_table_applies() -> None:
    hits = _hits(PRODUCER, PRODUCER_HOMES)
    assert not hits, (
        "a Kafka producer built outside the modules that apply the bus table's settings:\n"
        + "\n".join(hits)
    )


def test_python_topics_are_the_table() -> None:
    declared = {spec["name"]: spec for spec in table()["topics"].values()}
    assert set(TOPICS) == set(declared)
    for name, t in TOPICS.items():
        assert t.full_type_name == declared[name]["batch_type"]
        assert t.retention_ms == declared[name]["retention_hours"] * 3_600_000
        assert t.partitions == declared[name]["partitions"]


def test_rust_reads_the_same_table() -> None:
    cargo = shutil.which("cargo") or shutil.which(str(Path.home() / ".cargo" / "bin" / "cargo"))
    if cargo is None:
        pytest.skip("cargo is not installed: the Rust side cannot be checked")
    run = subprocess.run(
        [cargo, "run", "-q", "-p", "cgloop-proto", "--bin", "cgloop-vectors", "--", "bus-table"],
        cwd=REPO, capture_output=True, text=True, timeout=1200, check=False,
    )  # fmt: skip
    assert run.returncode == 0, f"cgloop-vectors bus-table failed:\n{run.stderr}"
    rust = json.loads(run.stdout)
    python = table()
    assert rust == python
    producers = python["producers"]
    assert producers["BUS_PRODUCER_NODE_AGENT"]["reason"], "a named difference needs its reason"
    for name, producer in producers.items():
        assert producer["librdkafka"]["enable.idempotence"] == "true", name
        assert producer["librdkafka"]["acks"] == "all", name
