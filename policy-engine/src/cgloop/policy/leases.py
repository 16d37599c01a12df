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
- `new`: no lease, another SLO/class/DSCP/ttl, or lapsed: a change, guarded like any other.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from cgloop.v1 import action_pb2 as apb


class Standing(StrEnum):
    FRESH = "fresh"
    RENEWAL = "renewal"
    NEW = "new"


@dataclass(frozen=True)
class Lease:
    action_id: str
    terms: bytes
    applied_ns: int
    ttl_ns: int
    spec: apb.ProtectFlowAction


@dataclass
class Leases:
    # Renew once this fraction of the time to live has passed (0.5: two chances before it
    # lapses, at the classifier's pace).
    renew_after: float = 0.5
    by_target: dict[str, Lease] = field(default_factory=dict)

    @staticmethod
    def _terms(spec: apb.ProtectFlowAction) -> bytes:
        return spec.SerializeToString(deterministic=True)

    def standing(self, target_key: str, spec: apb.ProtectFlowAction, now_ns: int) -> Standing:
        lease = self.by_target.get(target_key)
        if lease is None or lease.terms != self._terms(spec):
            return Standing.NEW
        age = now_ns - lease.applied_ns
        if age >= lease.ttl_ns:
            return Standing.NEW  # lapsed on the node
        return Standing.FRESH if age < self.renew_after * lease.ttl_ns else Standing.RENEWAL

    def applied(
        self, target_key: str, action_id: str, spec: apb.ProtectFlowAction, at_ns: int
    ) -> None:
        self.by_target[target_key] = Lease(
            action_id, self._terms(spec), at_ns, spec.ttl_ns, spec
        )

    def live(self, target_key: str, now_ns: int) -> apb.ProtectFlowAction | None:
        """The protection the engine keeps on a target, unless it has lapsed."""
        lease = self.by_target.get(target_key)
        if lease is None or now_ns - lease.applied_ns >= lease.ttl_ns:
            return None
        return lease.spec

    def ended(self, target_key: str, action_id: str) -> None:
        """The action's protection was rolled back: the next detection protects anew."""
        lease = self.by_target.get(target_key)
        if lease is not None and lease.action_id == action_id:
            del self.by_target[target_key]
