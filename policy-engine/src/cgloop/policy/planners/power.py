"""Power planner: the X-MAN parameters node agents get (Xiang thesis ch. 4).

The policy engine does not run X-MAN; the node agent's power manager does (micro loop). This
planner decides, per node, which cores run which X-MAN mode within which frequency limits:
* latency-critical cores (they carry gaming flows or advanced functions) are pinned to the
  maximum frequency and must never enter C-states: §4.4 measured C1 sleep adding 137 % latency,
  so the agent is told to keep them in C0 (`allow_cstates=False`);
* other packet-processing cores run X-MAN Algorithm 1 (`load`) or X-MAN-FB (`feedback`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

XMAN_MODES = {"off": 1, "load": 2, "feedback": 3, "pinned_max": 4}  # cgloop.v1.XmanMode


@dataclass(frozen=True)
class CorePolicy:
    cores: tuple[int, ...]
    governor: str
    min_frequency_khz: int
    max_frequency_khz: int
    xman_mode: str
    allow_cstates: bool


def plan_power(
    cores: Iterable[int],
    latency_critical: Iterable[int],
    min_khz: int,
    max_khz: int,
    mode: str = "load",
) -> list[CorePolicy]:
    if mode not in XMAN_MODES:
        raise ValueError(f"unknown X-MAN mode {mode!r}; one of {', '.join(XMAN_MODES)}")
    if not 0 < min_khz <= max_khz:
        raise ValueError("need 0 < min_khz <= max_khz")
    all_cores = sorted(set(cores))
    critical = sorted(set(latency_critical))
    unknown = set(critical) - set(all_cores)
    if unknown:
        raise ValueError(f"latency-critical cores {sorted(unknown)} are not among the cores")
    out = []
    if critical:
        pinned = CorePolicy(tuple(critical), "performance", max_khz, max_khz, "pinned_max", False)
        out.append(pinned)
    rest = [c for c in all_cores if c not in critical]
    if rest:
        out.append(CorePolicy(tuple(rest), "userspace", min_khz, max_khz, mode, True))
    return out
