"""The shipped bundles import cleanly, every cookbook query returns its documented rows,
export -> import reproduces query results, and bad bundles are refused with a precise reason."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import httpx
import pytest
from cgloop.testing import ROOT, StoreServer, free_port

BUNDLES = ROOT / "datasets" / "bundles"
COOKBOOK = ROOT / "docs" / "queries.md"
_BLOCK = re.compile(
    r"## (?P<title>.+?)\n.*?```sql\n(?P<sql>.+?)\n```\s*```tsv\n(?P<tsv>.*?)```", re.S
)


def cookbook() -> list[tuple[str, str, str]]:
    return [(m["title"], m["sql"], m["tsv"]) for m in _BLOCK.finditer(COOKBOOK.read_text())]


@pytest.fixture(scope="module")
def bundle_store(tmp_path_factory: pytest.TempPathFactory):
    folder = tmp_path_factory.mktemp("cookbook") / "store"
    for name in ("loop-demo", "xbox-cloud-gaming", "l4s-and-ndpi"):
        _cli("dataset", "import", str(BUNDLES / name), "--path", str(folder))
    server = StoreServer(folder, free_port())
    yield server
    server.stop()


def _cli(*args: str, ok: bool = True):
    import subprocess

    from cgloop.testing import cgloop_cmd

    result = subprocess.run(cgloop_cmd(*args), capture_output=True, text=True, timeout=180)
    if ok:
        assert result.returncode == 0, result.stderr
    return result


def _tsv(server: StoreServer, sql: str) -> str:
    reply = httpx.post(server.url, params={"default_format": "TSVWithNames"}, content=sql)
    assert reply.status_code == 200, reply.text
    return reply.text


def test_the_cookbook_has_the_questions_of_the_issue() -> None:
    titles = [t for t, _, _ in cookbook()]
    assert len(titles) >= 5
    for needle in ("jitter", "latency", "Loss per platform", "verified effect", "detection to"):
        assert any(needle in t for t in titles), needle


@pytest.mark.parametrize("title", [t for t, _, _ in cookbook()])
def test_cookbook_query_returns_the_documented_rows(bundle_store, title: str) -> None:
    sql, want = next((s, w) for t, s, w in cookbook() if t == title)
    assert _tsv(bundle_store, sql) == want


def test_export_then_import_gives_identical_query_results(bundle_store, tmp_path: Path) -> None:
    scenario = tmp_path / "scenario.json"
    scenario.write_text(
        json.dumps(
            {
                "synthetic": True,
                "source": "test",
                "licence": "Apache-2.0",
                "timestamp_source": "generator",
                "timestamp_resolution_ns": 1,
                "clock_sync": "none",
            }
        )
    )
    out = tmp_path / "again"
    tables = ["flow_records", "int_flow_records", "detections", "actions", "action_results"]
    args = [a for t in tables for a in ("-t", t)]
    _cli(
        "dataset",
        "export",
        str(out),
        "--scenario",
        str(scenario),
        "--url",
        bundle_store.url,
        "--from",
        "2025-06-15T15:00:00",
        "--to",
        "2025-06-15T15:10:00",
        *args,
    )
    folder = tmp_path / "store"
    _cli("dataset", "import", str(out), "--path", str(folder))
    _cli("dataset", "import", str(out), "--path", str(folder))  # twice: still counted once
    copy = StoreServer(folder, free_port())
    try:
        for title, sql, _ in cookbook()[:5]:
            assert _tsv(copy, sql) == _tsv(bundle_store, sql), title
    finally:
        copy.stop()


@pytest.fixture(scope="module")
def migrated(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One migrated store for the refusal cases (a refused import writes nothing)."""
    folder = tmp_path_factory.mktemp("refusals") / "store"
    _cli("store", "migrate", "--path", str(folder))
    return folder


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda m, d: m.pop("scenario"), "scenario: Field required"),
        (lambda m, d: m["scenario"].update(timestamp_resolution_ns=0), "timestamp_resolution_ns"),
        (lambda m, d: m.update(format_version=9), "format_version 9 is not readable"),
        (lambda m, d: m.update(schema_version=999), "migrate the store first"),
        (lambda m, d: m.update(surprise=1), "surprise: Extra inputs are not permitted"),
        (lambda m, d: (d / "actions.parquet").write_bytes(b"x"), "does not match the manifest"),
        (lambda m, d: m["tables"]["actions"]["columns"].pop(), "columns differ"),
    ],
)
def test_bad_bundles_are_refused_with_the_reason(
    migrated: Path, tmp_path: Path, damage, message: str
) -> None:
    bundle = tmp_path / "b"
    shutil.copytree(BUNDLES / "loop-demo", bundle)
    manifest = json.loads((bundle / "manifest.json").read_text())
    damage(manifest, bundle)
    (bundle / "manifest.json").write_text(json.dumps(manifest))
    result = _cli("dataset", "import", str(bundle), "--path", str(migrated), ok=False)
    assert result.returncode == 2
    assert message in " ".join(result.stderr.split()), result.stderr
