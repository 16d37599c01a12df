"""Run every query of the provisioned dashboards against a store, as Grafana would.

No Grafana server runs here, so this does Grafana's two expansion steps itself and sends the
result to the store (any ClickHouse HTTP endpoint: the embedded store or a ClickHouse server):

1. Template variables, as the plugin's frontend does (`applyTemplateVariables` in
   src/data/CHDatasource.ts of grafana/clickhouse-datasource): Grafana's templateSrv.replace with
   the plugin's formatter (a multi-value becomes `'a','b'`, a single value is inserted raw;
   `${var:singlequote}`, `:csv`, `:raw` override it), Grafana's own `$__from`, `$__to`,
   `$__interval_ms`, `$__range_s`. Query variables are resolved by running their query.
2. The plugin's backend macros (pkg/macros/macros.go, the `Macros` map): `$__timeFilter(c)` is
   `c >= toDateTime(from_s) AND c <= toDateTime(to_s)`, `$__timeFilter_ms(c)` the same with
   `fromUnixTimestamp64Milli(ms)`, `$__fromTime`/`$__toTime` (`toDateTime(s)`),
   `$__fromTime_ms`/`$__toTime_ms`, `$__dateFilter(c)` (`toDate('YYYY-MM-DD')`),
   `$__dateTimeFilter(d, t)` / `$__dt`, `$__timeInterval(c)` =
   `toStartOfInterval(toDateTime(c), INTERVAL s second)` with s = max(interval, 1 s),
   `$__timeInterval_ms(c)`, `$__interval_s`. Any other `$__name` is reported, not guessed.

The query interval is Grafana's: (to - from) / max data points (the panel's `maxDataPoints`, else
1000, about a full-width panel), rounded like rangeutil.roundInterval.

A panel is a problem when a query fails, when a macro or variable cannot be expanded, or when it
returns no rows, unless its (dashboard uid, title) is in `allow_empty` (build.OPTIONAL_PANELS).
A dashboard's annotation queries run too and must return `time` and `text` columns (no rows is
fine: the loop may not have acted).

`check_rules` does the same for the provisioned alert rules (alerts.py): each ClickHouse query
runs over its rule's relativeTimeRange ending at the given time, with the plugin's macros and no
dashboard variables (a rule has none), and must have the shape Grafana's alerting reads from an
SQL data source: exactly one numeric column (the value) and otherwise string columns (labels).
Rules against other data sources (Prometheus) are checked for a query and the uid alerts.py names.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal, TypeVar

import httpx
from cgloop.dashboards.alerts import PROMETHEUS_UID, RULES_FILE
from cgloop.dashboards.build import OPTIONAL_PANELS, PROVISIONED, render
from cgloop.dashboards.clickhouse import DATASOURCE_UID
from pydantic import BaseModel

T = TypeVar("T")

DEFAULT_MAX_DATA_POINTS = 1000
ALL = "$__all"


class Problem(BaseModel):
    """One thing that would be wrong on a dashboard in Grafana."""

    dashboard: str  # title
    uid: str
    panel: str  # panel title, or `variable NAME`
    kind: Literal["error", "empty", "macro", "variable", "shape"]
    message: str
    sql: str = ""

    def __str__(self) -> str:
        return f"{self.dashboard} / {self.panel}: {self.kind}: {self.message}"


class ExpansionError(ValueError):
    pass


# ----------------------------------------------------------------------------- time range


@dataclass(frozen=True)
class TimeRange:
    from_ns: int
    to_ns: int

    @property
    def from_s(self) -> int:  # Go's time.Unix(): whole seconds, rounded down
        return self.from_ns // 1_000_000_000

    @property
    def to_s(self) -> int:
        return self.to_ns // 1_000_000_000

    @property
    def from_ms(self) -> int:
        return self.from_ns // 1_000_000

    @property
    def to_ms(self) -> int:
        return self.to_ns // 1_000_000


# Grafana's rangeutil.roundInterval: (upper bound of the raw interval in ms, interval in ms).
_ROUND = [
    (10, 1),
    (15, 10),
    (35, 20),
    (75, 50),
    (150, 100),
    (350, 200),
    (750, 500),
    (1_500, 1_000),
    (3_500, 2_000),
    (7_500, 5_000),
    (12_500, 10_000),
    (17_500, 15_000),
    (25_000, 20_000),
    (45_000, 30_000),
    (90_000, 60_000),
    (210_000, 120_000),
    (450_000, 300_000),
    (750_000, 600_000),
    (1_050_000, 900_000),
    (1_500_000, 1_200_000),
    (2_700_000, 1_800_000),
    (5_400_000, 3_600_000),
    (9_000_000, 7_200_000),
    (16_200_000, 10_800_000),
    (32_400_000, 21_600_000),
    (86_400_000, 43_200_000),
    (604_800_000, 86_400_000),
    (1_814_400_000, 604_800_000),
    (3_628_800_000, 2_592_000_000),
]


def interval_ms(rng: TimeRange, max_data_points: int = DEFAULT_MAX_DATA_POINTS) -> int:
    raw = (rng.to_ms - rng.from_ms) / max(max_data_points, 1)
    for bound, step in _ROUND:
        if raw <= bound:
            return step
    return 31_536_000_000


# ----------------------------------------------------------------------------- macros


def _split_args(text: str) -> list[str]:
    """Arguments of a macro call: top-level commas, outside quotes and parentheses."""
    args, depth, start, i = [], 0, 0, 0
    while i < len(text):
        c = text[i]
        if c in "'\"`":
            end = text.find(c, i + 1)
            i = len(text) if end < 0 else end + 1
            continue
        if c == "(":
            depth += 1
        elif c == ")":
            depth -= 1
        elif c == "," and depth == 0:
            args.append(text[start:i].strip())
            start = i + 1
        i += 1
    last = text[start:].strip()
    return [*args, last] if (args or last) else []


def _closing_paren(sql: str, open_at: int) -> int:
    depth, i = 0, open_at
    while i < len(sql):
        c = sql[i]
        if c in "'\"`":
            end = sql.find(c, i + 1)
            if end < 0:
                break
            i = end + 1
            continue
        if c == "(":
            depth += 1
        elif c == ")":
            depth -= 1
            if depth == 0:
                return i
        i += 1
    raise ExpansionError(f"unbalanced parentheses after position {open_at}")


def _date(s: int) -> str:
    return f"toDate('{datetime.fromtimestamp(s, UTC):%Y-%m-%d}')"


def _macros(rng: TimeRange, step_ms: int) -> dict[str, tuple[int, Callable[[list[str]], str]]]:
    """name -> (argument count, expansion), after pkg/macros/macros.go."""
    dt = lambda s: f"toDateTime({s})"  # noqa: E731
    dt64 = lambda ms: f"fromUnixTimestamp64Milli({ms})"  # noqa: E731
    seconds = max(step_ms // 1000, 1)
    return {
        "fromTime": (0, lambda a: dt(rng.from_s)),
        "toTime": (0, lambda a: dt(rng.to_s)),
        "fromTime_ms": (0, lambda a: dt64(rng.from_ms)),
        "toTime_ms": (0, lambda a: dt64(rng.to_ms)),
        "timeFilter": (
            1,
            lambda a: f"{a[0]} >= {dt(rng.from_s)} AND {a[0]} <= {dt(rng.to_s)}",
        ),
        "timeFilter_ms": (
            1,
            lambda a: f"{a[0]} >= {dt64(rng.from_ms)} AND {a[0]} <= {dt64(rng.to_ms)}",
        ),
        "dateFilter": (
            1,
            lambda a: f"{a[0]} >= {_date(rng.from_s)} AND {a[0]} <= {_date(rng.to_s)}",
        ),
        "dateTimeFilter": (
            2,
            lambda a: (
                f"({a[0]} >= {_date(rng.from_s)} AND {a[0]} <= {_date(rng.to_s)}) AND"
                f" ({a[1]} >= {dt(rng.from_s)} AND {a[1]} <= {dt(rng.to_s)})"
            ),
        ),
        "timeInterval": (
            1,
            lambda a: f"toStartOfInterval(toDateTime({a[0]}), INTERVAL {seconds} second)",
        ),
        "timeInterval_ms": (
            1,
            lambda a: (
                f"toStartOfInterval(toDateTime64({a[0]}, 3),"
                f" INTERVAL {max(step_ms, 1)} millisecond)"
            ),
        ),
        "interval_s": (0, lambda a: str(seconds)),
    }


_MACRO = re.compile(r"\$__(\w+)")


def expand_macros(sql: str, rng: TimeRange, step_ms: int) -> str:
    """The plugin's backend macro expansion; raises ExpansionError naming what is wrong."""
    table = _macros(rng, step_ms)
    table["dt"] = table["dateTimeFilter"]
    out, pos = [], 0
    for m in _MACRO.finditer(sql):
        if m.start() < pos:  # inside the arguments of a macro already expanded
            continue
        name = m.group(1)
        if name not in table:
            raise ExpansionError(f"unknown macro $__{name}")
        count, expand = table[name]
        end = m.end()
        args: list[str] = []
        if end < len(sql) and sql[end] == "(":
            close = _closing_paren(sql, end)
            args = _split_args(sql[end + 1 : close])
            end = close + 1
        if len(args) != count:
            raise ExpansionError(f"$__{name} expects {count} argument(s), got {len(args)}")
        out.append(sql[pos : m.start()])
        out.append(expand(args))
        pos = end
    out.append(sql[pos:])
    return "".join(out)


# ----------------------------------------------------------------------------- variables

# Grafana's variable syntax (templateSrv's variableRegex): $name, [[name:fmt]], ${name:fmt}.
_VAR = re.compile(r"\$(\w+)|\[\[(\w+?)(?::(\w+))?\]\]|\$\{(\w+)(?:\.([^:^}]+))?(?::([^}]+))?\}")


@dataclass
class Variable:
    name: str
    values: list[str]  # what is selected (several for a multi-value or All)
    multi: bool
    all_value: str | None = None  # the custom "All" value, inserted raw
    is_all: bool = False


def _plugin_format(v: Variable) -> str:
    """CHDatasource.format: arrays as 'a','b', single values raw."""
    if v.multi or v.is_all:
        return "'" + "','".join(v.values) + "'"
    return v.values[0] if v.values else ""


def _format(v: Variable, fmt: str | None) -> str:
    if v.is_all and v.all_value is not None:
        return v.all_value
    if fmt is None:
        return _plugin_format(v)
    if fmt == "singlequote":
        return ",".join("'" + x.replace("'", "\\'") + "'" for x in v.values)
    if fmt == "doublequote":
        return ",".join('"' + x.replace('"', '\\"') + '"' for x in v.values)
    if fmt == "csv":
        return ",".join(v.values)
    if fmt == "raw":
        return ",".join(v.values)
    if fmt == "sqlstring":
        return ",".join("'" + x.replace("'", "''") + "'" for x in v.values)
    raise ExpansionError(f"variable format :{fmt} is not supported by this check")


def _builtins(rng: TimeRange, step_ms: int) -> dict[str, str]:
    return {
        "__from": str(rng.from_ms),
        "__to": str(rng.to_ms),
        "__interval_ms": str(step_ms),
        "__range_s": str((rng.to_ms - rng.from_ms) // 1000),
    }


def interpolate(sql: str, variables: dict[str, Variable], rng: TimeRange, step_ms: int) -> str:
    builtins = _builtins(rng, step_ms)

    def sub(m: re.Match[str]) -> str:
        name = m.group(1) or m.group(2) or m.group(4)
        fmt = m.group(3) or m.group(6)
        if name in variables:
            return _format(variables[name], fmt)
        if name in builtins:
            return builtins[name]
        if name.startswith("__"):
            return m.group(0)  # a plugin macro: the backend expands it
        raise ExpansionError(f"unknown variable ${name}")

    return _VAR.sub(sub, sql)


# ----------------------------------------------------------------------------- store


class Store:
    def __init__(self, url: str, timeout_s: float = 60) -> None:
        self.url, self.client = url, httpx.Client(timeout=timeout_s)

    def rows(self, sql: str) -> list[list[Any]]:
        return self.result(sql)[1]

    def result(self, sql: str) -> tuple[list[tuple[str, str]], list[list[Any]]]:
        """((column name, ClickHouse type) of each column, rows)."""
        reply = self.client.post(
            self.url, params={"default_format": "JSONCompact"}, content=sql.encode()
        )
        if reply.status_code != 200:
            raise RuntimeError(reply.text.strip()[:2000])
        body = json.loads(reply.text)
        return [(c["name"], c["type"]) for c in body["meta"]], body["data"]

    def close(self) -> None:
        self.client.close()


# ----------------------------------------------------------------------------- dashboards


def _resolve(
    model: dict[str, Any], store: Store, rng: TimeRange, problems: list[Problem]
) -> dict[str, Variable]:
    """Each variable's selected value(s), in dashboard order (later ones may use earlier ones)."""
    variables: dict[str, Variable] = {}
    step = interval_ms(rng)
    for var in model.get("templating", {}).get("list", []):
        name, kind = var["name"], var.get("type")
        current = (var.get("current") or {}).get("value")
        multi = bool(var.get("multi"))

        def fail(message: str, sql: str = "", name: str = name) -> None:
            problems.append(
                Problem(
                    dashboard=model["title"],
                    uid=model["uid"],
                    panel=f"variable {name}",
                    kind="variable",
                    message=message,
                    sql=sql,
                )
            )

        if kind == "query":
            sql = ""
            try:
                raw = var["query"] if isinstance(var["query"], str) else var["query"]["rawSql"]
                sql = expand_macros(interpolate(raw, variables, rng, step), rng, step)
                rows = store.rows(sql)
            except (ExpansionError, RuntimeError) as exc:
                fail(str(exc), sql)
                rows = []
            # metricFindQuery: one column is the value; with more, the first is the value.
            options = [str(r[0]) for r in rows]
            if not options and sql:
                fail("its query returned no values", sql)
        elif kind == "custom":
            options = [o.strip() for o in re.split(r"(?<!\\),", var.get("query", "")) if o.strip()]
        elif kind in ("textbox", "constant"):
            options = [str(var.get("query", ""))]
        else:
            fail(f"variable type {kind!r} is not supported by this check")
            options = []
        is_all = bool(var.get("includeAll")) and (current == ALL or current == [ALL])
        if is_all:
            selected = options
        else:
            wanted = current if isinstance(current, list) else [current]
            selected = [w for w in wanted if w in options] or options[:1]
        variables[name] = Variable(name, selected, multi, var.get("allValue") or None, is_all)
    return variables


def _run(
    raw: str,
    variables: dict[str, Variable],
    rng: TimeRange,
    step: int,
    query: Callable[[str], T],
    report: Callable[[str, str, str], None],
) -> tuple[T | None, str]:
    """`raw` with its variables and macros expanded as Grafana would, run by `query`; a macro
    that cannot expand or a query the store refuses is reported. (result or None, the SQL)."""
    try:
        sql = expand_macros(interpolate(raw, variables, rng, step), rng, step)
    except ExpansionError as exc:
        report("macro", str(exc), raw)
        return None, raw
    try:
        return query(sql), sql
    except RuntimeError as exc:
        report("error", str(exc), sql)
        return None, sql


def _panels(model: dict[str, Any]) -> Iterable[dict[str, Any]]:
    for panel in model.get("panels", []):
        yield panel
        yield from panel.get("panels", [])  # collapsed rows


def check_model(
    model: dict[str, Any],
    store: Store,
    rng: TimeRange,
    allow_empty: Collection[tuple[str, str]] = (),
) -> list[Problem]:
    problems: list[Problem] = []
    variables = _resolve(model, store, rng, problems)
    for panel in _panels(model):
        targets = panel.get("targets") or []
        if panel.get("type") == "row" or not targets:
            continue
        step = interval_ms(rng, int(panel.get("maxDataPoints") or DEFAULT_MAX_DATA_POINTS))
        try:
            title = interpolate(panel.get("title", ""), variables, rng, step)
        except ExpansionError:
            title = panel.get("title", "")

        def report(kind: str, message: str, sql: str, title: str = title) -> None:
            problems.append(
                Problem(
                    dashboard=model["title"],
                    uid=model["uid"],
                    panel=title,
                    kind=kind,  # type: ignore[arg-type]
                    message=message,
                    sql=sql,
                )
            )

        for target in targets:
            if (target.get("datasource") or {}).get("uid") == PROMETHEUS_UID:
                continue  # PromQL: its metric names are checked against the daemons' sources
            rows, sql = _run(target.get("rawSql", ""), variables, rng, step, store.rows, report)
            if rows is None:
                continue
            if not rows and (model["uid"], panel.get("title", "")) not in allow_empty:
                report("empty", f"query {target.get('refId', '')} returned no rows", sql)
    problems.extend(_check_annotations(model, variables, store, rng))
    return problems


ANNOTATION_COLUMNS = {"time", "text"}


def _check_annotations(
    model: dict[str, Any], variables: dict[str, Variable], store: Store, rng: TimeRange
) -> list[Problem]:
    problems: list[Problem] = []
    step = interval_ms(rng)
    for ann in (model.get("annotations") or {}).get("list", []):
        raw = (ann.get("target") or {}).get("rawSql")
        if raw is None:
            continue  # Grafana's own annotations (no query of ours)

        def report(kind: str, message: str, sql: str, name: str = ann.get("name", "")) -> None:
            problems.append(
                Problem(
                    dashboard=model["title"],
                    uid=model["uid"],
                    panel=f"annotation {name}",
                    kind=kind,  # type: ignore[arg-type]
                    message=message,
                    sql=sql,
                )
            )

        result, sql = _run(raw, variables, rng, step, store.result, report)
        if result is None:
            continue
        columns, _ = result
        missing = ANNOTATION_COLUMNS - {name for name, _ in columns}
        if missing:
            report("shape", f"no {', '.join(sorted(missing))} column(s)", sql)
    return problems


# ----------------------------------------------------------------------------- alert rules

_NUMERIC = re.compile(r"^(Nullable\()?(U?Int\d+|Float\d+|Decimal.*)\)?$")
_LABEL = re.compile(r"^(Nullable\(|LowCardinality\()*(String|FixedString\(\d+\))\)*$")
#: Grafana alerting's default query interval for a rule (intervalMs).
ALERT_INTERVAL_MS = 1000


def alert_shape(columns: list[tuple[str, str]]) -> str | None:
    """What is wrong with an SQL result for Grafana alerting, or None: one numeric column (the
    value) and string columns (the labels of each row's series)."""
    numeric = [n for n, t in columns if _NUMERIC.match(t)]
    other = [f"{n} ({t})" for n, t in columns if not _NUMERIC.match(t) and not _LABEL.match(t)]
    if len(numeric) != 1:
        return f"{len(numeric)} numeric columns ({', '.join(numeric) or 'none'}); alerting needs 1"
    if other:
        return f"columns neither numeric nor string: {', '.join(other)}"
    return None


def load_rules(folder: Path = PROVISIONED) -> dict[str, Any]:
    return json.loads((folder / RULES_FILE).read_text())  # JSON, which YAML parsers read too


def check_rule(rule: dict[str, Any], store: Store, to_ns: int) -> list[Problem]:
    problems: list[Problem] = []

    def report(kind: str, message: str, sql: str = "") -> None:
        problems.append(
            Problem(
                dashboard="alert rules",
                uid=rule.get("uid", ""),
                panel=rule.get("title", ""),
                kind=kind,  # type: ignore[arg-type]
                message=message,
                sql=sql,
            )
        )

    refs = {q.get("refId") for q in rule.get("data", [])}
    if rule.get("condition") not in refs:
        report("shape", f"condition {rule.get('condition')!r} is none of the queries {refs}")
    for query in rule.get("data", []):
        uid, model = query.get("datasourceUid"), query.get("model", {})
        if uid == "__expr__":
            if model.get("expression") not in refs:
                report("shape", f"expression {query.get('refId')} reads an unknown query")
            continue
        if uid == PROMETHEUS_UID:
            if not model.get("expr"):
                report("shape", f"query {query.get('refId')} has no PromQL expr")
            continue
        if uid != DATASOURCE_UID:
            report("shape", f"query {query.get('refId')}: unknown data source uid {uid!r}")
            continue
        window = query.get("relativeTimeRange", {})
        rng = TimeRange(
            to_ns - int(window.get("from", 0)) * 1_000_000_000,
            to_ns - int(window.get("to", 0)) * 1_000_000_000,
        )
        result, sql = _run(
            model.get("rawSql", ""), {}, rng, ALERT_INTERVAL_MS, store.result, report
        )
        if result is None:
            continue
        columns, _ = result
        wrong = alert_shape(columns)
        if wrong:
            report("shape", wrong, sql)
    return problems


def check_rules(store_url: str, to_ns: int, folder: Path | None = None) -> list[Problem]:
    """Every problem of the provisioned alert rules, evaluated as if at `to_ns`."""
    store = Store(store_url)
    try:
        provisioned = load_rules(folder or PROVISIONED)
        return [
            p
            for group in provisioned.get("groups", [])
            for rule in group.get("rules", [])
            for p in check_rule(rule, store, to_ns)
        ]
    finally:
        store.close()


def load(folder: Path = PROVISIONED) -> list[dict[str, Any]]:
    return [json.loads(p.read_text()) for p in sorted(folder.glob("*.json"))]


def check_dashboards(
    store_url: str,
    time_from_ns: int,
    time_to_ns: int,
    folder: Path | None = None,
    allow_empty: Collection[tuple[str, str]] | None = None,
) -> list[Problem]:
    """Every problem of every provisioned dashboard over [time_from_ns, time_to_ns]."""
    if allow_empty is None:
        render()  # fills OPTIONAL_PANELS from the dashboards' code
        allow_empty = set(OPTIONAL_PANELS)
    rng = TimeRange(time_from_ns, time_to_ns)
    store = Store(store_url)
    try:
        problems: list[Problem] = []
        for model in load(folder or PROVISIONED):
            problems.extend(check_model(model, store, rng, allow_empty))
        return problems
    finally:
        store.close()
