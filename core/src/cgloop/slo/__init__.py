"""cgloop's service objectives (SLOs) for cloud-gaming flows, declared once.

The numbers live in `objectives.toml` beside this module, each with its source: one profile per
cloud-gaming platform (`gfn`, `std`, `psn`, `xc`, and `generic` for any other) and named
deployment profiles (`lab`) whose fields replace the platforms' where set. Everything that
judges a gaming flow against an objective reads it here: the analytics' SLO detector, the loop
(its probes, the policies it renders, its report), the lab's traffic profiles, the policy
engine's checks and the dashboards.

    >>> from cgloop.slo import table
    >>> table().objectives("gfn").latency_ms
    100.0
    >>> table().objectives("gfn", deployment="lab").latency_ms
    20.0
"""

from __future__ import annotations

import tomllib
from functools import cache
from importlib import resources
from pathlib import Path

from cgloop.errors import CgloopError
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

#: The profile of a gaming flow whose platform has no profile of its own.
GENERIC = "generic"
#: The lab's deployment profile (make run, cgloop run, the end-to-end test, the benchmark).
LAB = "lab"
#: The file the table is read from, inside this package.
TABLE_FILE = "objectives.toml"


class Objectives(BaseModel):
    """A platform's objectives: all four are set."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    title: str = Field(min_length=1, description="who the objectives are for")
    latency_ms: float = Field(gt=0, le=10_000, description="p99 latency, ms")
    jitter_ms: float = Field(gt=0, le=10_000, description="RFC 3550 jitter, ms")
    loss: float = Field(gt=0, lt=1, description="fraction of packets lost")
    min_down_mbps: float = Field(gt=0, le=100_000, description="downstream rate to keep, Mbit/s")
    source: str = Field(min_length=1, description="where the numbers come from")

    @property
    def latency_ns(self) -> int:
        return round(self.latency_ms * 1_000_000)


class Override(BaseModel):
    """A deployment's objectives: the fields it sets replace every platform's."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    title: str = Field(min_length=1)
    latency_ms: float | None = Field(default=None, gt=0, le=10_000)
    jitter_ms: float | None = Field(default=None, gt=0, le=10_000)
    loss: float | None = Field(default=None, gt=0, lt=1)
    min_down_mbps: float | None = Field(default=None, gt=0, le=100_000)
    source: str = Field(min_length=1)

    @property
    def latency_ns(self) -> int | None:
        return None if self.latency_ms is None else round(self.latency_ms * 1_000_000)

    def set_fields(self) -> dict[str, float]:
        return {
            k: v for k in ("latency_ms", "jitter_ms", "loss", "min_down_mbps")
            if (v := getattr(self, k)) is not None
        }  # fmt: skip


class SloTable(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    platforms: dict[str, Objectives]
    deployments: dict[str, Override] = {}

    @model_validator(mode="after")
    def _names(self) -> SloTable:
        if GENERIC not in self.platforms:
            raise ValueError(f"platforms: no `{GENERIC}` profile (for platforms without one)")
        both = sorted(set(self.platforms) & set(self.deployments))
        if both:
            raise ValueError(f"{', '.join(both)}: both a platform and a deployment")
        for name, d in self.deployments.items():
            if not d.set_fields():
                raise ValueError(f"deployments.{name}: sets no objective")
        return self

    def platform(self, name: str) -> Objectives:
        """The platform's objectives; a platform without a profile gets `generic`'s."""
        return self.platforms.get(name) or self.platforms[GENERIC]

    def deployment(self, name: str) -> Override:
        try:
            return self.deployments[name]
        except KeyError:
            raise CgloopError(
                f"no SLO deployment profile {name!r} (known: {', '.join(sorted(self.deployments))})"
            ) from None

    def latency_ms(self, deployment: str) -> float:
        """A deployment's latency objective (what the loop defends); one it does not set is an
        error naming the profile."""
        latency = self.deployment(deployment).latency_ms
        if latency is None:
            raise CgloopError(f"SLO deployment profile {deployment!r} sets no latency objective")
        return latency

    def objectives(self, platform: str, deployment: str | None = None) -> Objectives:
        """What a gaming flow of `platform` is held to, under `deployment`'s profile if given."""
        base = self.platform(platform)
        if deployment is None:
            return base
        d = self.deployment(deployment)
        return base.model_copy(update={**d.set_fields(), "title": f"{base.title} ({d.title})"})


def load(path: Path) -> SloTable:
    """Read and validate an SLO table; bad input raises CgloopError naming the file and field."""
    try:
        raw = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise CgloopError(f"{path}: cannot read the SLO table: {e}") from None
    try:
        return SloTable.model_validate(raw)
    except ValidationError as e:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or '(top)'}: {err['msg']}" for err in e.errors()
        )
        raise CgloopError(f"{path}: invalid SLO table: {problems}") from None


def table_path() -> Path:
    return Path(str(resources.files(__name__) / TABLE_FILE))


@cache
def table() -> SloTable:
    """The packaged table (read once)."""
    return load(table_path())
