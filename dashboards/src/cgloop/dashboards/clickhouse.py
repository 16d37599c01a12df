"""A ClickHouse data-source query for the Grafana foundation SDK.

The SDK ships query builders for Grafana's core data sources only; grafana-clickhouse-datasource
queries are a small JSON object (the plugin's `CHQuery`, src/types/sql.ts in
grafana/clickhouse-datasource): raw SQL with `editorType: "sql"`, the result `format`
(sqlutil's FormatQueryOption: 0 time series, 1 table) and the matching `queryType`.
"""

from __future__ import annotations

import typing

from grafana_foundation_sdk.cog import builder as cogbuilder
from grafana_foundation_sdk.cog import variants as cogvariants
from grafana_foundation_sdk.models import dashboard

#: Must match deploy/grafana/provisioning/datasources/clickhouse.yaml.
DATASOURCE_TYPE = "grafana-clickhouse-datasource"
DATASOURCE_UID = "cgloop-clickhouse"

FORMAT_TIME_SERIES = 0
FORMAT_TABLE = 1

Format = typing.Literal["time_series", "table"]


def datasource_ref() -> dashboard.DataSourceRef:
    return dashboard.DataSourceRef(type_val=DATASOURCE_TYPE, uid=DATASOURCE_UID)


class ClickHouseQuery(cogvariants.Dataquery):
    def __init__(self, ref_id: str, sql: str, fmt: Format) -> None:
        self.ref_id, self.sql, self.fmt = ref_id, sql, fmt

    def to_json(self) -> dict[str, object]:
        series = self.fmt == "time_series"
        return {
            "datasource": {"type": DATASOURCE_TYPE, "uid": DATASOURCE_UID},
            "editorType": "sql",
            "format": FORMAT_TIME_SERIES if series else FORMAT_TABLE,
            "queryType": "timeseries" if series else "table",
            "rawSql": self.sql,
            "refId": self.ref_id,
        }


class Query(cogbuilder.Builder[ClickHouseQuery]):
    """`Query(sql)` for a table result, `Query(sql, "time_series")` for a time series."""

    def __init__(self, sql: str, fmt: Format = "table", ref_id: str = "A") -> None:
        self._q = ClickHouseQuery(ref_id, " ".join(sql.split()), fmt)

    def build(self) -> ClickHouseQuery:
        return self._q


class AnnotationSql(cogbuilder.Builder[ClickHouseQuery]):
    """An annotation query: a table with `time`, `text` and `tags` columns (the plugin's
    annotation support, src/data/CHDatasource.ts). Grafana keeps a data source query in an
    annotation's `target`; the SDK's AnnotationTarget models only the built-in one."""

    def __init__(self, sql: str) -> None:
        self._q = ClickHouseQuery("Anno", " ".join(sql.split()), "table")

    def build(self) -> ClickHouseQuery:
        return self._q
