"""What a NOC needs beyond panels: alert rules in Grafana's provisioning format, thresholds from
the SLO table, links from the overview to a flow, the loop's actions as annotations, and a flow
filter by the flow tables' sort key (the store runs of the rules and the filter are in
test_check_store.py)."""

from __future__ import annotations

import json

import chdb
import yaml
from cgloop.dashboards import alerts, slo
from cgloop.dashboards.build import FLOW_KEY, PROVISIONED, flow_match, render
from cgloop.dashboards.check import alert_shape, load_rules
from cgloop.datasets.sink.metrics import SinkMetrics
from cgloop.slo import table

RULE_FIELDS = {"uid", "title", "condition", "data", "for", "labels", "annotations",
               "noDataState", "execErrState"}  # fmt: skip


def _model(name: str) -> dict:
    return json.loads(render()[name])


def _panel(model: dict, title: str) -> dict:
    (panel,) = [p for p in model["panels"] if p["title"] == title]
    return panel


def test_the_rules_file_is_grafana_provisioning_yaml() -> None:
    text = (PROVISIONED / alerts.RULES_FILE).read_text()
    doc = yaml.safe_load(text)  # what Grafana reads it as
    assert doc == load_rules() == alerts.provisioning()
    assert doc["apiVersion"] == 1
    rules = [r for g in doc["groups"] for r in g["rules"]]
    assert {r["uid"] for r in rules} == {
        "cgloop-slo-breach", "cgloop-action-failed", "cgloop-dead-letters",
        "cgloop-pipeline-lag", "cgloop-store-lag", "cgloop-node-agent-silent",
    }  # fmt: skip
    for rule in rules:
        assert set(rule) >= RULE_FIELDS, rule["uid"]
        for query in rule["data"]:
            assert {"refId", "datasourceUid", "relativeTimeRange", "model"} <= set(query)


def test_the_breach_rule_judges_each_platform_by_the_slo_table() -> None:
    (rule,) = [r for r in alerts.rules() if r.uid == "cgloop-slo-breach"]
    assert slo.platform_latency_ms_sql("flow_platform") in rule.query
    assert "${" not in rule.query  # a rule has no dashboard variables
    expr = slo.platform_latency_ms_sql("p")
    names = [*table().platforms, "a-platform-without-a-profile"]
    rows = json.loads(
        str(chdb.query(f"SELECT p, {expr} FROM (SELECT arrayJoin({names!r}) AS p)", "JSONCompact"))
    )["data"]
    assert {p: float(ms) for p, ms in rows} == {p: table().platform(p).latency_ms for p in names}


def test_the_lag_rule_reads_the_sinks_metric_through_the_one_prometheus_uid() -> None:
    (rule,) = [r for r in alerts.rules() if r.uid == "cgloop-pipeline-lag"]
    assert rule.datasource == alerts.PROMETHEUS_UID
    names = {m.name for m in SinkMetrics().registry.collect()}
    assert "cgloop_sink_lag_messages" in names and "cgloop_sink_lag_messages" in rule.query
    provisioned = (PROVISIONED / alerts.RULES_FILE).read_text()
    assert provisioned.count(alerts.PROMETHEUS_UID) == 2  # the query and its model's datasource


def test_the_alerting_shape_is_one_number_and_string_labels() -> None:
    assert alert_shape([("platform", "String"), ("share", "Float64")]) is None
    assert alert_shape([("node", "LowCardinality(String)"), ("s", "Nullable(Int64)")]) is None
    assert "2 numeric" in (alert_shape([("a", "UInt64"), ("b", "Float64")]) or "")
    assert "0 numeric" in (alert_shape([("topic", "String")]) or "")
    assert "neither" in (alert_shape([("n", "UInt64"), ("t", "DateTime")]) or "")


def test_latency_panels_carry_the_slo_tables_thresholds() -> None:
    panel = _panel(_model("noc-overview.json"), "Gaming flows: p99 latency per minute")
    config = panel["fieldConfig"]
    assert (
        config["defaults"]["thresholds"]["steps"][1]["value"]
        == table().platform("generic").latency_ms
    )
    by_platform = {
        o["matcher"]["options"]: o["properties"][0]["value"]["steps"][1]["value"]
        for o in config["overrides"]
    }
    want = {f"^(p99_ms )?{n} ": o.latency_ms for n, o in table().platforms.items()}
    assert by_platform == {k: v for k, v in want.items() if "generic" not in k}
    flow = _model("flow-detail.json")
    latency = _panel(flow, "End-to-end latency percentiles (INT)")
    assert "AS slo_ms" in latency["targets"][0]["rawSql"]
    assert "${slo}" in latency["targets"][0]["rawSql"]
    assert latency["fieldConfig"]["overrides"][0]["matcher"]["options"] == "slo_ms"


def test_the_overview_links_a_flow_to_its_detail() -> None:
    panel = _panel(_model("noc-overview.json"), "Gaming flows and SLO status")
    (link,) = panel["fieldConfig"]["defaults"]["links"]
    flow = _model("flow-detail.json")
    assert link["url"].startswith(f"/d/{flow['uid']}?var-flow=${{__data.fields.flow")
    assert "var-slo=${slo}" in link["url"] and "${__url_time_range}" in link["url"]
    assert f"{FLOW_KEY} AS flow" in panel["targets"][0]["rawSql"]
    assert {"flow", "slo"} <= {v["name"] for v in flow["templating"]["list"]}


def test_the_loops_actions_are_annotations_on_the_latency_graphs() -> None:
    for name in ("noc-overview.json", "flow-detail.json"):
        model = _model(name)
        (ann,) = model["annotations"]["list"]
        sql = ann["target"]["rawSql"]
        assert "cgloop.action_results" in sql and "AS text" in sql and "AS time" in sql
        for state in ("APPLIED", "VERIFIED", "ROLLED_BACK"):
            assert f"'ACTION_STATE_{state}'" in sql
        titles = {p["id"]: p["title"] for p in model["panels"]}
        on = [titles[i] for i in ann["filter"]["ids"]]
        assert on and all("latency" in t.lower() for t in on), on


def test_the_flow_filter_parses_the_flow_variable_into_the_sort_key() -> None:
    rows = (
        "SELECT toIPv6(arrayJoin(['::ffff:203.0.113.5', '2001:db8::1'])) AS src_addr,"
        " toIPv6('::ffff:192.0.2.12') AS dst_addr, toUInt16(443) AS src_port,"
        " toUInt16(50123) AS dst_port, toUInt8(17) AS ip_protocol"
    )
    for src in ("::ffff:203.0.113.5", "2001:db8::1"):
        key = f"{src}:443 > ::ffff:192.0.2.12:50123 / 17"
        sql = f"SELECT IPv6NumToString(src_addr), {FLOW_KEY} FROM ({rows}) WHERE " + flow_match(
            f"'{key}'"
        )
        got = json.loads(str(chdb.query(sql, "JSONCompact")))["data"]
        assert got == [[src, key]]
    nothing = f"SELECT count() FROM ({rows}) WHERE " + flow_match("'not a flow'")
    assert json.loads(str(chdb.query(nothing, "JSONCompact")))["data"] == [[0]]
