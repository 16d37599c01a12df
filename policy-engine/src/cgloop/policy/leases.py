"""Protections the engine keeps alive on the nodes.

A protect_flow is a lease: the agent's latency guard protects the flow for `ttl_ns` after the
last request, and the engine renews it while the flow is seen (the classifier's detection
comes every check, about every 0.5 s). Renewing on each detection would flood the bus and the
agent, and the guards meant for changes (hold time, cooldown, frequency, the global budget)
would refuse renewals and let the protection lapse. So, per target (node, interface, flow):

- `fresh`: the same terms were applied less than `renew_after` of the ttl ago: nothing to do
  (no action, no record);
- `renewal`: the same terms, past `renew_after` but not expired: an action that only extends
  the lease; the change guards and the budget do not count it (guards.Proposal.renewal);
- `new`: no lease, another SLO/class/DSCP/ttl, or lapsed: a change, guarded like any other;
- `backoff`: the last attempt on the target failed (the agent refused or was not reached)
  less than `retry_after_s` ago: dropped like a fresh one, so an agent that cannot protect
  the flow gets one attempt (one FAILED record) per interval, not one per detection.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from cgloop.v1 import action_pb2 as apb


class Standing(StrEnum):
    FRESH = "fresh"
    BACKOFF = "backoff"
    RENEWAL = "renewal"
    NEW = "new"


@dataclass(frozen=True)
class Lease:
    action_id: str
    terms: bytes
    applied_ns: int
    ttl_ns: int
    spec: apb.ProtectFlowAction
    # A dry run's lease: deduplicates as an applied one would (a dry-run policy records what
    # it would send), but protects nothing.
    dry_run: bool = False


@dataclass
class Leases:
    # Renew once this fraction of the time to live has passed (0.5: two chances before it
    # lapses, at the classifier's pace).
    renew_after: float = 0.5
    retry_after_s: float = 5.0
    by_target: dict[str, Lease] = field(default_factory=dict)
    failed_at: dict[str, int] = field(default_factory=dict)
    # Lapsed leases and old failures are swept every this many calls (flows end; the tables
    # must not keep every flow ever seen).
    sweep_every: int = 4096
    _calls: int = 0

    @staticmethod
    def _terms(spec: apb.ProtectFlowAction) -> bytes:
        return spec.SerializeToString(deterministic=True)

    def sweep(self, now_ns: int) -> None:
        self.by_target = {
            k: v for k, v in self.by_target.items() if now_ns - v.applied_ns < v.ttl_ns
        }
        retry_ns = self.retry_after_s * 1e9
        self.failed_at = {k: t for k, t in self.failed_at.items() if now_ns - t < retry_ns}

    def standing(self, target_key: str, spec: apb.ProtectFlowAction, now_ns: int) -> Standing:
        self._calls += 1
        if self._calls % self.sweep_every == 0:
            self.sweep(now_ns)
        failed = self.failed_at.get(target_key)
        if failed is not None:
            if now_ns - failed < self.retry_after_s * 1e9:
                return Standing.BACKOFF
            del self.failed_at[target_key]
        lease = self.by_target.get(target_key)
        if lease is None or lease.terms != self._terms(spec):
            return Standing.NEW
        age = now_ns - lease.applied_ns
        if age >= lease.ttl_ns:
            return Standing.NEW  # lapsed on the node
        return Standing.FRESH if age < self.renew_after * lease.ttl_ns else Standing.RENEWAL

    def failed(self, target_key: str, at_ns: int) -> None:
        self.failed_at[target_key] = at_ns

    def applied(
        self,
        target_key: str,
        action_id: str,
        spec: apb.ProtectFlowAction,
        at_ns: int,
        dry_run: bool = False,
    ) -> None:
        self.failed_at.pop(target_key, None)
        self.by_target[target_key] = Lease(
            action_id, self._terms(spec), at_ns, spec.ttl_ns, spec, dry_run
        )

    def live(self, target_key: str, now_ns: int) -> apb.ProtectFlowAction | None:
        """The protection the engine keeps on a target, unless it has lapsed."""
        lease = self.by_target.get(target_key)
        if lease is None or lease.dry_run or now_ns - lease.applied_ns >= lease.ttl_ns:
            return None
        return lease.spec

    def ended(self, target_key: str, action_id: str) -> None:
        """The action's protection was rolled back: the next detection protects anew."""
        lease = self.by_target.get(target_key)
        if lease is not None and lease.action_id == action_id:
            del self.by_target[target_key]
