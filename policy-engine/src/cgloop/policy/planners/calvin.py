"""CALVIN placement: where each function of a chain runs, and whether the chain fits its budget.

Xiang et al., CALVIN (§III-B; Xiang's thesis ch. 3):
* elementary functions (receive/forward) and basic ones (header-only, bounded loops, low
  compute, no special runtime: router, NAT, load balancer, stateless packet filter) run in the
  kernel with XDP/eBPF;
* advanced functions (payload work, acceleration or a user-space runtime: coding, encryption,
  compression) run in user space (AF_XDP here, DPDK in the paper), run to completion, burst
  size 1, one function per core; a function is never split across kernel and user space.
* Latency budget (§IV-D, Fig. 2): 1 ms end to end, 0.35 ms for the MEC edge, and with the
  measured forwarding RTT of the chain plus a 0.01 ms safety margin, 20 us per advanced function.
  An advanced function scaled out (Natif, `ChainFunction.instances`) takes a core of its own per
  instance; its packets each cross one instance, so the latency budget counts it once.
  `LatencyLedger` admits a chain only when its base RTT, the sum of its advanced functions and
  the margin fit the edge budget and every advanced function fits its own budget.

Which functions: the planner places the functions the node agent can run, as the chain
catalogue declares them (`cgloop.v1.ChainFunction.function`, read through
`planners.catalogue`): each function's CALVIN kind is its declared `FunctionTraits.kind`, not a
second table here. The paper's examples the agent does not implement (NAT, network coding,
encryption, compression) are not offered under their names; their CALVIN classes map onto the
functions that exist: a stateless packet filter is `acl` (basic, in BPF), header rewriting is
`mark` (basic), policing is `rate_limit` (basic), and payload work is `dpi` (advanced, in user
space, the one advanced function with an implementation). A chain names the catalogue's
functions with typed parameters; the agent runs exactly what was planned.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import IntEnum

from cgloop.policy.planners import catalogue
from cgloop.v1 import node_agent_pb2 as na


class FunctionKind(IntEnum):
    """cgloop.v1.FunctionKind."""

    ELEMENTARY = na.FUNCTION_KIND_ELEMENTARY
    BASIC = na.FUNCTION_KIND_BASIC
    ADVANCED = na.FUNCTION_KIND_ADVANCED


# The functions a chain may name (the catalogue's), for validators listing them.
KNOWN_FUNCTIONS: dict[str, catalogue.Function] = catalogue.FUNCTIONS


class AdmissionRefused(ValueError):
    """CALVIN admission control refused a chain; `reasons` says why."""

    def __init__(self, chain_id: str, reasons: list[str]) -> None:
        super().__init__(f"CALVIN admission refused chain {chain_id!r}: " + "; ".join(reasons))
        self.reasons = reasons


def runs_in(kind: FunctionKind) -> str:
    return "user_space_af_xdp" if kind is FunctionKind.ADVANCED else "kernel_xdp"


@dataclass(frozen=True)
class Budget:
    end_to_end_s: float = 1e-3
    edge_s: float = 0.35e-3
    advanced_function_s: float = 20e-6
    safety_margin_s: float = 0.01e-3


@dataclass(frozen=True)
class ChainFunctionRequest:
    # A catalogue function with its typed parameters (kind and core are set by the placement).
    function: na.ChainFunction
    # Expected per-packet processing time; required for advanced functions.
    processing_s: float = 0.0

    @property
    def name(self) -> str:
        return catalogue.name_of(self.function)


@dataclass(frozen=True)
class ChainRequest:
    chain_id: str
    traffic_class: str
    functions: tuple[ChainFunctionRequest, ...]
    # Measured RTT of the chain's elementary forwarding path (0.19 ms at 256 B, 0.32 ms at
    # 1400 B in §IV-B2).
    base_rtt_s: float


@dataclass(frozen=True)
class PlacedFunction:
    function: na.ChainFunction
    kind: FunctionKind
    runs_in: str
    core: int | None  # advanced functions get a core of their own
    # Natif's scale-out: a core of its own for each instance (the first is `core`).
    instance_cores: tuple[int, ...] = ()

    @property
    def name(self) -> str:
        return catalogue.name_of(self.function)


@dataclass
class Placement:
    chain_id: str
    traffic_class: str
    admitted: bool
    functions: list[PlacedFunction]
    expected_latency_s: float
    reasons: list[str] = field(default_factory=list)

    def chain(self) -> na.ServiceChain:
        """The placed chain as the node agent takes it: kinds and cores set."""
        out = na.ServiceChain(chain_id=self.chain_id, traffic_class=self.traffic_class)
        for f in self.functions:
            fn = out.functions.add()
            fn.CopyFrom(f.function)
            fn.kind = int(f.kind)
            fn.core = f.core or 0
            if len(f.instance_cores) > 1:
                del fn.instance_cores[:]
                fn.instance_cores.extend(f.instance_cores)
        return out


@dataclass
class LatencyLedger:
    """Admission control over the free user-space cores and the per-chain latency budget."""

    free_cores: list[int]
    budget: Budget = field(default_factory=Budget)
    admitted: dict[str, Placement] = field(default_factory=dict)

    def place(self, request: ChainRequest) -> Placement:
        """Places a chain; a function outside the catalogue, or parameters outside their
        declared values, raise catalogue.CatalogueError (the agent would refuse them)."""
        reasons: list[str] = []
        placed: list[PlacedFunction] = []
        cores = list(self.free_cores)
        latency = request.base_rtt_s
        bare = na.ServiceChain(chain_id=request.chain_id, traffic_class=request.traffic_class)
        for fn in request.functions:
            f = bare.functions.add()
            f.CopyFrom(fn.function)
            f.ClearField("kind")  # the catalogue's kind is the placement
        catalogue.check_chain(bare)
        for fn in request.functions:
            kind = FunctionKind(catalogue.FUNCTIONS[fn.name].kind)
            core = None
            instance_cores: list[int] = []
            if kind is FunctionKind.ADVANCED:
                if fn.processing_s <= 0:
                    reasons.append(f"{fn.name}: advanced function needs processing_s")
                elif fn.processing_s > self.budget.advanced_function_s:
                    reasons.append(
                        f"{fn.name}: {fn.processing_s * 1e6:.1f} us exceeds the "
                        f"{self.budget.advanced_function_s * 1e6:.0f} us advanced-function budget"
                    )
                # One core of its own per instance (Natif's scale-out, whole flows each).
                n = max(1, fn.function.instances)
                # Cores the request pins (a re-plan's) are taken as given.
                given = list(fn.function.instance_cores) or (
                    [fn.function.core] if fn.function.core and n == 1 else []
                )
                if given:
                    instance_cores = given
                    cores = [c for c in cores if c not in given]
                elif len(cores) >= n:
                    instance_cores, cores = cores[:n], cores[n:]
                else:
                    reasons.append(
                        f"{fn.name}: no free core for an advanced function"
                        if n == 1
                        else f"{fn.name}: {n} instances need {n} free cores, {len(cores)} left"
                    )
                core = instance_cores[0] if instance_cores else None
            latency += fn.processing_s
            placed.append(
                PlacedFunction(
                    fn.function, kind, runs_in(kind), core,
                    tuple(instance_cores),
                )
            )
        if latency + self.budget.safety_margin_s > self.budget.edge_s:
            reasons.append(
                f"chain latency {latency * 1e3:.3f} ms + margin "
                f"{self.budget.safety_margin_s * 1e3:.2f} ms exceeds the edge budget "
                f"{self.budget.edge_s * 1e3:.2f} ms"
            )
        if request.chain_id in self.admitted:
            reasons.append(f"chain {request.chain_id!r} is already admitted")
        placement = Placement(
            request.chain_id, request.traffic_class, not reasons, placed, latency, reasons
        )
        if placement.admitted:
            self.free_cores = cores
            self.admitted[request.chain_id] = placement
        return placement

    def release(self, chain_id: str) -> None:
        placement = self.admitted.pop(chain_id)
        for f in placement.functions:
            self.free_cores += list(f.instance_cores) or ([f.core] if f.core is not None else [])


def place_chain(
    request: ChainRequest, free_cores: Sequence[int], budget: Budget | None = None
) -> Placement:
    """One-shot placement (a fresh ledger)."""
    return LatencyLedger(list(free_cores), budget or Budget()).place(request)


def place_service_chain(
    functions: Sequence[na.ChainFunction],
    *,
    chain_id: str,
    traffic_class: str,
    base_rtt_s: float,
    free_cores: Sequence[int],
    processing_s: Sequence[float] | None = None,
    budget: Budget | None = None,
) -> na.ServiceChain:
    """The CALVIN-placed chain for the node agent's SetChain: each function's kind (the
    catalogue's) and core (one free core per advanced function) set.

    `processing_s` is each function's expected per-packet time, in order (needed for advanced
    functions). Raises catalogue.CatalogueError for a chain the agent would refuse and
    AdmissionRefused when the chain does not fit the budget or the free cores.
    """
    times = list(processing_s) if processing_s is not None else [0.0] * len(functions)
    if len(times) != len(functions):
        raise ValueError(f"processing_s has {len(times)} entries for {len(functions)} functions")
    request = ChainRequest(
        chain_id,
        traffic_class,
        tuple(ChainFunctionRequest(f, t) for f, t in zip(functions, times, strict=True)),
        base_rtt_s,
    )
    placement = place_chain(request, free_cores, budget)
    if not placement.admitted:
        raise AdmissionRefused(chain_id, placement.reasons)
    return placement.chain()
