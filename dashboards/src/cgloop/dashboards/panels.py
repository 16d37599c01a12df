"""Panel and layout helpers shared by the dashboards (build.py) and their node micro-loop
panels (micro_loop.py)."""

from __future__ import annotations

from cgloop.dashboards.clickhouse import Query, datasource_ref
from grafana_foundation_sdk.builders import dashboard as db
from grafana_foundation_sdk.builders import stat, table, timeseries
from grafana_foundation_sdk.models import dashboard as dm
from grafana_foundation_sdk.models.common import GraphDrawStyle, VisibilityMode

#: Panels that legitimately show nothing in a healthy run: (dashboard uid, panel title).
OPTIONAL_PANELS: set[tuple[str, str]] = set()

NO_TIME = "toDateTime64(0, 9, 'UTC')"


def ms_between(later: str, earlier: str) -> str:
    """Milliseconds between two DateTime64(9) columns; NULL when either is unset (epoch 0)."""
    return (
        f"if({later} > {NO_TIME} AND {earlier} > {NO_TIME},"
        f" (toUnixTimestamp64Nano({later}) - toUnixTimestamp64Nano({earlier})) / 1e6, NULL)"
    )


class Layout:
    """Panels left to right in rows of 24 grid units; ids in order, so builds are deterministic."""

    def __init__(self, uid: str) -> None:
        self.uid, self.x, self.y, self.row_h, self.next_id = uid, 0, 0, 0, 1

    def place(self, panel, w: int, h: int, optional: bool = False):
        if self.x + w > 24:
            self.x, self.y, self.row_h = 0, self.y + self.row_h, 0
        panel.id(self.next_id).grid_pos(dm.GridPos(h=h, w=w, x=self.x, y=self.y))
        panel.datasource(datasource_ref())
        self.next_id += 1
        self.x += w
        self.row_h = max(self.row_h, h)
        if optional:
            OPTIONAL_PANELS.add((self.uid, panel.build().title or ""))
        return panel


def new_dashboard(uid: str, title: str, description: str) -> db.Dashboard:
    return (
        db.Dashboard(title)
        .uid(uid)
        .description(description)
        .tags(["cgloop"])
        .timezone("utc")
        .time("now-15m", "now")
        .refresh("10s")
        .readonly()
        .tooltip(dm.DashboardCursorSync.CROSSHAIR)
    )


def series(title: str, sql: str, unit: str, points: bool = False) -> timeseries.Panel:
    panel = timeseries.Panel().title(title).with_target(Query(sql, "time_series")).unit(unit)
    if points:
        panel.draw_style(GraphDrawStyle.POINTS).show_points(VisibilityMode.ALWAYS).point_size(6)
    return panel


def table_panel(title: str, sql: str) -> table.Panel:
    return table.Panel().title(title).with_target(Query(sql))


def stat_panel(title: str, sql: str, unit: str = "none") -> stat.Panel:
    return stat.Panel().title(title).with_target(Query(sql)).unit(unit)


def custom_variable(name: str, label: str, values: list[str]) -> db.CustomVariable:
    return (
        db.CustomVariable(name)
        .label(label)
        .values(",".join(values))
        .current(dm.VariableOption(selected=True, text=values[0], value=values[0]))
    )


# `cgloop.loop_actions` (migration 0005, 0013) over the dashboard's range only. The view picks
# each action's first record and joins every result ever kept before any filter applies, so a
# panel on it reads the whole table: at one record per sanctioned flow per audit interval from
# the node micro loop that is ~1 s a panel over 15 minutes of a day's 864 k records
# (bench/datasets/bench_micro_loop_panels.py). Here the actions are those recorded in the range
# and the results those since its start (they follow their action). No FINAL: LIMIT 1 BY keeps
# one record per action, argMax/max read a replayed result alike.
LOOP_ACTIONS = (
    "(SELECT a.id AS action_id, a.time AS decided_at, a.policy_id AS policy_id,"
    " a.operation AS operation, a.level AS level, a.target_node_id AS target_node_id,"
    " a.reason_detection_ids AS reason_detection_ids, a.dry_run AS dry_run, a.cause AS cause,"
    " r.state AS final_state, r.verdict AS verdict, r.applied AS applied_at,"
    " r.detection_to_apply_ns AS detection_to_apply_ns, r.message AS message,"
    " r.apply_latency_ns AS apply_latency_ns"
    " FROM (SELECT id, time, policy_id, operation, level, target_node_id, reason_detection_ids,"
    " dry_run, cause FROM cgloop.actions WHERE $__timeFilter(time)"
    " ORDER BY time LIMIT 1 BY id) AS a"
    " LEFT JOIN (SELECT action_id, argMax(state, time) AS state,"
    " argMax(verdict, time) AS verdict, max(applied) AS applied,"
    " max(detection_to_apply_ns) AS detection_to_apply_ns, argMax(message, time) AS message,"
    " max(apply_latency_ns) AS apply_latency_ns FROM cgloop.action_results"
    " WHERE time >= $__fromTime GROUP BY action_id) AS r ON r.action_id = a.id)"
)
