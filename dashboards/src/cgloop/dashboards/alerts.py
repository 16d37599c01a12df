"""The NOC's Grafana alert rules as code, in Grafana's file-provisioning format for alerting.

Grafana reads alert rules from YAML files in its alerting provisioning folder
(/etc/grafana/provisioning/alerting): `apiVersion: 1` and `groups:`, each group with `orgId`,
`name`, `folder`, `interval` and `rules:`; a rule has `uid`, `title`, `condition` (the refId of
the query or expression that decides), `data` (queries: `refId`, `datasourceUid`,
`relativeTimeRange` in seconds before now, the data source's `model`), `for`, `labels`,
`annotations`, `noDataState` and `execErrState` (Grafana's documentation: "Use configuration files
to provision alerting resources", https://grafana.com/docs/grafana/v10.4/alerting/set-up/
provision-alerting-resources/file-provisioning/).

Each rule here is a ClickHouse query (or, for the pipeline's lag, which only the sink's
Prometheus metrics know, a PromQL query) and a threshold expression (Grafana's server-side
expressions, data source `__expr__`) on it. An SQL query for alerting returns one numeric column
(the value) and string columns (the alert's labels): the ClickHouse plugin turns each row into
one series, which the threshold judges. `cgloop.dashboards.check.check_rules` runs every SQL
query on a store and checks that shape.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from cgloop.dashboards import slo
from cgloop.dashboards.clickhouse import DATASOURCE_TYPE, DATASOURCE_UID, FORMAT_TABLE

#: The Prometheus data source the pipeline's metrics are read through. The one place its uid is
#: named: Grafana's data source provisioning must give the Prometheus data source this uid.
PROMETHEUS_UID = "cgloop-prometheus"
PROMETHEUS_TYPE = "prometheus"
#: Grafana's server-side expressions.
EXPRESSION_UID = "__expr__"

#: Where the rules file goes, under the provisioned folder (a subfolder: the dashboard provider
#: loads `*.json` only, so the YAML beside the dashboards is not mistaken for one).
RULES_FILE = "alerting/cgloop-rules.yaml"
FOLDER = "cgloop"  # the dashboards' folder (deploy/grafana/provisioning/dashboards/cgloop.yaml)
GROUP = "cgloop NOC"
EVALUATE_EVERY = "1m"

#: The share of a platform's gaming flows over their objective that pages the NOC.
BREACH_SHARE = 0.05
#: The node agent samples every second by default (node_sample_interval_ms = 1000): 30 s
#: without one is many missed samples, not jitter.
NODE_SILENT_S = 30
#: Messages the sink may be behind a partition's end before it is lagging.
LAG_MESSAGES = 10_000
#: Seconds from a flow second to its row in the store before the pipeline is late.
STORE_LAG_S = 30

VERIFICATION_FAILED = (
    "state IN ('ACTION_STATE_ROLLED_BACK', 'ACTION_STATE_FAILED')"
    " OR verdict IN ('VERDICT_WORSE', 'VERDICT_NO_EFFECT')"
)


@dataclass(frozen=True)
class Rule:
    uid: str
    title: str
    query: str  # SQL for the ClickHouse data source, PromQL for Prometheus
    threshold: float  # fires when the value is above it
    window_s: int  # relativeTimeRange: how far back the query looks
    summary: str
    description: str
    severity: str = "warning"
    for_: str = "2m"
    no_data: str = "OK"  # noDataState: NoData, Alerting, OK, KeepLast
    datasource: str = DATASOURCE_UID
    dashboard: str = ""  # uid of the dashboard the alert links to
    labels: dict[str, str] = field(default_factory=dict)

    def model(self) -> dict[str, Any]:
        if self.datasource == PROMETHEUS_UID:
            return {
                "datasource": {"type": PROMETHEUS_TYPE, "uid": PROMETHEUS_UID},
                "editorMode": "code",
                "expr": self.query,
                "instant": True,
                "range": False,
                "refId": "A",
            }
        return {
            "datasource": {"type": DATASOURCE_TYPE, "uid": DATASOURCE_UID},
            "editorType": "sql",
            "format": FORMAT_TABLE,
            "queryType": "table",
            "rawSql": " ".join(self.query.split()),
            "refId": "A",
        }

    def to_provisioning(self) -> dict[str, Any]:
        annotations = {"summary": self.summary, "description": self.description}
        if self.dashboard:
            annotations["__dashboardUid__"] = self.dashboard
        return {
            "uid": self.uid,
            "title": self.title,
            "condition": "B",
            "data": [
                {
                    "refId": "A",
                    "relativeTimeRange": {"from": self.window_s, "to": 0},
                    "datasourceUid": self.datasource,
                    "model": self.model(),
                },
                {
                    "refId": "B",
                    "relativeTimeRange": {"from": 0, "to": 0},
                    "datasourceUid": EXPRESSION_UID,
                    "model": {
                        "datasource": {"type": "__expr__", "uid": EXPRESSION_UID},
                        "type": "threshold",
                        "expression": "A",
                        "conditions": [{"evaluator": {"type": "gt", "params": [self.threshold]}}],
                        "refId": "B",
                    },
                },
            ],
            "noDataState": self.no_data,
            "execErrState": "Error",
            "for": self.for_,
            "labels": {"team": "noc", "severity": self.severity, **self.labels},
            "annotations": annotations,
            "isPaused": False,
        }


def rules() -> list[Rule]:
    flows = (
        "SELECT any(platform) AS flow_platform, max(p99_latency_ns) / 1e6 AS worst"
        " FROM cgloop.gaming_flow_minutes WHERE $__timeFilter(minute)"
        " GROUP BY src_addr, dst_addr, src_port, dst_port, ip_protocol"
    )
    return [
        Rule(
            uid="cgloop-slo-breach",
            title="Gaming flows over their SLO",
            query=(
                "SELECT flow_platform AS platform,"
                f" countIf(worst > {slo.platform_latency_ms_sql('flow_platform')}) / count()"
                f" AS breach_share FROM ({flows}) GROUP BY platform ORDER BY platform"
            ),
            threshold=BREACH_SHARE,
            window_s=600,
            severity="critical",
            summary="{{ $labels.platform }}: gaming flows over their latency SLO",
            description=(
                "Share of the platform's gaming flows whose worst p99 latency over the last"
                f" 10 minutes is above the platform's objective (the SLO table); over"
                f" {BREACH_SHARE:.0%} fires."
            ),
            dashboard="cgloop-noc",
        ),
        Rule(
            uid="cgloop-action-failed",
            title="Loop actions failing verification or rolled back",
            query=(
                "SELECT uniqExactIf(action_id, " + VERIFICATION_FAILED + ") AS failed_actions"
                " FROM cgloop.action_results WHERE $__timeFilter(time)"
            ),
            threshold=0,
            window_s=900,
            for_="0s",
            summary="The loop's actions are failing",
            description=(
                "Actions of the last 15 minutes that verification found worse or without effect,"
                " that failed, or that were rolled back."
            ),
            dashboard="cgloop-loop",
        ),
        Rule(
            uid="cgloop-dead-letters",
            title="Dead letters",
            query=(
                "SELECT topic, count() AS dead_letters FROM cgloop.dead_letters"
                " WHERE $__timeFilter(time) GROUP BY topic ORDER BY topic"
            ),
            threshold=0,
            window_s=600,
            for_="0s",
            summary="{{ $labels.topic }}: records the sink could not store",
            description="Records of the topic put in the dead-letter table in the last 10 min.",
        ),
        Rule(
            uid="cgloop-pipeline-lag",
            title="Pipeline lag",
            query="max by (topic) (cgloop_sink_lag_messages)",
            threshold=LAG_MESSAGES,
            window_s=300,
            datasource=PROMETHEUS_UID,
            summary="{{ $labels.topic }}: the sink is behind",
            description=(
                f"The sink is more than {LAG_MESSAGES} messages behind a partition's end"
                " (cgloop_sink_lag_messages, the sink's Prometheus metrics)."
            ),
        ),
        Rule(
            uid="cgloop-store-lag",
            title="Pipeline lag (store)",
            query=(
                "SELECT toFloat64(quantileExact(0.99)(dateDiff('second', window, ingested_at)))"
                " AS lag_s FROM cgloop.flow_stats_1s WHERE $__timeFilter(window)"
            ),
            threshold=STORE_LAG_S,
            window_s=300,
            summary="Records reach the store late",
            description=(
                "p99 of the time from a flow second to its arrival in the store (flow_stats_1s:"
                f" ingested_at - window) over the last 5 minutes is above {STORE_LAG_S} s."
            ),
        ),
        Rule(
            uid="cgloop-node-agent-silent",
            title="Node agent silent",
            query=(
                "SELECT node_id, toFloat64(dateDiff('second', max(time), $__toTime))"
                " AS silent_s FROM cgloop.node_samples WHERE $__timeFilter(time)"
                " GROUP BY node_id ORDER BY node_id"
            ),
            threshold=NODE_SILENT_S,
            window_s=3600,
            for_="0s",
            severity="critical",
            # no sample from any node for an hour: every agent is silent
            no_data="Alerting",
            summary="{{ $labels.node_id }}: no node samples",
            description=(
                f"No node sample from the node's agent for more than {NODE_SILENT_S} s (the"
                " agent samples every second by default)."
            ),
            dashboard="cgloop-nodes",
        ),
    ]


def provisioning() -> dict[str, Any]:
    return {
        "apiVersion": 1,
        "groups": [
            {
                "orgId": 1,
                "name": GROUP,
                "folder": FOLDER,
                "interval": EVALUATE_EVERY,
                "rules": [r.to_provisioning() for r in rules()],
            }
        ],
    }


def render() -> str:
    """The rules file's text; the same input always gives the same bytes. It is JSON, which is
    YAML too: Grafana's alerting provisioning reads it as the `.yaml` file it is named, and the
    dashboard provider, which loads every `*.json` under the folder, leaves it alone. (`cgloop
    dashboards build --check` and a test keep it equal to this module.)"""
    return json.dumps(provisioning(), indent=2, ensure_ascii=False) + "\n"
