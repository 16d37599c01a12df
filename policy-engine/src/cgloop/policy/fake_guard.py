"""The in-memory agent's ProtectFlows (cgloop.policy.fake_agent): the protections the node's
latency guard keeps, refused as the real agent refuses them (its guard and bounds).

Rules, checked for every flow before anything changes (all or nothing), worded as the agent's
bounds.rs `protected_flow` words them: the interface within the agent's `[bounds] interfaces`
(PERMISSION_DENIED, empty: INVALID_ARGUMENT; fake_agent's bounds check), a five-tuple, then,
unless `ttl_ns` is 0 (which removes the protection), `latency_slo_ns` within 100 µs..10 s,
`ttl_ns` within 1 s..1 h, a class, `rewrite_dscp` within 0..63 (INVALID_ARGUMENT naming the
field and the bounds); the class a leaf of the interface's hierarchy (FAILED_PRECONDITION, as
the agent's agent.rs `protect_flows` words it); at
most `[guard] max_protected_flows` protections in place afterwards (RESOURCE_EXHAUSTED).
Expired protections are dropped before each request is handled, as the guard drops them.
"""

from __future__ import annotations

from collections.abc import Callable

import grpc
from cgloop.v1 import node_agent_pb2 as na

SLO_NS = (100_000, 10_000_000_000)
TTL_NS = (1_000_000_000, 3_600_000_000_000)

Key = tuple[str, bytes]
# A refusal: the gRPC status and the message (the agent raises it as fake_agent.Refused).
Problem = tuple[grpc.StatusCode, str]


def handle(class_id: int) -> str:
    """tc's major:minor form of a class handle, as the agent writes it (1:10)."""
    return f"{class_id >> 16:x}:{class_id & 0xFFFF:x}"


def key_of(p: na.ProtectedFlow) -> Key:
    return p.interface_name, p.flow.SerializeToString(deterministic=True)


def expire(protections: dict[Key, na.ProtectedFlow], now_ns: int) -> None:
    for k in [k for k, p in protections.items() if p.expires_ns <= now_ns]:
        del protections[k]


def check(
    i: int, p: na.ProtectedFlow, leaf_classes: Callable[[str], tuple[set[int], set[int]]]
) -> Problem | None:
    """What the agent refuses of one requested protection beyond its interface bound (the
    caller checks that first); `leaf_classes(interface)` gives the hierarchy's leaves and all
    its classes, and refuses an interface without a hierarchy itself."""
    at = f"flows[{i}]"
    invalid = grpc.StatusCode.INVALID_ARGUMENT
    if not p.HasField("flow"):
        return invalid, f"{at}.flow is missing: name the 5-tuple to protect"
    if p.ttl_ns == 0:
        return None  # a removal: nothing else to check
    for name, value, (lo, hi), words in (
        ("latency_slo_ns", p.latency_slo_ns, SLO_NS, "100 µs..10 s"),
        ("ttl_ns", p.ttl_ns, TTL_NS, "1 s..1 h; 0 removes"),
    ):
        if not lo <= value <= hi:
            return invalid, f"{at}.{name} {value} is outside {lo}..{hi} ({words})"
    if p.class_id == 0:
        return invalid, f"{at}.class_id is 0: name the class the guard moves the flow to"
    if p.HasField("rewrite_dscp") and p.rewrite_dscp > 63:
        return invalid, f"{at}.rewrite_dscp {p.rewrite_dscp} is not within 0..63"
    leaves, classes = leaf_classes(p.interface_name)
    if p.class_id not in leaves:
        what = "has children" if p.class_id in classes else "does not exist"
        return (
            grpc.StatusCode.FAILED_PRECONDITION,
            f"{at}.class_id {handle(p.class_id)}: the class {what} in {p.interface_name}'s "
            "hierarchy; name a leaf class",
        )
    return None


def protect(
    protections: dict[Key, na.ProtectedFlow],
    request: na.ProtectFlowsRequest,
    now_ns: int,
) -> tuple[dict[Key, na.ProtectedFlow], na.ProtectFlowsResponse, bool, str]:
    """The protections after the (checked) request, the response without its outcome, whether
    a protection's terms changed (a renewal alone changes only its expiry) and a summary."""
    after = dict(protections)
    resp = na.ProtectFlowsResponse()
    changed, counts = False, {"protected": 0, "released": 0}
    for p in request.flows:
        k = key_of(p)
        prev = protections.get(k)
        if prev is not None:
            resp.previous.add().CopyFrom(prev)
        if p.ttl_ns == 0:
            removed = after.pop(k, None)
            changed |= removed is not None
            counts["released"] += 1
            resp.applied.add().CopyFrom(p)
            continue
        new = na.ProtectedFlow()
        new.CopyFrom(p)
        new.expires_ns = now_ns + p.ttl_ns
        new.promoted, new.promotions = (prev.promoted, prev.promotions) if prev else (False, 0)
        changed |= prev is None or _terms(prev) != _terms(new)
        counts["protected"] += 1
        after[k] = new
        resp.applied.add().CopyFrom(new)
    summary = f"{counts['protected']} flow(s) protected, {counts['released']} released"
    return after, resp, changed, f"latency guard: {summary}"


def too_many(after: dict[Key, na.ProtectedFlow], max_flows: int) -> Problem | None:
    if len(after) <= max_flows:
        return None
    return (
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        f"{len(after)} protected flows would be in place; [guard] max_protected_flows is "
        f"{max_flows}",
    )


def _terms(p: na.ProtectedFlow) -> tuple[int, int, int | None]:
    return p.latency_slo_ns, p.class_id, p.rewrite_dscp if p.HasField("rewrite_dscp") else None
