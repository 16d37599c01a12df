"""The pipeline-health dashboard reads only metrics the daemons register, on the ops table's jobs.

Every metric name in the dashboards' and alert rules' PromQL must be registered somewhere in the
project's sources: a `"cgloop_..."` string in a Python package's src/ (prometheus_client's
Counter/Gauge/Histogram names), or a Rust `Registry::with_prefix("P")` joined with a
`.register("name", ...)` of the same file (prometheus-client's names). The clients add
`_total` to counters and `_bucket`/`_sum`/`_count` to histograms; `up` is Prometheus' own.
"""

from __future__ import annotations

import json
import os
import re
from functools import cache
from pathlib import Path

import pytest
from cgloop.contracts.ops import Daemon
from cgloop.dashboards import alerts, pipeline
from cgloop.dashboards.alerts import PROMETHEUS_UID
from cgloop.dashboards.build import render
from cgloop.testing import ROOT

SUFFIXES = ("_total", "_bucket", "_sum", "_count")
PROMETHEUS_OWN = {"up"}
KEYWORDS = {
    "by", "without", "on", "ignoring", "group_left", "group_right", "bool",
    "and", "or", "unless", "offset", "inf", "nan",
}  # fmt: skip
SKIP_DIRS = {".venv", "target", "node_modules", ".git", "tests", "fuzz"}


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects (functions, label names and values, range
    durations, grouping clauses and Grafana's $variables left out)."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'', '""', expr)
    text = re.sub(r"\{[^}]*\}", " ", text)  # label matchers
    text = re.sub(r"\[[^\]]*\]", " ", text)  # range and subquery windows
    text = re.sub(
        r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", text
    )  # grouping labels
    names = set()
    for m in re.finditer(r"(?<![\w$:.])([A-Za-z_:][\w:]*)(?!\w)(\s*\()?", text):
        name, call = m.group(1), m.group(2)
        if call or name.lower() in KEYWORDS:
            continue
        names.add(name)
    return names


def _sources(suffix: str):
    """Files ending in `suffix` under a src/ folder (not tests, builds, the dashboards' own)."""
    for folder, dirs, files in os.walk(ROOT):
        dirs[:] = [d for d in dirs if d not in SKIP_DIRS and not d.startswith(".")]
        parts = Path(folder).relative_to(ROOT).parts
        if "src" not in parts or "dashboards" in parts:
            continue
        yield from (Path(folder) / f for f in files if f.endswith(suffix))


@cache
def registered() -> frozenset[str]:
    names: set[str] = set()
    for path in _sources(".py"):
        names.update(re.findall(r"""["'](cgloop_[a-z0-9_]+)["']""", path.read_text()))
    for path in _sources(".rs"):
        text = path.read_text()
        for prefix in re.findall(r'Registry::with_prefix\(\s*"([a-z0-9_]+)"', text):
            names.update(
                f"{prefix}_{n}" for n in re.findall(r'\.register\(\s*"([a-z0-9_]+)"', text)
            )
    return frozenset(names)


def unknown(names: set[str]) -> set[str]:
    known = registered() | PROMETHEUS_OWN

    def ok(name: str) -> bool:
        return name in known or any(
            name.endswith(s) and name.removesuffix(s) in known for s in SUFFIXES
        )

    return {n for n in names if not ok(n)}


def dashboard_exprs() -> list[str]:
    exprs = []
    for text in render().values():
        for panel in json.loads(text)["panels"]:
            for target in panel.get("targets", []):
                if target.get("datasource", {}).get("uid") == PROMETHEUS_UID:
                    exprs.append(target["expr"])
    return exprs


def test_the_extractor_finds_metric_names_only() -> None:
    expr = (
        'histogram_quantile(0.99, sum by (le, job) (rate(a_seconds_bucket{job=~"x|y"}'
        "[$__rate_interval]))) + on (job) group_left max(b_total offset 5m) / up"
    )
    assert metric_names(expr) == {"a_seconds_bucket", "b_total", "up"}


def test_sources_are_read() -> None:
    # Python and Rust registrations are both found (a broken scan would pass every name).
    assert "cgloop_records_in" in registered()
    assert "cgloop_node_agent_micro_loop_acting" in registered()
    assert "cgloop_int_collector_reports_refused" in registered()


def test_every_promql_metric_is_registered_by_a_daemon() -> None:
    exprs = dashboard_exprs()
    assert len(exprs) >= 14  # the pipeline-health dashboard's queries are found
    rule_exprs = [r.query for r in alerts.rules() if r.datasource == PROMETHEUS_UID]
    used = set().union(*(metric_names(e) for e in exprs + rule_exprs))
    assert "cgloop_analytics_detection_latency_seconds_bucket" in used
    assert unknown(used) == set()


@pytest.mark.parametrize(
    "made_up", ["cgloop_records_inn_total", "cgloop_policy_latency_seconds_bucket", "cgloop_sink"]
)
def test_a_made_up_name_is_caught(made_up: str) -> None:
    assert unknown(metric_names(f"sum(rate({made_up}[5m]))")) == {made_up}


def test_jobs_are_the_ops_table_daemons_and_the_up_panel_names_each() -> None:
    assert set(pipeline.JOBS) == {v.number for v in Daemon.DESCRIPTOR.values if v.number != 0}
    assert pipeline.JOBS[Daemon.Value("DAEMON_POLICY_ENGINE")] == "policy_engine"
    model = json.loads(render()["pipeline-health.json"])
    up = next(p for p in model["panels"] if p["title"] == "Scrape targets up")
    selector = re.search(r'job=~"([^"]+)"', up["targets"][0]["expr"])
    assert selector and set(selector.group(1).split("|")) == set(pipeline.JOBS.values())


def test_the_docs_list_the_job_names() -> None:
    doc = (ROOT / "docs/dashboards.md").read_text()
    section = doc.split("## Pipeline health", 1)[1].split("\n## ", 1)[0]
    for daemon, name in pipeline.JOBS.items():
        assert f"| `{name}` | `{Daemon.Name(daemon)}` |" in section, name
