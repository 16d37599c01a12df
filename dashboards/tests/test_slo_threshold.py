"""The NOC overview judges gaming flows by the SLO table (cgloop.slo): its variable offers the
table's choices, and the expression its panels compare with gives each platform's objective,
or a deployment profile's, as ClickHouse evaluates it."""

from __future__ import annotations

import json

import chdb
import pytest
from cgloop.dashboards import slo
from cgloop.dashboards.build import render
from cgloop.dashboards.check import TimeRange, Variable, interpolate
from cgloop.slo import LAB, table

PLATFORMS = ["gfn", "std", "psn", "xc", "generic", "a-platform-without-a-profile", ""]


def _objective(choice: str) -> dict[str, float]:
    expr = slo.latency_ms_sql("p")
    sql = interpolate(
        f"SELECT p, {expr} AS ms FROM (SELECT arrayJoin({PLATFORMS!r}) AS p)",
        {slo.VARIABLE: Variable(slo.VARIABLE, [choice], multi=False)}, TimeRange(0, 1), 1000,
    )  # fmt: skip
    rows = json.loads(str(chdb.query(sql, "JSONCompact")))["data"]
    return {p: float(ms) for p, ms in rows}


def test_each_flow_is_judged_by_its_platforms_objective_by_default() -> None:
    assert slo.choices()[0] == slo.PER_PLATFORM
    assert _objective(slo.PER_PLATFORM) == {p: table().platform(p).latency_ms for p in PLATFORMS}
    assert _objective(slo.PER_PLATFORM)["gfn"] != _objective(slo.PER_PLATFORM)["std"]


def test_a_deployment_profile_judges_every_flow_by_its_objective() -> None:
    assert LAB in slo.choices()
    assert set(_objective(LAB).values()) == {table().latency_ms(LAB)}


def test_the_overview_uses_the_variable_and_no_number_of_its_own() -> None:
    noc = json.loads(render()["noc-overview.json"])
    (var,) = [v for v in noc["templating"]["list"] if v["name"] == slo.VARIABLE]
    assert var["query"] == ",".join(slo.choices())
    assert var["current"]["value"] == slo.PER_PLATFORM
    sqls = [t["rawSql"] for p in noc["panels"] for t in p.get("targets", []) if "rawSql" in t]
    judged = [s for s in sqls if "SLO" in s or "slo" in s]
    assert len(judged) >= 2, "the overview's SLO panels are gone"
    for sql in judged:
        assert "${" + slo.VARIABLE + "}" in sql, sql


@pytest.mark.parametrize("choice", slo.choices())
def test_every_choice_is_a_profile_of_the_table(choice: str) -> None:
    assert choice == slo.PER_PLATFORM or table().deployment(choice).latency_ms is not None
