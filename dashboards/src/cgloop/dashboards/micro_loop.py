"""The node micro loop's panels: the queues every managed HTB class shows (migration 0013's
`node_queues`: measured sojourn, backlog, kernel counters, RFC 9957 sanctions, CE marks), whether
each node's micro loop acts, and which level acted — node (the agent alone), micro (the engine,
applied on the agent) or global."""

from __future__ import annotations

from cgloop.dashboards.panels import LOOP_ACTIONS, Layout, series, table_panel
from grafana_foundation_sdk.builders import dashboard as db
from grafana_foundation_sdk.builders import table, timeseries


def level_name(column: str = "level") -> str:
    """An action's level without its enum prefix: node / micro / global."""
    return f"lower(replaceOne({column}, 'ACTION_LEVEL_', ''))"


def operation_name(column: str = "operation") -> str:
    """An operation without its enum prefix, e.g. queue_protection_sanction."""
    return f"lower(replaceOne({column}, 'ACTION_OPERATION_', ''))"


LEVEL, OPERATION = level_name(), operation_name()

# One series per class: node, interface, tc handle and the class's name.
_CLASS = (
    "concat(node_id, ' ', interface_name, ' ', class_handle,"
    " if(class_name != '', concat(' (', class_name, ')'), ''))"
)


def _delta(counter: str) -> str:
    """Per-row increase of a kernel counter of a class: 0 on the class's first row in range and
    when the counter went back (the class was re-created)."""
    value = f"toInt64({counter})"
    return f"greatest({value} - lagInFrame({value}, 1, {value}) OVER w, 0)"


def queue_panels(d: db.Dashboard, lay: Layout, node_filter: str) -> None:
    """The nodes dashboard's queue panels and the micro loop's status, for `node_filter`."""
    # The sample's time: plain `time` in these SELECTs names the interval bucket, which starts
    # before the range when the range starts inside it (its first samples would be left out).
    where = f"$__timeFilter(node_queues.time) AND {node_filter}"
    d.with_panel(
        lay.place(
            series(
                "Queue delay per class (measured sojourn p99 / max)",
                f"SELECT $__timeInterval(time) AS time, {_CLASS} AS class,"
                " max(sojourn_p99_ns) / 1e3 AS p99_us, max(sojourn_max_ns) / 1e3 AS max_us"
                f" FROM cgloop.node_queues WHERE {where}"
                " GROUP BY time, class ORDER BY time",
                "µs",
            ),
            12,
            8,
        )
    )
    d.with_panel(
        lay.place(
            series(
                "Queue backlog per class",
                f"SELECT $__timeInterval(time) AS time, {_CLASS} AS class,"
                " max(max_backlog_bytes) AS max_backlog_bytes,"
                # the sample's time, not the bucket `time` names in this SELECT
                " argMax(backlog_bytes, node_queues.time) AS backlog_bytes"
                f" FROM cgloop.node_queues WHERE {where}"
                " GROUP BY time, class ORDER BY time",
                "decbytes",
            ),
            12,
            8,
        )
    )
    # Counters are cumulative: the increase between a class's consecutive samples, summed per
    # interval, per second.
    d.with_panel(
        lay.place(
            series(
                "Drops and overlimits per class",
                "SELECT $__timeInterval(time) AS time, class,"
                " sum(drops) / $__interval_s AS drops_per_s,"
                " sum(overlimits) / $__interval_s AS overlimits_per_s FROM ("
                f" SELECT time, {_CLASS} AS class, {_delta('drops')} AS drops,"
                f" {_delta('overlimits')} AS overlimits"
                f" FROM cgloop.node_queues WHERE {where}"
                " WINDOW w AS (PARTITION BY node_id, interface_name, class_id ORDER BY time"
                " ROWS BETWEEN 1 PRECEDING AND CURRENT ROW))"
                " GROUP BY time, class ORDER BY time",
                "pps",
            ),
            12,
            8,
        )
    )
    d.with_panel(
        lay.place(
            series(
                "Queue protection sanctions and CE marks per class",
                f"SELECT $__timeInterval(time) AS time, {_CLASS} AS class,"
                " sum(qprot_sanctioned_packets) AS sanctioned_packets,"
                " sum(ce_marked_packets) AS ce_marked_packets"
                f" FROM cgloop.node_queues WHERE {where}"
                " GROUP BY time, class ORDER BY time",
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
                "Micro loop status",
                "SELECT node_id AS node, max(time) AS last_sample,"
                " argMax(micro_loop.acting, time) AS acting,"
                " argMax(micro_loop.reason, time) AS reason,"
                " round(argMax(micro_loop.queue_sample_age_ns, time) / 1e6, 3)"
                " AS queue_sample_age_ms,"
                " argMax(micro_loop.protected_flows, time) AS protected_flows,"
                " countIf(NOT micro_loop.acting) AS samples_not_acting, count() AS samples"
                f" FROM cgloop.node_samples WHERE $__timeFilter(time) AND {node_filter}"
                " GROUP BY node_id ORDER BY node_id",
            ),
            12,
            8,
        )
    )
    d.with_panel(
        lay.place(
            table_panel(
                "Actions on these nodes by level",
                f"SELECT target_node_id AS node, {LEVEL} AS level, {OPERATION} AS operation,"
                " count() AS actions, max(decided_at) AS last_decided,"
                " argMax(cause, decided_at) AS last_cause"
                f" FROM {LOOP_ACTIONS} WHERE $__timeFilter(decided_at)"
                " AND target_node_id IN (${node:singlequote})"
                " GROUP BY node, level, operation ORDER BY node, level, actions DESC",
            ),
            12,
            8,
            optional=True,  # nothing acted on the selected nodes: a healthy range
        )
    )


def actions_per_level(title: str) -> timeseries.Panel:
    """Actions over time, one series per level and operation (overview dashboards)."""
    return series(
        title,
        f"SELECT $__timeInterval(decided_at) AS time, concat({LEVEL}, ' / ', {OPERATION})"
        f" AS lever, count() AS actions FROM {LOOP_ACTIONS}"
        " WHERE $__timeFilter(decided_at) GROUP BY time, lever ORDER BY time",
        "none",
        points=True,
    )


def level_summary() -> table.Panel:
    """Per level and operation: how many actions, how many applied and verified, how fast."""
    return table_panel(
        "Actions by level and operation",
        f"SELECT {LEVEL} AS level, {OPERATION} AS operation, count() AS actions,"
        " countIf(applied_at > toDateTime64(0, 9, 'UTC')) AS applied,"
        " countIf(verdict = 'VERDICT_IMPROVED') AS verified_improved,"
        " round(quantileExactIf(0.5)(apply_latency_ns, apply_latency_ns > 0) / 1e6, 3)"
        " AS apply_latency_p50_ms,"
        " round(quantileExactIf(0.99)(apply_latency_ns, apply_latency_ns > 0) / 1e6, 3)"
        " AS apply_latency_p99_ms"
        f" FROM {LOOP_ACTIONS} WHERE $__timeFilter(decided_at)"
        " GROUP BY level, operation ORDER BY level, actions DESC",
    )


def node_actions() -> table.Panel:
    """What the agents did alone (level NODE): why, to what, and how long applying took."""
    return table_panel(
        "Node micro-loop actions",
        f"SELECT a.time AS time, a.target_node_id AS node, {OPERATION} AS operation, a.cause AS"
        " cause, a.target_interface_name AS interface,"
        " if(a.target_flow_src_port = 0 AND a.target_flow_dst_port = 0, '',"
        " concat(IPv6NumToString(a.target_flow_src_addr), ':', toString(a.target_flow_src_port),"
        " ' > ', IPv6NumToString(a.target_flow_dst_addr), ':',"
        " toString(a.target_flow_dst_port))) AS flow,"
        " r.state AS state, round(r.apply_latency_ns / 1e6, 3) AS apply_latency_ms,"
        " a.spec AS parameters"
        " FROM (SELECT * FROM cgloop.actions WHERE $__timeFilter(time)"
        " AND level = 'ACTION_LEVEL_NODE' ORDER BY time LIMIT 1 BY id) AS a"
        # Bounded by the range like panels.LOOP_ACTIONS (the result follows its action).
        " LEFT JOIN (SELECT action_id, argMax(state, time) AS state,"
        " max(apply_latency_ns) AS apply_latency_ns FROM cgloop.action_results"
        " WHERE time >= $__fromTime GROUP BY action_id) AS r ON r.action_id = a.id"
        " ORDER BY a.time DESC LIMIT 200",
    )
