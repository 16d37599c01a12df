"""Macro and variable expansion, against the plugin's definitions (pkg/macros/macros.go,
CHDatasource.applyTemplateVariables) and Grafana's interval rounding."""

from __future__ import annotations

import re

import pytest
from cgloop.dashboards.check import (
    ExpansionError,
    TimeRange,
    Variable,
    expand_macros,
    interpolate,
    interval_ms,
)

# 2025-06-15 15:00:00.250 UTC .. 15:10:00.999 UTC
RNG = TimeRange(1_749_999_600_250_000_000, 1_750_000_200_999_000_000)


def test_time_macros_expand_like_the_plugin() -> None:
    assert expand_macros("WHERE $__timeFilter(time)", RNG, 1000) == (
        "WHERE time >= toDateTime(1749999600) AND time <= toDateTime(1750000200)"
    )
    assert expand_macros("$__timeFilter_ms(t)", RNG, 1000) == (
        "t >= fromUnixTimestamp64Milli(1749999600250)"
        " AND t <= fromUnixTimestamp64Milli(1750000200999)"
    )
    assert expand_macros("$__fromTime, $__toTime", RNG, 1000) == (
        "toDateTime(1749999600), toDateTime(1750000200)"
    )
    assert expand_macros("$__dateFilter(d)", RNG, 1000) == (
        "d >= toDate('2025-06-15') AND d <= toDate('2025-06-15')"
    )
    assert expand_macros("$__dt(d, t)", RNG, 1000) == (
        "(d >= toDate('2025-06-15') AND d <= toDate('2025-06-15')) AND"
        " (t >= toDateTime(1749999600) AND t <= toDateTime(1750000200))"
    )


def test_interval_macros_use_at_least_one_second() -> None:
    assert expand_macros("$__timeInterval(window)", RNG, 200) == (
        "toStartOfInterval(toDateTime(window), INTERVAL 1 second)"
    )
    assert expand_macros("$__timeInterval(toStartOfSecond(t))", RNG, 60_000) == (
        "toStartOfInterval(toDateTime(toStartOfSecond(t)), INTERVAL 60 second)"
    )
    assert expand_macros("$__timeInterval_ms(t)", RNG, 200) == (
        "toStartOfInterval(toDateTime64(t, 3), INTERVAL 200 millisecond)"
    )
    assert expand_macros("x / $__interval_s", RNG, 5_000) == "x / 5"


def test_grafana_rounds_the_query_interval() -> None:
    ten_minutes = TimeRange(0, 600 * 10**9)
    assert interval_ms(ten_minutes) == 500  # 600 ms raw
    assert interval_ms(ten_minutes, 100) == 5_000  # 6 s raw
    assert interval_ms(TimeRange(0, 86_400 * 10**9)) == 60_000  # 86.4 s raw


@pytest.mark.parametrize(
    ("sql", "reason"),
    [
        ("WHERE $__timeFilterr(time)", "unknown macro $__timeFilterr"),
        ("WHERE $__timeFilter(a, b)", "$__timeFilter expects 1 argument(s), got 2"),
        ("WHERE $__timeFilter", "$__timeFilter expects 1 argument(s), got 0"),
        ("WHERE $__timeFilter(f(x)", "unbalanced parentheses"),
    ],
)
def test_bad_macros_are_named(sql: str, reason: str) -> None:
    with pytest.raises(ExpansionError, match=re.escape(reason)):
        expand_macros(sql, RNG, 1000)


def test_variables_are_formatted_like_the_plugin_and_grafana() -> None:
    flow = Variable("flow", ["a:1 > b:2 / 17"], multi=False)
    nodes = Variable("node", ["node-a", "node-b"], multi=True, is_all=True)
    one = Variable("one", ["it's"], multi=True)
    vs = {"flow": flow, "node": nodes, "one": one}
    # single value raw, multi-value as a quoted list (CHDatasource.format)
    assert interpolate("k = '${flow}' AND n IN ($node)", vs, RNG, 1000) == (
        "k = 'a:1 > b:2 / 17' AND n IN ('node-a','node-b')"
    )
    assert interpolate("n IN (${node:singlequote}) [[flow]]", vs, RNG, 1000) == (
        "n IN ('node-a','node-b') a:1 > b:2 / 17"
    )
    assert interpolate("${one:singlequote} ${node:csv}", vs, RNG, 1000) == (
        "'it\\'s' node-a,node-b"
    )
    # Grafana's own variables; the plugin's macros are left for the backend
    assert interpolate("$__from $__to $__interval_ms $__timeFilter(t)", vs, RNG, 500) == (
        "1749999600250 1750000200999 500 $__timeFilter(t)"
    )
    with_all = {"node": Variable("node", ["x"], multi=True, all_value="ANY", is_all=True)}
    assert interpolate("$node", with_all, RNG, 1000) == "ANY"
    with pytest.raises(ExpansionError, match=r"unknown variable \$flw"):
        interpolate("k = '${flw}'", vs, RNG, 1000)
