"""The four NOC dashboards as code, and their JSON for Grafana's file provisioning (with the
pipeline-health dashboard of `pipeline.py`, PromQL on the daemons' metrics).

Every NOC dashboard query is ClickHouse SQL against the tables and views of
datasets/.../migrations, with the ClickHouse plugin's macros ($__timeFilter, $__timeInterval,
$__interval_s, ...) and dashboard variables; `cgloop.dashboards.check` runs each of them against
a store.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from cgloop.dashboards import alerts, slo
from cgloop.dashboards.clickhouse import AnnotationSql, Query, datasource_ref
from cgloop.dashboards.micro_loop import (
    LEVEL,
    actions_per_level,
    level_name,
    level_summary,
    node_actions,
    queue_panels,
)
from cgloop.dashboards.panels import (
    LOOP_ACTIONS,
    OPTIONAL_PANELS,
    Layout,
    custom_variable,
    ms_between,
    new_dashboard,
    series,
    stat_panel,
    table_panel,
)
from cgloop.dashboards.pipeline import pipeline_health
from cgloop.slo import GENERIC
from grafana_foundation_sdk.builders import dashboard as db
from grafana_foundation_sdk.builders import timeseries, trend
from grafana_foundation_sdk.builders.common import GraphThresholdsStyleConfig
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import dashboard as dm
from grafana_foundation_sdk.models.common import GraphTresholdsStyleMode

#: Where `cgloop dashboards build` writes, and what docker-compose.yml mounts into Grafana.
PROVISIONED = Path(__file__).resolve().parents[3] / "provisioned"

# A flow as one readable string, the value of the flow detail's `flow` variable.
FLOW_KEY = (
    "concat(IPv6NumToString(src_addr), ':', toString(src_port), ' > ',"
    " IPv6NumToString(dst_addr), ':', toString(dst_port), ' / ', toString(ip_protocol))"
)
GAMING = "'DETECTION_KIND_GAMING_FLOW_CLASSIFIED'"


def _flow_part(expr: str, end: int) -> str:
    """Source (1) or destination (2) `addr:port` of a FLOW_KEY string."""
    return f"splitByString(' > ', splitByString(' / ', {expr})[1])[{end}]"


def flow_match(flow: str = "'${flow}'") -> str:
    """A flow's rows by the flow tables' sort key: flow_stats_1s and flow_minutes_closed are
    ORDER BY (src_addr, dst_addr, src_port, dst_port, ip_protocol, ...) and int_flow_records
    after source_id, so each key column is compared with a constant parsed from the FLOW_KEY
    string (ClickHouse folds it before the index analysis) instead of rebuilding the string from
    every row, which no index can serve. An unparsable value matches nothing."""
    addr = "toIPv6OrDefault(replaceRegexpOne({}, ':[0-9]+$', ''))"
    port = "toUInt16OrZero(extract({}, ':([0-9]+)$'))"
    src, dst = _flow_part(flow, 1), _flow_part(flow, 2)
    return (
        f"src_addr = {addr.format(src)} AND dst_addr = {addr.format(dst)}"
        f" AND src_port = {port.format(src)} AND dst_port = {port.format(dst)}"
        f" AND ip_protocol = toUInt8OrZero(splitByString(' / ', {flow})[2])"
    )


#: The loop's actions as they change the network: applied, verified, rolled back.
ACTION_EVENTS = ("ACTION_STATE_APPLIED", "ACTION_STATE_VERIFIED", "ACTION_STATE_ROLLED_BACK")
ACTION_ANNOTATIONS = (
    "SELECT r.time AS time, concat(replaceOne(a.operation, 'ACTION_OPERATION_', ''), ': ',"
    " replaceOne(r.state, 'ACTION_STATE_', ''),"
    " if(r.verdict != 'VERDICT_UNSPECIFIED', concat(' (', replaceOne(r.verdict, 'VERDICT_', ''),"
    " ')'), ''), if(r.message != '', concat(': ', r.message), '')) AS text,"
    " [replaceOne(r.state, 'ACTION_STATE_', ''), a.policy_id] AS tags"
    " FROM cgloop.action_results AS r FINAL"
    " LEFT JOIN (SELECT id, any(operation) AS operation, any(policy_id) AS policy_id"
    " FROM cgloop.actions WHERE id IN (SELECT action_id FROM cgloop.action_results WHERE"
    " $__timeFilter(time)) GROUP BY id) AS a ON a.id = r.action_id"
    " WHERE $__timeFilter(r.time) AND r.state IN ("
    + ", ".join(f"'{s}'" for s in ACTION_EVENTS)
    + ") ORDER BY time"
)


def action_annotations(panel_ids: list[int]) -> db.AnnotationQuery:
    """The loop's actions on the given panels (Grafana draws a dashboard's annotations on every
    time series panel unless filtered)."""
    return (
        db.AnnotationQuery()
        .name("loop actions")
        .datasource(datasource_ref())
        .enable(True)
        .icon_color("purple")
        .filter(db.AnnotationPanelFilter().ids(panel_ids))
        .target(AnnotationSql(ACTION_ANNOTATIONS))  # type: ignore[arg-type]
    )


def platform_thresholds(panel: timeseries.Panel) -> timeseries.Panel:
    """Each flow's series gets its platform's latency objective (the SLO table's) as a dashed
    threshold line: series are named `<platform> <server>:<port>`; flows of a platform without
    a profile keep the defaults, generic's objective."""

    def steps(ms: float) -> list[dm.Threshold]:
        return [dm.Threshold(value=None, color="green"), dm.Threshold(value=ms, color="red")]

    objectives = dict(slo.thresholds())
    panel.thresholds(
        db.ThresholdsConfig().mode(dm.ThresholdsMode.ABSOLUTE).steps(steps(objectives[GENERIC]))
    ).thresholds_style(GraphThresholdsStyleConfig().mode(GraphTresholdsStyleMode.DASHED))
    for name, ms in objectives.items():
        if name != GENERIC:
            panel.with_override(
                dm.MatcherConfig(id_val="byRegexp", options=f"^(p99_ms )?{name} "),
                [dm.DynamicConfigValue(id_val="thresholds", value=dm.ThresholdsConfig(
                    mode=dm.ThresholdsMode.ABSOLUTE, steps=steps(ms)))],
            )  # fmt: skip
    return panel


def slo_series(panel: timeseries.Panel) -> timeseries.Panel:
    """The query's `slo_ms` column drawn as the objective: a red dashed line named SLO."""
    return panel.with_override(
        dm.MatcherConfig(id_val="byName", options="slo_ms"),
        [
            dm.DynamicConfigValue(id_val="displayName", value="SLO"),
            dm.DynamicConfigValue(id_val="color", value={"mode": "fixed", "fixedColor": "red"}),
            dm.DynamicConfigValue(
                id_val="custom.lineStyle", value={"fill": "dash", "dash": [10, 10]}
            ),
        ],
    )


def noc_overview() -> db.Dashboard:
    uid = "cgloop-noc"
    lay = Layout(uid)
    d = new_dashboard(
        uid,
        "cgloop / NOC overview",
        "Gaming flows and their latency SLO, what the detectors see and what the loop does.",
    ).with_variable(slo.variable())
    d.with_panel(
        lay.place(
            stat_panel(
                "Gaming flows",
                "SELECT uniqExact(src_addr, dst_addr, src_port, dst_port, ip_protocol) AS flows"
                " FROM cgloop.gaming_flow_minutes WHERE $__timeFilter(minute)",
            ),
            6,
            4,
        )
    )
    d.with_panel(
        lay.place(
            stat_panel(
                "Gaming flows over their SLO",
                "SELECT countIf(worst > " + slo.latency_ms_sql("flow_platform") + ") AS over_slo"
                " FROM (SELECT any(platform) AS flow_platform, max(p99_latency_ns) / 1e6 AS worst"
                " FROM cgloop.gaming_flow_minutes WHERE $__timeFilter(minute)"
                " GROUP BY src_addr, dst_addr, src_port, dst_port, ip_protocol)",
            ),
            6,
            4,
        )
    )
    d.with_panel(
        lay.place(
            stat_panel(
                "Detections",
                "SELECT count() AS detections FROM cgloop.detections FINAL"
                f" WHERE $__timeFilter(window_end) AND kind != {GAMING}",
            ),
            6,
            4,
        )
    )
    d.with_panel(
        lay.place(
            stat_panel(
                "Actions taken",
                f"SELECT count() AS actions FROM {LOOP_ACTIONS} WHERE $__timeFilter(decided_at)",
            ),
            6,
            4,
        )
    )
    d.with_panel(
        lay.place(
            table_panel(
                "Gaming flows and SLO status",
                "SELECT platform, IPv6NumToString(src_addr) AS server, src_port,"
                " IPv6NumToString(dst_addr) AS client, dst_port,"
                f" {FLOW_KEY} AS flow,"
                " sum(packets) AS received_packets,"
                " round(max(p99_latency_ns) / 1e6, 2) AS worst_p99_latency_ms,"
                " round(max(p99_jitter_ns) / 1e6, 2) AS worst_p99_jitter_ms,"
                " round(100 * sum(lost_packets) / greatest(sum(lost_packets) + sum(packets), 1),"
                " 3) AS loss_pct,"
                " " + slo.latency_ms_sql() + " AS slo_ms,"
                " if(worst_p99_latency_ms > slo_ms, 'OVER SLO', 'ok') AS slo"
                " FROM cgloop.gaming_flow_minutes WHERE $__timeFilter(minute)"
                " GROUP BY platform, src_addr, src_port, dst_addr, dst_port, ip_protocol"
                " ORDER BY worst_p99_latency_ms DESC",
            ).data_links([flow_link()]),
            24,
            8,
        )
    )
    d.with_panel(
        lay.place(
            platform_thresholds(
                series(
                    "Gaming flows: p99 latency per minute",
                    "SELECT minute AS time,"
                    " concat(platform, ' ', IPv6NumToString(src_addr), ':', toString(src_port))"
                    " AS flow, p99_latency_ns / 1e6 AS p99_ms"
                    " FROM cgloop.gaming_flow_minutes WHERE $__timeFilter(minute)"
                    " ORDER BY time",
                    "ms",
                )
            ),
            12,
            8,
        )
    )
    latency_panel = lay.next_id - 1
    d.with_panel(
        lay.place(
            series(
                "Detections per kind",
                "SELECT $__timeInterval(window_end) AS time, kind, count() AS detections"
                " FROM cgloop.detections FINAL"
                f" WHERE $__timeFilter(window_end) AND kind != {GAMING}"
                " GROUP BY time, kind ORDER BY time",
                "none",
                points=True,
            ),
            12,
            8,
        )
    )
    d.with_panel(
        lay.place(
            table_panel(
                "Active detections",
                "SELECT window_end AS time, kind, severity, round(confidence, 3) AS confidence,"
                " subject_type,"
                " multiIf(subject_type = 'flow', concat(IPv6NumToString(flow_src_addr), ':',"
                " toString(flow_src_port), ' > ', IPv6NumToString(flow_dst_addr), ':',"
                " toString(flow_dst_port)),"
                " subject_type = 'queue', concat(queue_node_id, '/', queue_interface_name, '/',"
                " toString(queue_id)),"
                " subject_type = 'link', concat(link_src_device_id, ' > ', link_dst_device_id),"
                " subject_type = 'node', node_id, function_name) AS subject, detector"
                " FROM cgloop.detections FINAL"
                f" WHERE $__timeFilter(window_end) AND kind != {GAMING}"
                " ORDER BY window_end DESC LIMIT 100",
            ),
            12,
            8,
        )
    )
    d.with_panel(
        lay.place(
            table_panel(
                "Loop actions",
                f"SELECT decided_at AS time, {LEVEL} AS level, operation, target_node_id AS node,"
                " final_state, verdict, detection_to_apply_ns / 1e6 AS detection_to_apply_ms,"
                f" message, cause FROM {LOOP_ACTIONS} WHERE $__timeFilter(decided_at)"
                " ORDER BY decided_at DESC LIMIT 100",
            ),
            12,
            8,
        )
    )
    d.with_panel(lay.place(actions_per_level("Actions per level and operation"), 24, 8))
    d.annotation(action_annotations([latency_panel]))
    return d


FLOW_DASHBOARD = "cgloop-flow"


def flow_link() -> db.DashboardLink:
    """A row of the overview's flow table to that flow's detail, with the same SLO choice and
    time range (`flow` is the row's FLOW_KEY column)."""
    return db.DashboardLink("Flow detail").url(
        f"/d/{FLOW_DASHBOARD}?var-flow=${{__data.fields.flow:percentencode}}"
        f"&var-{slo.VARIABLE}=${{{slo.VARIABLE}}}&${{__url_time_range}}"
    )


def flow_detail() -> db.Dashboard:
    uid = FLOW_DASHBOARD
    lay = Layout(uid)
    where = "$__timeFilter({t}) AND " + flow_match()
    # Gaming flows first, worst first, so the default selection is the flow a NOC wants.
    flows = (
        db.QueryVariable("flow")
        .label("flow")
        .datasource(datasource_ref())
        .query(
            f"SELECT {FLOW_KEY} AS flow FROM cgloop.flow_minutes WHERE $__timeFilter(minute)"
            " GROUP BY flow"
            " ORDER BY max(platform != '') DESC, max(p99_latency_ns) DESC, sum(packets) DESC"
        )
        .refresh(dm.VariableRefresh.ON_TIME_RANGE_CHANGED)
        .sort(dm.VariableSort.DISABLED)
    )
    d = (
        new_dashboard(
            uid,
            "cgloop / flow detail",
            "One flow: latency percentiles over time, the latency CDF, its worst events.",
        )
        .with_variable(flows)
        .with_variable(custom_variable("worst_n", "worst N events", ["20", "10", "50", "100"]))
        .with_variable(slo.variable())
    )
    pct = (
        "SELECT time, q[1] / 1e6 AS p50, q[2] / 1e6 AS p90, q[3] / 1e6 AS p99,"
        " q[4] / 1e6 AS p999{slo} FROM ("
        " SELECT $__timeInterval(window) AS time, {q} AS q"
        " FROM cgloop.flow_stats_1s WHERE " + where.replace("{t}", "window") + " GROUP BY time)"
        " WHERE NOT isNaN(q[1]) ORDER BY time"
    )
    latency_q = "quantilesTDigestIfMerge(0.5, 0.9, 0.99, 0.999)(latency_ns)"
    # Jitter: the exact per-second states of migration 0011 where there are values (rtp_records
    # counts them: an empty exact state reads 0, not NaN); otherwise the t-digests of seconds
    # stored before it, NaN when those are empty too (no RTP: the point is dropped).
    jitter_q = (
        "if(sum(rtp_records) > 0, arrayMap(x -> toFloat64(x),"
        " quantilesExactIfMerge(0.5, 0.9, 0.99, 0.999)(jitter_exact_ns)), arrayMap(x ->"
        " toFloat64(x), quantilesTDigestIfMerge(0.5, 0.9, 0.99, 0.999)(jitter_ns)))"
    )
    # The flow's latency objective as a series (a threshold cannot follow the flow's platform
    # nor the `slo` variable): the platform is the flow's own, from flow_minutes.
    flow_platform = (
        "(SELECT any(platform) FROM cgloop.flow_minutes"
        " WHERE " + where.replace("{t}", "minute") + ")"
    )
    objective = ", " + slo.latency_ms_sql(flow_platform) + " AS slo_ms"
    d.with_panel(
        lay.place(
            slo_series(
                series(
                    "End-to-end latency percentiles (INT)",
                    pct.replace("{q}", latency_q).replace("{slo}", objective),
                    "ms",
                )
            ),
            12,
            9,
        )
    )
    latency_panels = [lay.next_id - 1]
    d.with_panel(
        lay.place(
            series(
                "RTP jitter percentiles",
                pct.replace("{q}", jitter_q).replace("{slo}", ""),
                "ms",
            ),
            12,
            9,
        )
    )
    d.with_panel(
        lay.place(
            trend.Panel()
            .title("Latency CDF (INT, 0.1 ms steps)")
            .x_field("latency_ms")
            .unit("percentunit")
            .with_target(
                Query(
                    "SELECT latency_ms, sum(n) OVER (ORDER BY latency_ms) / sum(n) OVER ()"
                    " AS fraction FROM ("
                    " SELECT round(end_to_end_latency_ns / 1e6, 1) AS latency_ms, count() AS n"
                    " FROM cgloop.int_flow_records WHERE " + where.replace("{t}", "time") + ""
                    " GROUP BY latency_ms) ORDER BY latency_ms"
                )
            ),
            12,
            9,
        )
    )
    d.with_panel(
        lay.place(
            series(
                "Worst ${worst_n} latency events over time (INT)",
                "SELECT time, latency_ms FROM ("
                " SELECT time, end_to_end_latency_ns / 1e6 AS latency_ms"
                " FROM cgloop.int_flow_records WHERE " + where.replace("{t}", "time") + ""
                " ORDER BY end_to_end_latency_ns DESC LIMIT ${worst_n}) ORDER BY time",
                "ms",
                points=True,
            ),
            12,
            9,
        )
    )
    latency_panels.append(lay.next_id - 1)
    d.with_panel(
        lay.place(
            series(
                "Throughput, RTP loss and drops",
                "SELECT $__timeInterval(window) AS time,"
                " sum(bytes) * 8 / $__interval_s AS bits_per_s,"
                " sum(lost_packets) AS rtp_lost, sum(dropped_packets) AS int_dropped"
                " FROM cgloop.flow_stats_1s WHERE " + where.replace("{t}", "window") + ""
                " GROUP BY time ORDER BY time",
                "bps",
            ),
            12,
            8,
        )
    )
    d.with_panel(
        lay.place(
            table_panel(
                "Worst ${worst_n} latency events",
                "SELECT time, round(end_to_end_latency_ns / 1e6, 3) AS latency_ms,"
                " arrayStringConcat(arrayMap(s -> toString(s), path_switch_ids), ' > ') AS path,"
                " reason FROM cgloop.int_flow_records WHERE " + where.replace("{t}", "time") + ""
                " ORDER BY end_to_end_latency_ns DESC LIMIT ${worst_n}",
            ),
            12,
            8,
        )
    )
    d.annotation(action_annotations(latency_panels))
    return d


def loop_audit() -> db.Dashboard:
    uid = "cgloop-loop"
    lay = Layout(uid)
    d = new_dashboard(
        uid,
        "cgloop / loop audit",
        "Every action of the loop: why, what the guards refused, what verification measured, and"
        " how long each step took (detection, decision, applied, verified).",
    )
    # One row per action: its first record (the decision), the earliest detection it cites,
    # and the latest result (applied / verified times).
    steps = (
        "SELECT a.id AS action_id, a.operation AS operation, a.policy_id AS policy,"
        " min(d.window_end) AS detected_at, any(a.time) AS decided_at,"
        " any(r.applied) AS applied_at, any(r.verified) AS verified_at,"
        " any(r.state) AS state, any(r.verdict) AS verdict,"
        f" any({level_name('a.level')}) AS level"
        " FROM (SELECT * FROM cgloop.actions WHERE $__timeFilter(time)"
        " ORDER BY time LIMIT 1 BY id) AS a"
        " ARRAY JOIN a.reason_detection_ids AS detection_id"
        " INNER JOIN (SELECT id, window_end FROM cgloop.detections FINAL) AS d"
        " ON d.id = detection_id"
        " LEFT JOIN (SELECT action_id, max(applied) AS applied, max(verified) AS verified,"
        " argMax(state, time) AS state, argMax(verdict, time) AS verdict"
        " FROM cgloop.action_results WHERE time >= $__fromTime GROUP BY action_id) AS r"
        " ON r.action_id = a.id"
        " GROUP BY a.id, a.operation, a.policy_id"
    )
    d.with_panel(
        lay.place(
            stat_panel(
                "Actions",
                f"SELECT count() AS actions FROM {LOOP_ACTIONS} WHERE $__timeFilter(decided_at)",
            ),
            6,
            4,
        )
    )
    d.with_panel(
        lay.place(
            stat_panel(
                "Refused by guards",
                "SELECT countIf(final_state = 'ACTION_STATE_REFUSED') AS refused"
                f" FROM {LOOP_ACTIONS} WHERE $__timeFilter(decided_at)",
            ),
            6,
            4,
        )
    )
    d.with_panel(
        lay.place(
            stat_panel(
                "Verified improvements",
                "SELECT countIf(verdict = 'VERDICT_IMPROVED') AS improved"
                f" FROM {LOOP_ACTIONS} WHERE $__timeFilter(decided_at)",
            ),
            6,
            4,
        )
    )
    d.with_panel(
        lay.place(
            stat_panel(
                "Detection to applied, p99",
                "SELECT quantileExact(0.99)("
                + ms_between("applied_at", "detected_at")
                + ") AS p99_ms"
                " FROM (" + steps + ")",
                "ms",
            ),
            6,
            4,
        )
    )
    d.with_panel(
        lay.place(
            table_panel(
                "Loop latency per action: detection, decision, applied, verified",
                "SELECT decided_at AS time, level, operation, policy, state, verdict,"
                " " + ms_between("decided_at", "detected_at") + " AS detection_to_decision_ms,"
                " " + ms_between("applied_at", "decided_at") + " AS decision_to_applied_ms,"
                " " + ms_between("verified_at", "applied_at") + " AS applied_to_verified_ms,"
                " " + ms_between("applied_at", "detected_at") + " AS detection_to_applied_ms,"
                " action_id FROM (" + steps + ") ORDER BY decided_at DESC",
            ),
            24,
            8,
        )
    )
    d.with_panel(
        lay.place(
            series(
                "Loop latency over time",
                "SELECT decided_at AS time,"
                " " + ms_between("decided_at", "detected_at") + " AS detection_to_decision_ms,"
                " " + ms_between("applied_at", "detected_at") + " AS detection_to_applied_ms,"
                " " + ms_between("verified_at", "detected_at") + " AS detection_to_verified_ms"
                " FROM (" + steps + ") ORDER BY time",
                "ms",
                points=True,
            ),
            12,
            8,
        )
    )
    d.with_panel(
        lay.place(
            table_panel(
                "Guard refusals",
                "SELECT decided_at AS time, policy_id, operation, target_node_id AS node,"
                f" message FROM {LOOP_ACTIONS}"
                " WHERE $__timeFilter(decided_at) AND final_state = 'ACTION_STATE_REFUSED'"
                " ORDER BY decided_at DESC",
            ),
            12,
            8,
            optional=True,
        )
    )
    d.with_panel(
        lay.place(
            table_panel(
                "Verification results",
                "SELECT r.time AS time, a.operation AS operation, r.verdict AS verdict,"
                " r.verified_metric AS metric, r.before_value AS before, r.after_value AS after,"
                " r.latency_before.p99_ns / 1e6 AS p99_before_ms,"
                " r.latency_after.p99_ns / 1e6 AS p99_after_ms, r.verification_detail AS detail"
                " FROM cgloop.action_results AS r FINAL"
                " LEFT JOIN (SELECT id, any(operation) AS operation FROM cgloop.actions"
                " WHERE id IN (SELECT action_id FROM cgloop.action_results WHERE"
                " $__timeFilter(time)) GROUP BY id) AS a ON a.id = r.action_id"
                " WHERE $__timeFilter(r.time) AND r.verdict != 'VERDICT_UNSPECIFIED'"
                " ORDER BY r.time DESC",
            ),
            12,
            8,
        )
    )
    d.with_panel(
        lay.place(
            table_panel(
                "Actions and their reasons",
                "SELECT la.decided_at AS time,"
                f" {level_name('la.level')} AS level, la.operation AS operation,"
                " la.final_state AS state, la.dry_run AS dry_run,"
                " arrayStringConcat(arrayFilter(k -> k != '', groupArray(d.kind)), ', ')"
                " AS reasons, any(la.cause) AS cause, any(la.message) AS message"
                f" FROM {LOOP_ACTIONS} AS la"
                # LEFT: a node-level action cites no detection; its cause says why
                " LEFT ARRAY JOIN la.reason_detection_ids AS detection_id"
                " LEFT JOIN (SELECT id, kind FROM cgloop.detections FINAL) AS d"
                " ON d.id = detection_id WHERE $__timeFilter(la.decided_at)"
                " GROUP BY la.action_id, la.decided_at, la.level, la.operation, la.final_state,"
                " la.dry_run ORDER BY time DESC",
            ),
            12,
            8,
        )
    )
    d.with_panel(lay.place(level_summary(), 12, 8))
    d.with_panel(lay.place(node_actions(), 12, 8, optional=True))
    return d


def nodes() -> db.Dashboard:
    uid = "cgloop-nodes"
    lay = Layout(uid)
    node_filter = "node_id IN (${node:singlequote})"
    node_var = (
        db.QueryVariable("node")
        .label("node")
        .datasource(datasource_ref())
        .query(
            "SELECT DISTINCT node_id FROM cgloop.node_samples WHERE $__timeFilter(time)"
            " ORDER BY node_id"
        )
        .refresh(dm.VariableRefresh.ON_TIME_RANGE_CHANGED)
        .multi(True)
        .include_all(True)
        .current(dm.VariableOption(selected=True, text="All", value="$__all"))
    )
    d = new_dashboard(
        uid,
        "cgloop / nodes",
        "Queues and traffic classes, CPU frequency and power of the nodes, active probe RTT.",
    ).with_variable(node_var)
    d.with_panel(
        lay.place(
            series(
                "Queue delay (INT)",
                "SELECT $__timeInterval(time) AS time,"
                " concat('switch ', toString(switch_id), ' port ', toString(egress_port),"
                " ' q', toString(queue_id)) AS queue, max(queue_latency_ns) / 1e3 AS delay_us"
                " FROM cgloop.int_queue_records WHERE $__timeFilter(int_queue_records.time)"
                " GROUP BY time, queue ORDER BY time",
                "µs",
            ),
            12,
            8,
        )
    )
    d.with_panel(
        lay.place(
            series(
                "Queue occupancy (INT)",
                "SELECT $__timeInterval(time) AS time,"
                " concat('switch ', toString(switch_id), ' port ', toString(egress_port),"
                " ' q', toString(queue_id)) AS queue, max(queue_occupancy_cells) AS cells"
                " FROM cgloop.int_queue_records WHERE $__timeFilter(int_queue_records.time)"
                " GROUP BY time, queue ORDER BY time",
                "none",
            ),
            12,
            8,
        )
    )
    d.with_panel(
        lay.place(
            series(
                "Traffic per DSCP class",
                "SELECT $__timeInterval(interval_start) AS time,"
                " concat('dscp ', toString(last_dscp)) AS class,"
                " sum(bytes) * 8 / $__interval_s AS bits_per_s"
                " FROM cgloop.flow_records WHERE $__timeFilter(interval_start)"
                " GROUP BY time, class ORDER BY time",
                "bps",
            ),
            12,
            8,
        )
    )
    d.with_panel(
        lay.place(
            series(
                "Probe RTT",
                "SELECT $__timeInterval(sent) AS time, probe_id,"
                " quantileExact(0.99)(rtt_ns) / 1e3 AS p99_rtt_us"
                " FROM cgloop.probe_records WHERE $__timeFilter(sent) AND NOT lost AND NOT overdue"
                " GROUP BY time, probe_id ORDER BY time",
                "µs",
                points=True,
            ),
            12,
            8,
        )
    )
    d.with_panel(
        lay.place(
            series(
                "CPU frequency per core",
                "SELECT time, concat(node_id, ' cpu', toString(c.core)) AS core,"
                " c.frequency_khz / 1e3 AS mhz FROM cgloop.node_samples"
                " ARRAY JOIN cores AS c WHERE $__timeFilter(time) AND " + node_filter + ""
                " ORDER BY time",
                "MHz",
                points=True,
            ),
            12,
            8,
        )
    )
    d.with_panel(
        lay.place(
            series(
                "Core utilisation",
                "SELECT time, concat(node_id, ' cpu', toString(c.core)) AS core,"
                " c.utilization AS utilisation FROM cgloop.node_samples"
                " ARRAY JOIN cores AS c WHERE $__timeFilter(time) AND " + node_filter + ""
                " ORDER BY time",
                "percentunit",
                points=True,
            ),
            12,
            8,
        )
    )
    d.with_panel(
        lay.place(
            series(
                "Power",
                "SELECT time, node_id, power_watts AS watts FROM cgloop.node_samples"
                " WHERE $__timeFilter(time) AND " + node_filter + " ORDER BY time",
                "watt",
                points=True,
            ),
            12,
            8,
        )
    )
    d.with_panel(
        lay.place(
            table_panel(
                "Packet functions",
                "SELECT node_id, f.function_name AS function, f.core AS core,"
                " max(f.packets) AS packets, max(f.forwarded_packets) AS forwarded"
                " FROM cgloop.node_samples ARRAY JOIN functions AS f"
                " WHERE $__timeFilter(time) AND " + node_filter + ""
                " GROUP BY node_id, function, core ORDER BY node_id, function",
            ),
            12,
            8,
        )
    )
    queue_panels(d, lay, node_filter)
    return d


#: file stem -> builder
DASHBOARDS: dict[str, Callable[[], db.Dashboard]] = {
    "noc-overview": noc_overview,
    "flow-detail": flow_detail,
    "loop-audit": loop_audit,
    "nodes": nodes,
    "pipeline-health": pipeline_health,
}


def render() -> dict[str, str]:
    """Every dashboard's JSON text by file name; the same input always gives the same bytes."""
    OPTIONAL_PANELS.clear()
    out = {}
    for stem, make in DASHBOARDS.items():
        model = json.loads(json.dumps(make().build(), cls=JSONEncoder))
        for panel in model["panels"]:
            # The SDK writes `options: null` for a panel left at its defaults; Grafana's panel
            # migrations expect an object.
            if panel.get("options") is None:
                panel["options"] = {}
        out[f"{stem}.json"] = json.dumps(model, indent=2, sort_keys=True, ensure_ascii=False) + "\n"
    return out


def render_all() -> dict[str, str]:
    """Everything `cgloop dashboards build` writes: the dashboards and the alert rules."""
    return {**render(), alerts.RULES_FILE: alerts.render()}


def write(folder: Path = PROVISIONED) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for name, text in render_all().items():
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        written.append(path)
    return written
