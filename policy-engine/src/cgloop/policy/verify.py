"""Verifying: did an applied action achieve its expected effect? Pure.

`judge` compares the metric read after the action with the expected value and with the
baseline read before it: IMPROVED when the expectation holds, WORSE when the metric moved the
wrong way by more than the tolerance, NO_EFFECT otherwise, NOT_CHECKED without samples after
the action. The engine reads the telemetry, decides when to conclude, and rolls back the
verdicts its policy names (`rollback_verdicts`).
"""

from __future__ import annotations

from cgloop.policy.model import Policy, Verdict
from cgloop.policy.telemetry import Reading
from cgloop.v1 import action_pb2 as apb

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
