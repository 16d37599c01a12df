"""Every panel's query, expanded as Grafana would, runs against a store filled through the real
pipeline (protobuf batches -> Kafka -> the sink in the embedded store) plus the shipped loop
episode, and returns rows; broken queries and macros are reported by dashboard and panel."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from cgloop.bus.codec import _records
from cgloop.bus.kafka import BatchProducer
from cgloop.config import Settings
from cgloop.contracts.samples import SAMPLE_FOR_TOPIC, SAMPLES
from cgloop.dashboards.alerts import PROMETHEUS_UID, RULES_FILE
from cgloop.dashboards.build import FLOW_KEY, OPTIONAL_PANELS, PROVISIONED, flow_match, render
from cgloop.dashboards.check import (
    Store,
    TimeRange,
    check_dashboards,
    check_rules,
    expand_macros,
    load,
    load_rules,
)
from cgloop.dashboards.pipeline import UID as PIPELINE_UID
from cgloop.testing import ROOT, cgloop_cmd, free_port, wait_for_store
from cgloop.v1.probe_pb2 import ProbeRecord

pytestmark = pytest.mark.kafka

# The loop-demo episode (flows, INT latency, detections, actions) spans 15:00-15:10 UTC on
# 2025-06-15; the canonical sample batches are stamped 15:06:40.
FROM_NS = 1_749_999_300 * 10**9  # 14:55
TO_NS = 1_750_000_500 * 10**9  # 15:15

# every record topic (the dead letters are not records)
DATA_TOPICS = {t: n for t, n in SAMPLE_FOR_TOPIC.items() if t != "cgloop.deadletter.v1"}
# tables only the Kafka records fill, and how many rows of our source each gets
FROM_KAFKA = {"probe_records": 6, "node_samples": 1, "int_queue_records": 1, "actions": 14}


def _answered_probes(lost: ProbeRecord) -> list[ProbeRecord]:
    out = []
    for i in range(1, 6):
        probe = ProbeRecord()
        probe.CopyFrom(lost)
        probe.lost = probe.overdue = False
        probe.sent_ns += i * 1_000_000_000
        probe.received_ns = probe.sent_ns + 300_000 + i * 20_000
        probe.rtt_ns = probe.received_ns - probe.sent_ns
        probe.probe_sequence += i
        out.append(probe)
    return out


@pytest.fixture(scope="module")
def store_url(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    folder = tmp_path_factory.mktemp("dash") / "store"
    # The import runs while the broker starts (both take seconds; the test budget is ~60 s).
    importing = subprocess.Popen(
        cgloop_cmd(
            "dataset", "import", str(ROOT / "datasets/bundles/loop-demo"), "--path", str(folder)
        ),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        stack_settings: Settings = request.getfixturevalue("stack_settings")
        output, _ = importing.communicate(timeout=120)
    finally:
        if importing.poll() is None:
            importing.kill()
            importing.wait()
    assert importing.returncode == 0, output
    port = free_port()
    log = folder.with_suffix(".log").open("w")
    proc = subprocess.Popen(
        cgloop_cmd(
            "store",
            "serve",
            "--path",
            str(folder),
            "--port",
            str(port),
            "--sink",
            "--bootstrap",
            stack_settings.bootstrap_servers,
            "--group",
            f"dash-{uuid.uuid4()}",
        ),
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for_store(url, proc, lambda: Path(log.name).read_text())
        source = f"dash-{uuid.uuid4()}"
        producer = BatchProducer(stack_settings.bootstrap_servers)
        for topic, name in DATA_TOPICS.items():
            batch = SAMPLES[name]()
            if name == "probe_record_batch":  # the sample probe is lost: add answered ones
                batch.records.extend(_answered_probes(batch.records[0]))
            for i, record in enumerate(_records(batch)):
                record.header.source_id = source
                record.header.sequence = i + 1
            producer.send(topic, batch)
        producer.flush()
        counts = " UNION ALL ".join(
            f"SELECT '{t}', count() FROM cgloop.{t} WHERE source_id = '{source}'"
            for t in FROM_KAFKA
        )
        want = {t: str(n) for t, n in FROM_KAFKA.items()}
        got: dict[str, str] = {}
        for _ in range(200):
            reply = httpx.post(url, content=counts, timeout=30)
            got = dict(line.split("\t") for line in reply.text.splitlines())
            if got == want:
                break
            time.sleep(0.3)
        assert got == want, Path(log.name).read_text()[-3000:]
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def test_every_panel_runs_and_returns_rows(store_url: str) -> None:
    problems = check_dashboards(store_url, FROM_NS, TO_NS)
    assert [str(p) for p in problems] == []
    # and the check did look at something: four SQL dashboards, every panel with a query
    # (pipeline health is PromQL, which the check skips: test_pipeline_metrics.py covers it)
    models = [m for m in load() if m["uid"] != PIPELINE_UID]
    assert len(models) == 4
    assert sum(len(m["panels"]) for m in models) >= 30


def test_an_empty_range_is_reported_panel_by_panel(store_url: str) -> None:
    # One hour before the data: nothing to show, and the check says so for each panel.
    problems = check_dashboards(store_url, FROM_NS - 3600 * 10**9, FROM_NS - 1800 * 10**9)
    render()
    # A stat counts (one row even over nothing); every other panel is empty and says so.
    want = {
        (m["uid"], p["title"].replace("${worst_n}", "20"))
        for m in load()
        for p in m["panels"]
        if p["type"] != "stat"
        and (m["uid"], p["title"]) not in OPTIONAL_PANELS
        and p["datasource"]["uid"] != PROMETHEUS_UID
    }
    assert {(p.uid, p.panel) for p in problems if p.kind == "empty"} == want
    assert {p.panel for p in problems if p.kind == "variable"} == {"variable flow", "variable node"}


def test_broken_queries_and_macros_are_named(store_url: str, tmp_path: Path) -> None:
    for path in PROVISIONED.glob("*.json"):
        shutil.copy(path, tmp_path / path.name)

    def edit(file: str, title: str, old: str, new: str) -> None:
        model = json.loads((tmp_path / file).read_text())
        (panel,) = [p for p in model["panels"] if p["title"] == title]
        assert old in panel["targets"][0]["rawSql"]
        panel["targets"][0]["rawSql"] = panel["targets"][0]["rawSql"].replace(old, new)
        (tmp_path / file).write_text(json.dumps(model))

    edit("nodes.json", "Power", "power_watts AS", "power_wats AS")
    edit(
        "flow-detail.json",
        "End-to-end latency percentiles (INT)",
        "$__timeFilter(window)",
        "$__timeFilterr(window)",
    )
    edit("noc-overview.json", "Loop actions", "$__timeFilter(decided_at)", "$__timeFilter()")
    edit("loop-audit.json", "Verification results", "ORDER BY", "AND r.after_value < 0 ORDER BY")
    problems = check_dashboards(store_url, FROM_NS, TO_NS, folder=tmp_path)
    got = {(p.dashboard, p.panel, p.kind) for p in problems}
    assert got == {
        ("cgloop / nodes", "Power", "error"),
        ("cgloop / flow detail", "End-to-end latency percentiles (INT)", "macro"),
        ("cgloop / NOC overview", "Loop actions", "macro"),
        ("cgloop / loop audit", "Verification results", "empty"),
    }
    by_panel = {p.panel: p for p in problems}
    assert "power_wats" in by_panel["Power"].message
    macro = by_panel["End-to-end latency percentiles (INT)"].message
    assert "unknown macro $__timeFilterr" in macro
    assert "expects 1 argument(s), got 0" in by_panel["Loop actions"].message


def test_every_alert_rule_runs_and_has_the_alerting_shape(store_url: str) -> None:
    assert [str(p) for p in check_rules(store_url, TO_NS)] == []
    # the rules that have something to say over the demo say it (node sample: 15:06:40)
    store = Store(store_url)
    try:
        for uid in ("cgloop-slo-breach", "cgloop-node-agent-silent", "cgloop-action-failed"):
            (rule,) = [r for g in load_rules()["groups"] for r in g["rules"] if r["uid"] == uid]
            query = rule["data"][0]
            rng = TimeRange(TO_NS - query["relativeTimeRange"]["from"] * 10**9, TO_NS)
            assert store.rows(expand_macros(query["model"]["rawSql"], rng, 1000)), uid
    finally:
        store.close()


def test_a_rule_of_the_wrong_shape_or_sql_is_named(store_url: str, tmp_path: Path) -> None:
    (tmp_path / RULES_FILE).parent.mkdir()
    doc = load_rules()
    rules = {r["uid"]: r for g in doc["groups"] for r in g["rules"]}
    dead = rules["cgloop-dead-letters"]["data"][0]["model"]
    dead["rawSql"] = dead["rawSql"].replace("count() AS dead_letters", "count() AS n, 1 AS m")
    silent = rules["cgloop-node-agent-silent"]["data"][0]["model"]
    silent["rawSql"] = silent["rawSql"].replace("max(time)", "max(tme)")
    (tmp_path / RULES_FILE).write_text(json.dumps(doc))
    got = {(p.uid, p.kind) for p in check_rules(store_url, TO_NS, tmp_path)}
    assert got == {("cgloop-dead-letters", "shape"), ("cgloop-node-agent-silent", "error")}


def test_the_flow_filter_reads_the_flow_tables_by_their_primary_key(store_url: str) -> None:
    store = Store(store_url)
    try:
        (key,) = store.rows(f"SELECT {FLOW_KEY} AS f FROM cgloop.flow_stats_1s LIMIT 1")[0]
        for table in ("flow_stats_1s", "flow_minutes_closed"):
            plan = "\n".join(
                r[0]
                for r in store.rows(
                    f"EXPLAIN indexes = 1 SELECT count() FROM cgloop.{table}"
                    f" WHERE {flow_match(repr(key))}"
                )
            )
            primary = plan.split("PrimaryKey", 1)[1].split("Ranges", 1)[0]
            assert "Condition: true" not in primary and "src_addr in" in primary, plan
        assert store.rows(
            f"SELECT count() FROM cgloop.flow_stats_1s WHERE {flow_match(repr(key))}"
        ) != [[0]]
    finally:
        store.close()
