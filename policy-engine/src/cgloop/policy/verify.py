"""Verifying: did an applied action achieve its expected effect? Pure.

`judge` compares the metric read after the action with the expected value and with the
baseline read before it: IMPROVED when the expectation holds, WORSE when the metric moved the
wrong way by more than the tolerance, NO_EFFECT otherwise, NOT_CHECKED without samples after
the action. The engine reads the telemetry, decides when to conclude, and rolls back the
verdicts its policy names (`rollback_verdicts`).

`judge_power` verifies a set_power_policy by what its agent reads back (GetPowerState): each
core's frequency limits and governor as the X-MAN plan set them, and, where the plan forbids
C-states, every cpuidle state but POLL disabled. The metric `agent.power_state` is the share of
the plan's cores read back as set (1 = all). When the agent says its cpufreq/cpuidle tree is
emulated (a VM without cpufreq: the lab), the detail says so.
"""

from __future__ import annotations

from cgloop.policy.model import Policy, Verdict
from cgloop.policy.telemetry import Reading
from cgloop.v1 import action_pb2 as apb
from cgloop.v1 import node_agent_pb2 as na

VERDICT = {Verdict.WORSE: apb.VERDICT_WORSE, Verdict.NO_EFFECT: apb.VERDICT_NO_EFFECT}
LOWER_IS_BETTER = (apb.COMPARATOR_LESS_THAN, apb.COMPARATOR_LESS_OR_EQUAL)


def holds(e: apb.ExpectedEffect, value: float) -> bool:
    """`value comparator expected` (an unspecified comparator never holds)."""
    return {
        apb.COMPARATOR_LESS_THAN: value < e.value,
        apb.COMPARATOR_LESS_OR_EQUAL: value <= e.value,
        apb.COMPARATOR_GREATER_THAN: value > e.value,
        apb.COMPARATOR_GREATER_OR_EQUAL: value >= e.value,
    }.get(e.comparator, False)


def judge(
    e: apb.ExpectedEffect, before: Reading | None, after: Reading | None, tolerance: float
) -> apb.Verification:
    v = apb.Verification(metric=e.metric)
    if before is not None:
        v.before_value = before.value
        if before.latency is not None:
            v.latency_before.CopyFrom(before.latency)
    if after is None:
        v.verdict = apb.VERDICT_NOT_CHECKED
        v.detail = f"no {e.metric} samples after the action"
        return v
    v.after_value = after.value
    if after.latency is not None:
        v.latency_after.CopyFrom(after.latency)
    worse = before is not None and (
        after.value > before.value * (1 + tolerance)
        if e.comparator in LOWER_IS_BETTER
        else after.value < before.value * (1 - tolerance)
    )
    v.verdict = (
        apb.VERDICT_IMPROVED
        if holds(e, after.value)
        else apb.VERDICT_WORSE
        if worse
        else apb.VERDICT_NO_EFFECT
    )
    b = f"{before.value:g}" if before is not None else "n/a"
    v.detail = f"{e.metric}: before {b}, after {after.value:g}, expected {e.value:g}"
    return v


def rollback_verdicts(policy: Policy | None) -> set[int]:
    """The verdicts its policy rolls an action back on (none when the policy is gone)."""
    return {VERDICT[v] for v in policy.action.rollback_on} if policy else set()


POWER_READBACK = "agent.power_state"


def _emulated(state: na.GetPowerStateResponse) -> bool:
    # The agent's word that its roots are not the kernel's sysfs (the lab's emulated tree).
    return state.emulated


def judge_power(
    policies: list[na.PowerPolicy], state: na.GetPowerStateResponse
) -> apb.Verification:
    """The plan's cores as read back: IMPROVED when every core is as set, NO_EFFECT otherwise
    (the detail names each core that differs and how)."""
    cores = {c.core: c for c in state.cores}
    idle = {i.core: i for i in state.idle}
    wrong: list[str] = []
    total = 0
    for p in policies:
        for core in p.cores:
            total += 1
            c = cores.get(core)
            if c is None:
                wrong.append(f"core {core}: not read back")
                continue
            got = (c.min_frequency_khz, c.max_frequency_khz)
            if got != (p.min_frequency_khz, p.max_frequency_khz):
                wrong.append(
                    f"core {core}: limits {got[0]}..{got[1]} kHz, set "
                    f"{p.min_frequency_khz}..{p.max_frequency_khz}"
                )
            elif p.governor and c.governor and c.governor != p.governor:
                wrong.append(f"core {core}: governor {c.governor}, set {p.governor}")
            elif p.forbid_cstates and not (core in idle and idle[core].cstates_forbidden):
                states = ",".join(idle[core].enabled_idle_states) if core in idle else "unread"
                wrong.append(f"core {core}: C-states not forbidden (enabled: {states})")
    ok = total - len(wrong)
    v = apb.Verification(
        metric=POWER_READBACK,
        after_value=ok / total if total else 0.0,
        verdict=apb.VERDICT_IMPROVED if total and not wrong else apb.VERDICT_NO_EFFECT,
    )
    summary = "; ".join(
        f"cores {','.join(map(str, p.cores))}: {p.min_frequency_khz}..{p.max_frequency_khz} kHz "
        f"{p.governor or '-'}{', C-states off' if p.forbid_cstates else ''}"
        for p in policies
    )
    v.detail = (
        f"read back from the agent (GetPowerState): {ok}/{total} cores as set ({summary})"
        + (f"; differs: {'; '.join(wrong)}" if wrong else "")
        + ("; the agent's cpufreq/cpuidle tree is emulated (no cpufreq on this host)"
           if _emulated(state) else "")
    )
    return v
