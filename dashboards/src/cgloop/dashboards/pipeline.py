"""The pipeline-health dashboard: the daemons' own Prometheus metrics (issue 22, self-monitoring).

Every query is PromQL through the Prometheus data source `alerts.PROMETHEUS_UID`. The metric
names are those the daemons register (core's `cgloop.metrics`, the sink's
`cgloop.datasets.sink.metrics`, the Rust daemons' `metrics.rs`); `dashboards/tests/
test_pipeline_metrics.py` checks every name used here against the project's sources.

Scrape jobs: one per daemon of the ops table (proto/cgloop/v1/ops.proto, read through
`cgloop.contracts.ops`), named as the daemons name themselves in `cgloop_daemon{daemon}`
(`cgloop.metrics.daemon_key`, lower case: `analytics`, `policy_engine`, ...). `JOBS` is the one
mapping; a Prometheus configuration scraping the daemons must use these job names.
"""

from __future__ import annotations

from cgloop.contracts.ops import endpoints
from cgloop.dashboards.alerts import PROMETHEUS_TYPE, PROMETHEUS_UID
from cgloop.dashboards.panels import Layout, new_dashboard
from cgloop.metrics import daemon_key
from grafana_foundation_sdk.builders import dashboard as db
from grafana_foundation_sdk.builders import prometheus, stat, timeseries
from grafana_foundation_sdk.builders.common import ReduceDataOptions
from grafana_foundation_sdk.models import dashboard as dm
from grafana_foundation_sdk.models.common import BigValueColorMode
from grafana_foundation_sdk.models.prometheus import QueryEditorMode

UID = "cgloop-pipeline"
RATE = "[$__rate_interval]"


def job(daemon: int) -> str:
    """The Prometheus job name of a daemon: `int_collector` for DAEMON_INT_COLLECTOR."""
    return daemon_key(daemon).lower()


#: Scrape job name per daemon of the ops table, in its declaration order.
JOBS: dict[int, str] = {number: job(number) for number in endpoints()}


def _ref() -> dm.DataSourceRef:
    return dm.DataSourceRef(type_val=PROMETHEUS_TYPE, uid=PROMETHEUS_UID)


def promql(expr: str, legend: str, ref: str = "A") -> prometheus.Dataquery:
    return (
        prometheus.Dataquery()
        .expr(expr)
        .legend_format(legend)
        .ref_id(ref)
        .editor_mode(QueryEditorMode.CODE)
        .range()
        .datasource(_ref())
    )


def quantiles(metric: str, name: str) -> list[tuple[str, str]]:
    """p50 and p99 of a histogram (seconds) over the panel's rate window."""
    return [
        (f"histogram_quantile({q}, sum by (le) (rate({metric}_bucket{RATE})))", f"{name} p{p}")
        for q, p in ((0.5, 50), (0.99, 99))
    ]


class _Panels:
    def __init__(self) -> None:
        self.layout = Layout(UID)
        self.placed: list = []

    def series(self, title: str, desc: str, unit: str, queries: list[tuple[str, str]], w=12):
        panel = timeseries.Panel().title(title).description(desc).unit(unit)
        for i, (expr, legend) in enumerate(queries):
            panel.with_target(promql(expr, legend, chr(ord("A") + i)))
        return self._place(panel, w, 8)

    def stat(self, title: str, desc: str, unit: str, queries: list[tuple[str, str]], w=12):
        panel = (
            stat.Panel().title(title).description(desc).unit(unit)
            .color_mode(BigValueColorMode.BACKGROUND)
            .reduce_options(ReduceDataOptions().calcs(["lastNotNull"]))
        )  # fmt: skip
        for i, (expr, legend) in enumerate(queries):
            panel.with_target(promql(expr, legend, chr(ord("A") + i)))
        return self._place(panel, w, 5)

    def _place(self, panel, w: int, h: int):
        self.layout.place(panel, w, h)
        panel.datasource(_ref())  # place() gives every panel the ClickHouse data source
        self.placed.append(panel)
        return panel


def _thresholds(red_below: float) -> db.ThresholdsConfig:
    """Red under `red_below`, green from it."""
    steps = [dm.Threshold(value=None, color="red"), dm.Threshold(value=red_below, color="green")]
    return db.ThresholdsConfig().mode(dm.ThresholdsMode.ABSOLUTE).steps(steps)


def pipeline_health() -> db.Dashboard:
    d = new_dashboard(
        UID,
        "cgloop pipeline health",
        "The daemons' own metrics (Prometheus): scrape targets, records in and out, consumer "
        "lag, dead letters, drops, the loop's latencies, the store, the INT collector and the "
        "node agent. Jobs are the daemons of proto/cgloop/v1/ops.proto (docs/dashboards.md).",
    )
    p = _Panels()
    jobs = "|".join(JOBS.values())
    up = p.stat(
        "Scrape targets up",
        "Prometheus `up` per scrape job and instance: 1 the daemon's /metrics answered, 0 not.",
        "none",
        [(f'up{{job=~"{jobs}"}}', "{{job}} {{instance}}")],
        w=24,
    )
    up.thresholds(_thresholds(1)).mappings(
        [
            dm.ValueMap(
                options={
                    "0": dm.ValueMappingResult(text="down", color="red"),
                    "1": dm.ValueMappingResult(text="up", color="green"),
                }
            )
        ]
    )
    p.series(
        "Records in per daemon",
        "Records decoded from the bus per second (Python daemons by topic; the sink's Kafka "
        "messages; the INT collector's report datagrams).",
        "rps",
        [
            (f"sum by (job, topic) (rate(cgloop_records_in_total{RATE}))", "{{job}} {{topic}}"),
            (f"sum by (job, topic) (rate(cgloop_sink_messages_total{RATE}))", "{{job}} {{topic}}"),
            (
                f"sum by (job) (rate(cgloop_int_collector_datagrams_received_total{RATE}))",
                "{{job}} datagrams",
            ),
        ],
    )
    p.series(
        "Records out per daemon",
        "Records produced per second (by topic), rows the sink wrote (by table), the probe's "
        "flow records and the INT collector's INT records.",
        "rps",
        [
            (f"sum by (job, topic) (rate(cgloop_records_out_total{RATE}))", "{{job}} {{topic}}"),
            (f"sum by (job, table) (rate(cgloop_sink_rows_total{RATE}))", "{{job}} {{table}}"),
            (f"sum by (job) (rate(cgloop_probe_records_total{RATE}))", "{{job}} flow records"),
            (
                f"sum by (job) (rate(cgloop_int_collector_records_produced_total{RATE}))",
                "{{job}} INT records",
            ),
        ],
    )
    p.series(
        "Consumer lag per topic",
        "Messages behind the partition's end after the last one consumed, worst partition.",
        "short",
        [
            ("max by (job, topic) (cgloop_consumer_lag_messages)", "{{job}} {{topic}}"),
            ("max by (job, topic) (cgloop_sink_lag_messages)", "{{job}} {{topic}}"),
        ],
    )
    p.series(
        "Dead letters per topic",
        "Messages per second the decoders refused and sent to the dead-letter topic.",
        "short",
        [
            (f"sum by (job, topic) (rate(cgloop_dead_letters_total{RATE}))", "{{job}} {{topic}}"),
            (
                f"sum by (job, topic) (rate(cgloop_sink_dead_letters_total{RATE}))",
                "{{job}} {{topic}}",
            ),
        ],
    )
    p.series(
        "Drops by reason",
        "Records or messages dropped per second, by daemon and reason.",
        "short",
        [(f"sum by (job, reason) (rate(cgloop_drops_total{RATE}))", "{{job}} {{reason}}")],
    )
    p.series(
        "Detection latency",
        "A detection's data window end to the detection acknowledged by Kafka (analytics).",
        "s",
        quantiles("cgloop_analytics_detection_latency_seconds", "detection"),
    )
    p.series(
        "Engine decision and apply latency",
        "Policy engine: a detection to the action decided on it, and the action to its first "
        "result's apply time.",
        "s",
        quantiles("cgloop_policy_decision_latency_seconds", "decision")
        + quantiles("cgloop_policy_apply_latency_seconds", "apply"),
    )
    p.series(
        "Store queries",
        "Store server SQL queries per second by outcome (ok, refused, failed) and refusals by "
        "the ClickHouse error code answered.",
        "reqps",
        [
            (f"sum by (outcome) (rate(cgloop_store_queries_total{RATE}))", "{{outcome}}"),
            (f"sum by (code) (rate(cgloop_store_refusals_total{RATE}))", "refused {{code}}"),
        ],
    )
    p.series(
        "Store query duration",
        "Store server query duration p50/p99.",
        "s",
        quantiles("cgloop_store_query_duration_seconds", "query"),
    )
    p.series(
        "INT collector refused reports",
        "Datagrams or reports refused per second, by reason (refused_source: sender not "
        "allowed; otherwise the parser's kind:what).",
        "short",
        [
            (
                f"sum by (reason) (rate(cgloop_int_collector_reports_refused_total{RATE}))",
                "{{reason}}",
            )
        ],
    )
    p.series(
        "Node agent gRPC requests",
        "NodeAgentService requests per second by gRPC status code (and method).",
        "reqps",
        [
            (
                f"sum by (instance, code, method) "
                f"(rate(cgloop_node_agent_grpc_requests_total{RATE}))",
                "{{instance}} {{method}} {{code}}",
            )
        ],
    )
    p.series(
        "Queue sampler last tick age",
        "Age of the node agent's newest queue tick: the micro loop's view of its queues.",
        "s",
        [
            (
                "max by (instance) (cgloop_node_agent_queue_sampler_last_tick_age_seconds)",
                "{{instance}}",
            )
        ],
    )
    acting = p.stat(
        "Micro loop acting",
        "1 when the node's micro loop may act (its monitor reads its queues, the guard may move "
        "flows); 0 when it stands down.",
        "none",
        [("min by (instance) (cgloop_node_agent_micro_loop_acting)", "{{instance}}")],
    )
    acting.thresholds(_thresholds(1))
    for panel in p.placed:
        d.with_panel(panel)
    return d
