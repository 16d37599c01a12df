"""Natif: category-aware function instantiation and flow distribution (Hajji thesis ch. 5-6).

Chapter 6 of the thesis. Functions are I/O-bound (limited by packets/s: firewall, NAT, load
balancer, flow monitor) or CPU-bound (limited by bits/s: IDS, redundancy eliminator), §6.1.1.

* `instantiate` is Algorithm 1 (§6.2.1) with the corrected formula: the printed line 9/12
  `ceil(m.c_pps / m.reqCap)` is inverted; we size `ceil(required / per-instance capacity)`.
  A function shared by several branches is sized for the sum of what all its branches carry
  (the printed loop would overwrite the count branch by branch).
* `distribute` is Algorithm 2 (§6.2.2): per function, the largest flow first onto the instance
  with the most remaining capacity, by pps for I/O-bound and bps for CPU-bound functions,
  whole flows only (constraint C3). The negligibility threshold switches to the other metric
  when the primary one cannot influence the function (the flow is tiny against the capacity).
  "Flows traversing m in order": the first function sees flows in input order, every later
  function in the order the previous function mapped them (this reproduces Fig. 6.2).
* `md1_delay_s` is the M/D/1 model of §6.1.1 eq. 6.1-6.4; it is only valid for rho < 1 and
  returns infinity at rho >= 1 (overload). Eq. 6.5 prints the cases swapped; we use
  service + waiting time below capacity.
* Baselines of §7.1: `greedy` (fixed instances, scaled up: one instance per function with the
  cores shared equally, which single-threaded functions cannot use) and `throughput_only`
  (StratosB: instances and distribution from throughput alone).

Categories of the agent's functions: a function the node agent runs is in the chain catalogue
(`planners.catalogue`, declared in node_agent.proto) with its Natif bound, I/O-bound for the
header-only functions (acl, mark, rate_limit, mirror, forward: limited by packets/s, like the
thesis's firewall and NAT) and CPU-bound for the payload function (dpi: limited by bits/s, like
its IDS). `NetworkFunction.of` takes the category from there, and `_check` refuses a catalogue
function given the other category. Names outside the catalogue stay free, for the thesis's
abstract examples (X, Y; IDS, redundancy eliminator), which are models and never sent to an
agent.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import IntEnum

from cgloop.policy.planners import catalogue


class Category(IntEnum):
    """`m.proc` of the thesis: what limits a function's capacity."""

    IO_BOUND = 0  # packets per second
    CPU_BOUND = 1  # bits per second

    @classmethod
    def of(cls, function: str) -> Category | None:
        """The category the chain catalogue declares for an agent function (None: not one)."""
        spec = catalogue.FUNCTIONS.get(function)
        if spec is None:
            return None
        return cls.CPU_BOUND if spec.bound == catalogue.CPU_BOUND else cls.IO_BOUND


@dataclass(frozen=True)
class NetworkFunction:
    name: str
    category: Category
    capacity_pps: float  # m.c_pps, per instance
    capacity_bps: float  # m.c_dps, per instance
    multithreaded: bool = False  # m.thd
    gain_pps: float = 1.0  # m.gd_p, egress/ingress packet rate
    gain_bps: float = 1.0  # m.gd_d, egress/ingress throughput

    def capacity(self, category: Category) -> float:
        return self.capacity_pps if category is Category.IO_BOUND else self.capacity_bps

    @classmethod
    def of(
        cls, name: str, capacity_pps: float, capacity_bps: float, **kw: object
    ) -> NetworkFunction:
        """An agent function, its category from the chain catalogue."""
        category = Category.of(name)
        if category is None:
            raise ValueError(f"{name!r} is not in the chain catalogue ({catalogue.known()})")
        return cls(name, category, capacity_pps, capacity_bps, **kw)  # type: ignore[arg-type]


@dataclass(frozen=True)
class Flow:
    name: str
    pps: float  # f.pr
    bps: float  # f.thp

    def size(self, category: Category) -> float:
        return self.pps if category is Category.IO_BOUND else self.bps


@dataclass(frozen=True)
class Branch:
    """One entry-to-exit path of a chain, the functions in packet order and the flows on it."""

    chain: str
    functions: tuple[str, ...]
    flows: tuple[str, ...]


@dataclass
class InstanceLoad:
    function: str
    index: int
    pps: float = 0.0
    bps: float = 0.0
    flows: list[str] = field(default_factory=list)


@dataclass
class Distribution:
    """Output of Algorithm 2: the path of every flow, and what each instance carries."""

    # flow -> [(function, instance index)] in chain order
    paths: dict[str, list[tuple[str, int]]]
    loads: dict[tuple[str, int], InstanceLoad]
    # flows that fit no instance whole (C3 violated); they are still mapped, to the roomiest one
    oversized: list[tuple[str, str]]

    def utilisation(self, functions: Mapping[str, NetworkFunction]) -> dict[tuple[str, int], float]:
        out = {}
        for key, load in self.loads.items():
            nf = functions[key[0]]
            out[key] = (
                load.pps / nf.capacity_pps
                if nf.category is Category.IO_BOUND
                else load.bps / nf.capacity_bps
            )
        return out


def _check(
    functions: Mapping[str, NetworkFunction], branches: Sequence[Branch], flows: Mapping[str, Flow]
) -> None:
    for b in branches:
        for name in b.functions:
            if name not in functions:
                raise ValueError(f"branch of chain {b.chain!r} uses unknown function {name!r}")
        for name in b.flows:
            if name not in flows:
                raise ValueError(f"branch of chain {b.chain!r} carries unknown flow {name!r}")
    for nf in functions.values():
        if nf.capacity_pps <= 0 or nf.capacity_bps <= 0:
            raise ValueError(f"function {nf.name!r}: capacities must be > 0")
        declared = Category.of(nf.name)
        if declared is not None and declared is not nf.category:
            raise ValueError(
                f"function {nf.name!r} is {declared.name} in the chain catalogue, not "
                f"{nf.category.name}"
            )


def required_capacity(
    functions: Mapping[str, NetworkFunction], branches: Sequence[Branch], flows: Mapping[str, Flow]
) -> dict[str, float]:
    """Algorithm 1 lines 3-15: per function, the load it must carry in its own metric."""
    _check(functions, branches, flows)
    required: dict[str, float] = {name: 0.0 for name in functions}
    for b in branches:
        pr = sum(flows[f].pps for f in b.flows)
        thp = sum(flows[f].bps for f in b.flows)
        for name in b.functions:
            nf = functions[name]
            required[name] += pr if nf.category is Category.IO_BOUND else thp
            pr *= nf.gain_pps
            thp *= nf.gain_bps
    return required


def instantiate(
    functions: Mapping[str, NetworkFunction], branches: Sequence[Branch], flows: Mapping[str, Flow]
) -> dict[str, int]:
    """Algorithm 1, corrected: instances = ceil(required / per-instance capacity), at least 1."""
    required = required_capacity(functions, branches, flows)
    return {
        name: max(1, math.ceil(required[name] / functions[name].capacity(functions[name].category)))
        for name in functions
    }


def _negligible(flow_size: float, capacity: float, n_flows: int, threshold: float) -> bool:
    """True when a flow of this size is negligible against the capacity (Alg. 2 lines 8, 21)."""
    return flow_size <= 0 or capacity / (flow_size * n_flows) > threshold


def distribute(
    functions: Mapping[str, NetworkFunction],
    branches: Sequence[Branch],
    flows: Mapping[str, Flow],
    instances: Mapping[str, int],
    negligible_threshold: float = math.inf,
    by: Category | None = None,
) -> Distribution:
    """Algorithm 2: map whole flows onto instances, largest first onto the roomiest instance.

    `by` forces one metric for every function (the throughput-only baseline); by default each
    function uses its category's metric, switching when that one is negligible.
    """
    _check(functions, branches, flows)
    # Per function: the flows reaching it, with their attributes after upstream gain/drop.
    arriving: dict[str, dict[str, Flow]] = {name: {} for name in functions}
    position: dict[tuple[str, str], int] = {}  # (function, flow) -> index in its branch
    for b in branches:
        for fname in b.flows:
            f = flows[fname]
            pr, thp = f.pps, f.bps
            for i, name in enumerate(b.functions):
                arriving[name][fname] = Flow(fname, pr, thp)
                position[(name, fname)] = i
                pr *= functions[name].gain_pps
                thp *= functions[name].gain_bps
    # Visit functions in chain order so "the order of the previous function" exists.
    order: list[str] = []
    for b in branches:
        for name in b.functions:
            if name not in order:
                order.append(name)
    paths: dict[str, list[tuple[str, int]]] = {f: [] for b in branches for f in b.flows}
    loads: dict[tuple[str, int], InstanceLoad] = {}
    oversized: list[tuple[str, str]] = []
    mapped_order: dict[str, list[str]] = {}  # function -> flows in the order it mapped them
    for name in order:
        nf = functions[name]
        here = arriving[name]
        if not here:
            continue
        # Flows in the order the upstream function mapped them (input order at the entry).
        upstream = [mapped_order[p] for p in _predecessors(name, branches) if p in mapped_order]
        seq: list[str] = []
        seen: set[str] = set()
        for lst in upstream:
            for f in lst:
                if f in here and f not in seen:
                    seq.append(f)
                    seen.add(f)
        seq += [f for f in here if f not in seen]
        n = max(1, instances.get(name, 1))
        primary = by if by is not None else nf.category
        metric = primary
        if by is None and math.isfinite(negligible_threshold):
            other = Category(1 - primary)
            biggest = max(here[f].size(primary) for f in seq)
            biggest_other = max(here[f].size(other) for f in seq)
            if _negligible(
                biggest, nf.capacity(primary), len(seq), negligible_threshold
            ) and not _negligible(
                biggest_other, nf.capacity(other), len(seq), negligible_threshold
            ):
                metric = other
        cap = nf.capacity(metric)
        # Largest first; Python's sort is stable so equal flows keep the upstream order.
        ranked = sorted(seq, key=lambda f: -here[f].size(metric))
        heap = [(-cap, i) for i in range(n)]  # (-remaining, index): ties go to the lowest index
        heapq.heapify(heap)
        for i in range(n):
            loads[(name, i)] = InstanceLoad(name, i)
        done: list[str] = []
        for fname in ranked:
            neg_rem, idx = heapq.heappop(heap)
            size = here[fname].size(metric)
            if size > -neg_rem:
                oversized.append((name, fname))
            heapq.heappush(heap, (neg_rem + size, idx))
            load = loads[(name, idx)]
            load.pps += here[fname].pps
            load.bps += here[fname].bps
            load.flows.append(fname)
            paths[fname].append((name, idx))
            done.append(fname)
        mapped_order[name] = done
    for fname, hops in paths.items():
        hops.sort(key=lambda h: position.get((h[0], fname), 0))
    return Distribution(paths, loads, oversized)


def _predecessors(name: str, branches: Iterable[Branch]) -> list[str]:
    out = []
    for b in branches:
        if name in b.functions:
            i = b.functions.index(name)
            if i > 0 and b.functions[i - 1] not in out:
                out.append(b.functions[i - 1])
    return out


def md1_delay_s(arrival_pps: float, capacity_pps: float) -> float:
    """M/D/1 sojourn time (service + mean wait), eq. 6.1-6.4; infinity when rho >= 1."""
    if capacity_pps <= 0:
        raise ValueError("capacity must be > 0")
    ts = 1.0 / capacity_pps
    rho = arrival_pps * ts
    if rho >= 1.0:
        return math.inf
    return ts + ts * rho / (2.0 * (1.0 - rho))


def service_rate_pps(nf: NetworkFunction, load: InstanceLoad) -> float:
    """Eq. 6.2: I/O-bound capacity in pps; CPU-bound c_dps over the mean packet size."""
    if nf.category is Category.IO_BOUND:
        return nf.capacity_pps
    mean_packet_bits = load.bps / load.pps if load.pps > 0 else 0.0
    return nf.capacity_bps / mean_packet_bits if mean_packet_bits > 0 else math.inf


def flow_delays_s(functions: Mapping[str, NetworkFunction], dist: Distribution) -> dict[str, float]:
    """Processing delay of each flow along its path (eq. 6.9 without the link delays)."""
    per_instance = {}
    for key, load in dist.loads.items():
        rate = service_rate_pps(functions[key[0]], load)
        per_instance[key] = 0.0 if math.isinf(rate) else md1_delay_s(load.pps, rate)
    return {f: sum(per_instance[h] for h in hops) for f, hops in dist.paths.items()}


@dataclass
class Plan:
    instances: dict[str, int]
    distribution: Distribution


def natif(
    functions: Mapping[str, NetworkFunction],
    branches: Sequence[Branch],
    flows: Mapping[str, Flow],
    negligible_threshold: float = math.inf,
) -> Plan:
    instances = instantiate(functions, branches, flows)
    return Plan(instances, distribute(functions, branches, flows, instances, negligible_threshold))


def throughput_only(
    functions: Mapping[str, NetworkFunction], branches: Sequence[Branch], flows: Mapping[str, Flow]
) -> Plan:
    """StratosB baseline: every function sized and fed by throughput."""
    as_cpu = {
        n: NetworkFunction(
            nf.name,
            Category.CPU_BOUND,
            nf.capacity_pps,
            nf.capacity_bps,
            nf.multithreaded,
            nf.gain_pps,
            nf.gain_bps,
        )
        for n, nf in functions.items()
    }
    instances = instantiate(as_cpu, branches, flows)
    return Plan(instances, distribute(functions, branches, flows, instances, by=Category.CPU_BOUND))


def greedy(
    functions: Mapping[str, NetworkFunction],
    branches: Sequence[Branch],
    flows: Mapping[str, Flow],
    cores: int,
) -> tuple[dict[str, NetworkFunction], Plan]:
    """Greedy baseline: one scaled-up instance per function, the cores shared equally.

    Returns the scaled functions (capacity x cores share when multi-threaded; a single-threaded
    function cannot use more than one core) and the plan over them.
    """
    share = max(1, cores // max(1, len(functions)))
    scaled = {
        n: NetworkFunction(
            nf.name,
            nf.category,
            nf.capacity_pps * (share if nf.multithreaded else 1),
            nf.capacity_bps * (share if nf.multithreaded else 1),
            nf.multithreaded,
            nf.gain_pps,
            nf.gain_bps,
        )
        for n, nf in functions.items()
    }
    instances = {n: 1 for n in functions}
    return scaled, Plan(instances, distribute(scaled, branches, flows, instances))
