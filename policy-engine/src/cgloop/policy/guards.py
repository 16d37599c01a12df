"""Guards: what may stop a proposed action before it touches the network.

After ONAP's guard policies (frequency limiter per actor/operation/target and window, min/max
bounds, blacklist, coordination where one action blocks another) plus what a latency loop
needs to stay stable (MOSAICO §3.2): hold time per policy and target, cooldown per target,
one action in flight per target, and a global action budget. A refusal names its guard and is
recorded on the actions topic like any action.
"""

from __future__ import annotations

from collections import defaultdict, deque
from dataclasses import dataclass, field

from cgloop.policy.model import Operation, Policy

NS = 1_000_000_000


@dataclass(frozen=True)
class Refusal:
    guard: str
    reason: str

    def __str__(self) -> str:
        return f"guard {self.guard}: {self.reason}"


@dataclass(frozen=True)
class Budget:
    """Global action budget: at most `limit` applied actions per `window_s` across all policies."""

    limit: int = 20
    window_s: float = 60.0


@dataclass(frozen=True)
class Proposal:
    """What guards look at: who (policy), what (operation, parameters), where (target key)."""

    action_id: str
    policy: Policy
    operation: Operation
    target_key: str
    parameters: dict[str, float]  # the action's numeric parameters (what bounds compare)
    node_id: str = ""
    addresses: tuple[str, ...] = ()
    device_id: str = ""
    # Only extends a protection already in place (cgloop.policy.leases): no change to hold,
    # cool down, limit or budget, so those guards do not count it.
    renewal: bool = False


@dataclass
class _Hold:
    policy_id: str
    action_id: str
    blocks: frozenset[Operation]
    until_ns: int


@dataclass
class GuardBook:
    """Everything the guards remember; rebuilt from the journal after a restart."""

    budget: Budget = field(default_factory=Budget)
    in_flight: dict[str, str] = field(default_factory=dict)  # target -> action id
    last_by_policy: dict[tuple[str, str], int] = field(default_factory=dict)
    ended: dict[str, int] = field(default_factory=dict)  # target -> when its last action ended
    history: dict[tuple[Operation, str], deque[int]] = field(
        default_factory=lambda: defaultdict(deque)
    )
    applied: deque[int] = field(default_factory=deque)
    holds: dict[str, list[_Hold]] = field(default_factory=lambda: defaultdict(list))

    def check(self, p: Proposal, now_ns: int) -> Refusal | None:
        g = p.policy.guards
        bl = g.blacklist
        if p.node_id and p.node_id in bl.node_ids:
            return Refusal("blacklist", f"node {p.node_id} is blacklisted")
        if p.device_id and p.device_id in bl.device_ids:
            return Refusal("blacklist", f"device {p.device_id} is blacklisted")
        for addr in p.addresses:
            if addr in bl.addresses:
                return Refusal("blacklist", f"address {addr} is blacklisted")
        for name, bound in g.bounds.items():
            if name not in p.parameters:
                continue
            value = p.parameters[name]
            if bound.min is not None and value < bound.min:
                return Refusal("bounds", f"{name}={value:g} is below the minimum {bound.min:g}")
            if bound.max is not None and value > bound.max:
                return Refusal("bounds", f"{name}={value:g} is above the maximum {bound.max:g}")
        busy = self.in_flight.get(p.target_key)
        if busy and busy != p.action_id:
            return Refusal("in_flight", f"action {busy} is still in flight on {p.target_key}")
        if p.renewal:
            return None
        last = self.last_by_policy.get((p.policy.id, p.target_key))
        if last is not None and now_ns - last < g.hold_time * NS:
            left = (last + g.hold_time * NS - now_ns) / NS
            return Refusal("hold_time", f"policy acted on {p.target_key} {left:.3g} s too recently")
        ended = self.ended.get(p.target_key)
        if ended is not None and now_ns - ended < g.cooldown * NS:
            return Refusal("cooldown", f"{p.target_key} is cooling down after its last action")
        for hold in self.holds.get(p.target_key, []):
            if hold.until_ns > now_ns and p.operation in hold.blocks:
                return Refusal(
                    "coordination",
                    f"{p.operation.value} is blocked on {p.target_key} by policy "
                    f"{hold.policy_id} (action {hold.action_id})",
                )
        if g.frequency is not None:
            times = self.history[(p.operation, p.target_key)]
            _trim(times, now_ns - int(g.frequency.window * NS))
            if len(times) >= g.frequency.limit:
                return Refusal(
                    "frequency",
                    f"{len(times)} {p.operation.value} actions on {p.target_key} in the last "
                    f"{g.frequency.window:g} s (limit {g.frequency.limit})",
                )
        _trim(self.applied, now_ns - int(self.budget.window_s * NS))
        if len(self.applied) >= self.budget.limit:
            return Refusal(
                "budget",
                f"{len(self.applied)} actions in the last {self.budget.window_s:g} s "
                f"(global budget {self.budget.limit})",
            )
        return None

    # --- bookkeeping, called by the executor on state changes -------------------------------

    def started(self, p: Proposal, now_ns: int) -> None:
        """An action was accepted (proposed for approval, or about to be applied)."""
        self.in_flight[p.target_key] = p.action_id
        if p.renewal:
            return
        self.last_by_policy[(p.policy.id, p.target_key)] = now_ns
        self.history[(p.operation, p.target_key)].append(now_ns)
        self.applied.append(now_ns)
        blocks = frozenset(p.policy.guards.blocks)
        if blocks:
            until = now_ns + int(p.policy.guards.hold_time * NS)
            self.holds[p.target_key].append(_Hold(p.policy.id, p.action_id, blocks, until))

    def finished(self, target_key: str, action_id: str, now_ns: int) -> None:
        """The action reached a final state (verified, rolled back, failed, expired, refused)."""
        if self.in_flight.get(target_key) == action_id:
            del self.in_flight[target_key]
        self.ended[target_key] = now_ns
        holds = self.holds.get(target_key)
        if holds:
            holds[:] = [h for h in holds if h.until_ns > now_ns]


def _trim(times: deque[int], since_ns: int) -> None:
    while times and times[0] < since_ns:
        times.popleft()
