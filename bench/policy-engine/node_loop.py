"""The engine's side of the node micro loop: protections kept alive, node actions as facts.

    uv run python bench/policy-engine/node_loop.py

* renewals: 500 gaming flows, each classified every 0.5 s (the classifier's pace) for 120 s
  of engine time (a manual clock; the agent is a real gRPC server in this process): the
  ProtectFlows calls and action records the engine makes, against one per detection (the
  engine without leases), and the longest a flow went between two protections against the
  30 s time to live it must never reach;
* facts: 10 000 node flow moves (action + result, 50 a batch as a node's audit interval
  sends them) taken in by `Engine.observe`: cost per move; then one SLO detection per moved
  flow, each dropped as already done by the node, against the same detections on an engine
  without the facts (each applied over gRPC to the agent): cost per decision.
"""

from __future__ import annotations

import itertools
import math
import os
import time

from cgloop.policy import model
from cgloop.policy.actuators import NodeAgentActuator, Router
from cgloop.policy.engine import Engine
from cgloop.policy.guards import Budget
from cgloop.policy.journal import Journal
from cgloop.policy.testing import (
    GAMING_LABELS,
    AgentBounds,
    AgentServer,
    ManualClock,
    MemoryNodeAgent,
    classified,
    detection,
    flow,
    node_flow_move,
    reprioritise_policy,
)
from cgloop.v1 import action_pb2 as apb
from cgloop.v1 import detection_pb2 as dpb

S = 1_000_000_000
FLOWS = 500
MOVES = 10_000
BATCH = 50


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, max(0, math.ceil(q * len(s)) - 1))]


def dist(values_ns: list[float]) -> str:
    return (
        f"p50 {pct(values_ns, 0.5) / 1e3:8.1f} µs  p90 {pct(values_ns, 0.9) / 1e3:8.1f} µs  "
        f"p99 {pct(values_ns, 0.99) / 1e3:8.1f} µs  (n={len(values_ns)})"
    )


def client(i: int) -> str:
    return f"10.9.{i // 250}.{i % 250 + 1}"


def engine(agent: AgentServer, policies, clock=None) -> Engine:
    return Engine(
        policies,
        Router(NodeAgentActuator({"node-a": agent.address})),
        journal=Journal(None),
        clock=clock or time.time_ns,
        budget=Budget(limit=10**9),
    )


def bench_renewals(agent: AgentServer) -> None:
    protect = [p for p in model.default_policies() if p.id.startswith("gaming-protect-")]
    clock = ManualClock()
    e = engine(agent, protect, clock)
    ticks = 240
    longest = 0
    records = 0
    for _ in range(ticks):
        dets = [classified(clock(), client(i)) for i in range(FLOWS)]
        events = e.handle(dpb.DetectionBatch(records=dets))
        records += len(events)
        clock.advance(0.5)
    # Gaps between two protections of one flow, from the journal (action target -> times).
    times: dict[str, list[int]] = {}
    for entry in e.journal.entries.values():
        if entry.result is not None and entry.state != apb.ACTION_STATE_REFUSED:
            times.setdefault(entry.target_key, []).append(entry.action.header.timestamp_ns)
    for ts in times.values():
        longest = max(longest, *(b - a for a, b in itertools.pairwise([*sorted(ts), clock()])))
    calls = sum(1 for m, _ in agent.agent.calls if m == "ProtectFlows")
    detections = FLOWS * ticks
    refused = e.stats.refused
    print(f"== Renewals: {FLOWS} flows classified every 0.5 s for {ticks // 2} s")
    print(
        f"ProtectFlows calls {calls} ({calls / FLOWS:.1f} per flow), action records {records}, "
        f"refused {refused}; without leases: {detections} calls "
        f"(ratio {calls / detections:.4f}x)"
    )
    print(
        f"longest time between two ProtectFlows of a flow: {longest / S:.1f} s "
        f"(must stay below the ttl, 30 s: ratio {longest / (30 * S):.2f}x)"
    )


def bench_facts(agent: AgentServer) -> None:
    (slo,) = model.parse_policies(reprioritise_policy())
    e = engine(agent, [slo])
    now = time.time_ns()
    moves = [
        node_flow_move(0x10010, 46, None, now, ft=flow(client(i % 10_000), 40000 + i // 10_000))
        for i in range(MOVES)
    ]
    batches = [apb.ActionBatch() for _ in range(0, MOVES, BATCH)]
    for i, m in enumerate(moves):
        batches[i // BATCH].events.extend(m.events)
    observe: list[float] = []
    for b in batches:
        t = time.perf_counter_ns()
        e.observe(b)
        e.drain()
        observe.append((time.perf_counter_ns() - t) / BATCH)
    dets = [
        detection(time.time_ns(), client=client(i % 10_000), labels=dict(GAMING_LABELS))
        for i in range(MOVES)
    ]
    refused = timed_decisions(e, dets)
    assert e.facts.stats.node_held == MOVES, e.facts.stats
    baseline = timed_decisions(engine(agent, [slo]), dets)
    print(f"== Node facts: {MOVES} node flow moves, {BATCH} a batch")
    print(f"observe (journal + 'not checked' verification) per move: {dist(observe)}")
    print(f"decision dropped, the node did it:       {dist(refused)}")
    print(f"baseline, same decision applied over gRPC: {dist(baseline)}")
    print(
        f"  ratio dropped/applied: p50 {pct(refused, 0.5) / pct(baseline, 0.5):.3f}x, "
        f"p99 {pct(refused, 0.99) / pct(baseline, 0.99):.3f}x"
    )


def timed_decisions(e: Engine, dets: list[dpb.Detection]) -> list[float]:
    out = []
    for i in range(0, len(dets), BATCH):
        batch = dpb.DetectionBatch()
        for d in dets[i : i + BATCH]:
            c = batch.records.add()
            c.CopyFrom(d)
        t = time.perf_counter_ns()
        e.handle(batch)
        out.append((time.perf_counter_ns() - t) / BATCH)
    return out


def main() -> None:
    # Room for every flow's protection (the agent's default bound is 256).
    bounds = AgentBounds(max_protected_flows=2 * FLOWS)
    with AgentServer(MemoryNodeAgent("node-a", bounds=bounds), workers=8) as agent:
        bench_renewals(agent)
        bench_facts(agent)
    print(f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
