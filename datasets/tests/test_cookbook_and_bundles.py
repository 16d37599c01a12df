"""The shipped bundles import cleanly, every cookbook query returns its documented rows,
export -> import reproduces query results, and bad bundles are refused with a precise reason."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import clickhouse_connect
import httpx
import pytest
from cgloop.datasets.bundles import BundleError, import_bundle
from cgloop.testing import ROOT, StoreServer, free_port

from .conftest import BUNDLES, cli

COOKBOOK = ROOT / "docs" / "queries.md"
_BLOCK = re.compile(
    r"## (?P<title>.+?)\n.*?```sql\n(?P<sql>.+?)\n```\s*```tsv\n(?P<tsv>.*?)```", re.S
)


def cookbook() -> list[tuple[str, str, str]]:
    return [(m["title"], m["sql"], m["tsv"]) for m in _BLOCK.finditer(COOKBOOK.read_text())]


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


_MINUTE_COLUMNS = (
    "minute, src_addr, dst_addr, src_port, dst_port, ip_protocol, packets, bytes, lost_packets,"
    " dropped_packets, p50_latency_ns, p99_latency_ns, p999_latency_ns, p50_jitter_ns,"
    " p99_jitter_ns, p50_size_bytes, p99_inter_arrival_ns"
)


def test_closed_minutes_hold_exactly_what_flow_minutes_computes(bundle_store) -> None:
    """The import closed every minute: the finalised table has each flow-minute once (FINAL)
    with the numbers the t-digest view computes, in both directions."""
    counts = _tsv(
        bundle_store,
        "SELECT (SELECT count() FROM cgloop.flow_minutes),"
        " (SELECT count() FROM cgloop.flow_minutes_closed FINAL)",
    ).split("\n")[1]
    total, closed = map(int, counts.split("\t"))
    assert total > 100 and closed == total
    for a, b in (("flow_minutes", "flow_minutes_closed FINAL"),
                 ("flow_minutes_closed FINAL", "flow_minutes")):  # fmt: skip
        sql = (f"SELECT count() FROM (SELECT {_MINUTE_COLUMNS} FROM cgloop.{a}"
               f" EXCEPT SELECT {_MINUTE_COLUMNS} FROM cgloop.{b})")  # fmt: skip
        assert _tsv(bundle_store, sql).split("\n")[1] == "0", (a, b)


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
    cli(
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
    # The same bundle twice in one import: the second is recognised and counted once.
    cli("dataset", "import", str(out), str(out), "--path", str(folder))
    copy = StoreServer(folder, free_port())
    try:
        for title, sql, _ in cookbook()[:5]:
            assert _tsv(copy, sql) == _tsv(bundle_store, sql), title
    finally:
        copy.stop()


REFUSALS = [
    (lambda m, d: m.pop("scenario"), "scenario: Field required"),
    (lambda m, d: m["scenario"].update(timestamp_resolution_ns=0), "timestamp_resolution_ns"),
    (lambda m, d: m.update(format_version=9), "format_version 9 is not readable"),
    (lambda m, d: m.update(schema_version=999), "migrate the store first"),
    (lambda m, d: m.update(surprise=1), "surprise: Extra inputs are not permitted"),
    (lambda m, d: (d / "actions.parquet").write_bytes(b"x"), "does not match the manifest"),
    (lambda m, d: m["tables"]["actions"]["columns"].pop(), "columns differ"),
    # Confinement: a good file outside the bundle folder is refused however it is reached.
    (
        lambda m, d: m["tables"]["actions"].update(file=_outside(d, "../outside.parquet")),
        "tables.actions.file: Value error, '../outside.parquet' is not a path inside the "
        "bundle folder (it climbs out with ..)",
    ),
    (
        lambda m, d: m["tables"]["actions"].update(file=_outside(d, str(d.parent / "o.parquet"))),
        "is not a path inside the bundle folder (absolute)",
    ),
    (
        lambda m, d: m["tables"]["actions"].update(file=_outside(d, "link.parquet", link=True)),
        "tables.actions.file 'link.parquet' resolves to",
    ),
]


def _outside(bundle: Path, name: str, link: bool = False) -> str:
    """A verbatim copy of the bundle's actions file outside the bundle, reached by `name`."""
    outside = bundle.parent / "outside.parquet"
    shutil.copy(bundle / "actions.parquet", outside)
    if link:
        (bundle / name).symlink_to(outside)
    elif Path(name).is_absolute():
        shutil.copy(outside, name)
    return name


def _damaged(tmp_path: Path, damage) -> Path:
    bundle = tmp_path / "b"
    shutil.copytree(BUNDLES / "loop-demo", bundle)
    manifest = json.loads((bundle / "manifest.json").read_text())
    damage(manifest, bundle)
    (bundle / "manifest.json").write_text(json.dumps(manifest))
    return bundle


@pytest.mark.parametrize(("damage", "message"), REFUSALS)
def test_bad_bundles_are_refused_with_the_reason(
    bundle_store: StoreServer, tmp_path: Path, damage, message: str
) -> None:
    # Checked against the (read-only) bundle store: a check that let the bundle through would
    # end in the server refusing the insert, not in a BundleError.
    client = clickhouse_connect.get_client(dsn=bundle_store.url)
    with pytest.raises(BundleError) as refused:
        import_bundle(client, _damaged(tmp_path, damage))
    assert message in " ".join(str(refused.value).split())


def test_the_cli_refuses_a_bad_bundle_with_exit_2_and_the_reason(tmp_path: Path) -> None:
    damage, message = REFUSALS[2]
    bundle = _damaged(tmp_path, damage)
    result = cli("dataset", "import", str(bundle), "--path", str(tmp_path / "s"), ok=False)
    assert result.returncode == 2
    assert message in " ".join(result.stderr.split()), result.stderr
