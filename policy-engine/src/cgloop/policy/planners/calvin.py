"""CALVIN placement: where each function of a chain runs, and whether the chain fits its budget.

Xiang et al., CALVIN (seeds/001 §III-B, thesis seeds/000 ch. 3):
* elementary functions (receive/forward) and basic ones (header-only, bounded loops, low
  compute, no special runtime: router, NAT, load balancer, stateless packet filter) run in the
  kernel with XDP/eBPF;
* advanced functions (payload work, acceleration or a user-space runtime: coding, encryption,
  compression) run in user space (AF_XDP here, DPDK in the paper), run to completion, burst
  size 1, one function per core; a function is never split across kernel and user space.
* Latency budget (§IV-D, Fig. 2): 1 ms end to end, 0.35 ms for the MEC edge, and with the
  measured forwarding RTT of the chain plus a 0.01 ms safety margin, 20 us per advanced function.
  `LatencyLedger` admits a chain only when its base RTT, the sum of its advanced functions and
  the margin fit the edge budget and every advanced function fits its own budget.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import IntEnum


class FunctionKind(IntEnum):
    """Same numbers as cgloop.v1.FunctionKind."""

    ELEMENTARY = 1
    BASIC = 2
    ADVANCED = 3


@dataclass(frozen=True)
class FunctionTraits:
    """What CALVIN's classification looks at (§III-B)."""

    name: str
    header_work: bool = True  # reads or rewrites headers (False: forward only)
    payload_work: bool = False
    unbounded_loops: bool = False  # iterative work the BPF verifier would refuse
    heavy_compute: bool = False  # needs SIMD, hugepages, prefetching to stay fast
    user_runtime: bool = False  # needs a library/runtime absent from the kernel (e.g. C++ Kodo)


# The paper's examples (§III-B), usable by name in chain requests.
KNOWN_FUNCTIONS: dict[str, FunctionTraits] = {
    "forward": FunctionTraits("forward", header_work=False),
    "router": FunctionTraits("router"),
    "load_balancer": FunctionTraits("load_balancer"),
    "nat": FunctionTraits("nat"),
    "packet_filter": FunctionTraits("packet_filter"),
    "firewall": FunctionTraits("firewall"),
    "encryption": FunctionTraits("encryption", payload_work=True, heavy_compute=True),
    "compression": FunctionTraits("compression", payload_work=True, unbounded_loops=True),
    "network_coding": FunctionTraits(
        "network_coding", payload_work=True, heavy_compute=True, user_runtime=True
    ),
}


def classify(traits: FunctionTraits) -> FunctionKind:
    if traits.payload_work or traits.unbounded_loops or traits.heavy_compute or traits.user_runtime:
        return FunctionKind.ADVANCED
    if not traits.header_work:
        return FunctionKind.ELEMENTARY
    return FunctionKind.BASIC


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
    traits: FunctionTraits
    # Expected per-packet processing time; required for advanced functions.
    processing_s: float = 0.0


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
    name: str
    kind: FunctionKind
    runs_in: str
    core: int | None  # advanced functions get a core of their own


@dataclass
class Placement:
    chain_id: str
    traffic_class: str
    admitted: bool
    functions: list[PlacedFunction]
    expected_latency_s: float
    reasons: list[str] = field(default_factory=list)


@dataclass
class LatencyLedger:
    """Admission control over the free user-space cores and the per-chain latency budget."""

    free_cores: list[int]
    budget: Budget = field(default_factory=Budget)
    admitted: dict[str, Placement] = field(default_factory=dict)

    def place(self, request: ChainRequest) -> Placement:
        reasons: list[str] = []
        placed: list[PlacedFunction] = []
        cores = list(self.free_cores)
        latency = request.base_rtt_s
        for fn in request.functions:
            kind = classify(fn.traits)
            core = None
            if kind is FunctionKind.ADVANCED:
                if fn.processing_s <= 0:
                    reasons.append(f"{fn.traits.name}: advanced function needs processing_s")
                elif fn.processing_s > self.budget.advanced_function_s:
                    reasons.append(
                        f"{fn.traits.name}: {fn.processing_s * 1e6:.1f} us exceeds the "
                        f"{self.budget.advanced_function_s * 1e6:.0f} us advanced-function budget"
                    )
                if cores:
                    core = cores.pop(0)
                else:
                    reasons.append(f"{fn.traits.name}: no free core for an advanced function")
            latency += fn.processing_s
            placed.append(PlacedFunction(fn.traits.name, kind, runs_in(kind), core))
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
        self.free_cores += [f.core for f in placement.functions if f.core is not None]


def place_chain(
    request: ChainRequest, free_cores: Sequence[int], budget: Budget | None = None
) -> Placement:
    """One-shot placement (a fresh ledger)."""
    return LatencyLedger(list(free_cores), budget or Budget()).place(request)
