"""The dashboards' latency objective, from the SLO table (cgloop.slo).

The NOC overview's `slo` variable picks what gaming flows are judged against: `platform` (the
default: each flow against its own platform's objective, as the analytics' SLO detector judges
it) or a deployment profile (`lab`: the loop's objective for every flow). `latency_ms_sql`
writes that choice as one ClickHouse expression, with the table's numbers in it.
"""

from __future__ import annotations

from cgloop.dashboards.panels import custom_variable
from cgloop.slo import GENERIC, SloTable
from cgloop.slo import table as slo_table
from grafana_foundation_sdk.builders import dashboard as db

VARIABLE = "slo"
#: The variable's value that judges each flow by its platform's objective.
PER_PLATFORM = "platform"


def choices(table: SloTable | None = None) -> list[str]:
    """The variable's values: per platform first (the default), then each deployment profile
    that sets a latency objective."""
    t = table or slo_table()
    return [PER_PLATFORM, *sorted(n for n, d in t.deployments.items() if d.latency_ms is not None)]


def variable(table: SloTable | None = None) -> db.CustomVariable:
    return custom_variable(VARIABLE, "gaming latency SLO (the SLO table's)", choices(table))


def _ms(x: float) -> str:
    return repr(float(x))  # a Float64 literal: transform() wants one type for every branch


def platform_latency_ms_sql(platform: str = "platform", table: SloTable | None = None) -> str:
    """The latency objective (ms) of the flow's own platform (`generic`'s for a platform without
    a profile), with no dashboard variable: what the alert rules judge by."""
    t = table or slo_table()
    names = sorted(n for n in t.platforms if n != GENERIC)
    return (
        f"transform({platform}, [{', '.join(repr(n) for n in names)}],"
        f" [{', '.join(_ms(t.platforms[n].latency_ms) for n in names)}],"
        f" {_ms(t.platforms[GENERIC].latency_ms)})"
    )


def thresholds(table: SloTable | None = None) -> list[tuple[str, float]]:
    """(platform, latency objective ms) for each platform with a profile, `generic` last."""
    t = table or slo_table()
    names = [*sorted(n for n in t.platforms if n != GENERIC), GENERIC]
    return [(n, t.platforms[n].latency_ms) for n in names]


def latency_ms_sql(platform: str = "platform", table: SloTable | None = None) -> str:
    """The latency objective (ms) of a gaming flow whose platform label is the column
    `platform`, under the variable's choice."""
    t = table or slo_table()
    per_platform = platform_latency_ms_sql(platform, t)
    profiles = [
        f"'${{{VARIABLE}}}' = {name!r}, {_ms(t.latency_ms(name))}" for name in choices(t)[1:]
    ]
    if not profiles:
        return per_platform
    return f"multiIf({', '.join(profiles)}, {per_platform})"
