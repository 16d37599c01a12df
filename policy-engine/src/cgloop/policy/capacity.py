"""The overload guard online: no chain change may push a function instance or a core past R_max.

Gallenmüller's model (thesis §5.4.4, `planners.overload`): a core forwards at most
R_max = (1 s - d_Σ) / t_CPU packets per second, with t_CPU the CPU time per packet and d_Σ the
time per second the core spends on something else; overload multiplies latency by 100-1000, so
the offered load must stay under `margin` x R_max. The engine reads both from the node samples
it receives (`nodes.NodeBook`, cgloop.nodes.v1):

- t_CPU of a user-space function = its instance's busy ratio / packets per second (the share of
  the interval it spent processing, per packet processed);
- d_Σ of a core = its utilisation minus the busy ratio of the function's own instances on it
  (what else runs there: another function, a CPU hog, interrupts), at most 0.99.

`fit` chooses, for one advanced function of a chain on one node, how many instances and which
cores keep every instance under margin x R_max, each flow whole on one instance and the flows
spread evenly (Natif's distribution is the agent's; with few flows an instance may get more than
its share, which the margin absorbs): the fewest instances from `min_instances` up, on the cores
with the least other load, a core of its own per instance (CALVIN); when no scale-out fits, one
instance on the least-loaded core (CALVIN re-placement) if that fits. A core already above the
margin is never chosen. Without a busy ratio (no traffic yet, or a function without one) only the
cores' other load is checked.

`OverloadGuard.check` runs before a `set_chain` is sent: it places the chain as the actuator will
(CALVIN's admission control, `actuators.place_chain`), checks each advanced function's instances
on their cores, and when one would be past its limit re-plans (more instances or other cores) or
refuses, saying which instance, core and numbers in the action's result.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from cgloop.policy.nodes import NodeBook, NodeLoad
from cgloop.policy.planners import catalogue, overload
from cgloop.v1 import action_pb2 as apb
from cgloop.v1 import node_agent_pb2 as na

# Offered load stays under this share of R_max (Gallenmüller advises a conservative use of the
# bound; 0.8 is the planner's default, `planners.overload.check_overload`).
DEFAULT_MARGIN = 0.8
# The node agent's default [bounds] max_function_instances.
DEFAULT_MAX_INSTANCES = 4
MAX_OTHER_LOAD = 0.99


class NoCapacity(ValueError):
    """No placement of the function keeps it under margin x R_max; the text says why."""


class Inadmissible(NoCapacity):
    """CALVIN's admission control refuses the chain (latency budget, free cores)."""


@dataclass(frozen=True)
class Fit:
    function: str
    instances: int
    cores: tuple[int, ...]
    offered_pps: float
    t_cpu_s: float | None
    # per chosen core: (other load d_Σ, R_max pps or None without t_CPU)
    limits: tuple[tuple[float, float | None], ...]

    def describe(self) -> str:
        cores = ",".join(map(str, self.cores))
        if self.t_cpu_s is None:
            return f"{self.function}: {self.instances} instance(s) on core(s) {cores}"
        per = self.offered_pps / self.instances
        worst = min(r for _, r in self.limits if r is not None)
        return (
            f"{self.function}: {self.instances} instance(s) on core(s) {cores}, "
            f"{per:.0f} pps each against R_max {worst:.0f} pps"
        )


def other_load(load: NodeLoad, core: int, function: str) -> float:
    """d_Σ of a core for `function`: its utilisation but for the function's own instances."""
    own = sum(i.busy_ratio or 0.0 for i in load.of(function) if i.core == core)
    return min(MAX_OTHER_LOAD, max(0.0, load.cores.get(core, 0.0) - own))


def t_cpu(load: NodeLoad, function: str) -> float | None:
    """The function's CPU time per packet: the most expensive of its instances (conservative)."""
    times = [t for i in load.of(function) if (t := i.t_cpu_s) is not None]
    return max(times) if times else None


def _check_cores(
    load: NodeLoad, function: str, cores: list[int], margin: float
) -> tuple[list[tuple[float, float | None]], list[str]]:
    offered = sum(i.pps for i in load.of(function))
    t = t_cpu(load, function)
    limits: list[tuple[float, float | None]] = []
    problems = []
    for core in cores:
        d = other_load(load, core, function)
        r = overload.r_max_pps(t, d) if t is not None else None
        limits.append((d, r))
        if d >= margin:
            problems.append(f"core {core} is {d:.0%} busy with other work (margin {margin:.0%})")
        elif r is not None and offered / len(cores) > margin * r:
            problems.append(
                f"instance on core {core}: {offered / len(cores):.0f} pps > {margin:.0%} of "
                f"R_max {r:.0f} pps (t_CPU {t * 1e6:.1f} µs, other load {d:.0%})"
            )
    return limits, problems


def fit(
    load: NodeLoad,
    function: str,
    *,
    margin: float = DEFAULT_MARGIN,
    min_instances: int = 1,
    max_instances: int = DEFAULT_MAX_INSTANCES,
    taken: Iterable[int] = (),
    allowed: Iterable[int] | None = None,
) -> Fit:
    """Instances and cores for `function` on this node under margin x R_max (see the module
    docstring); NoCapacity naming the best attempt's problems when nothing fits."""
    taken_set = set(taken)
    allowed_set = set(allowed) if allowed is not None else None
    candidates = sorted(
        (
            c
            for c in load.cores
            if c not in taken_set and (allowed_set is None or c in allowed_set)
        ),
        key=lambda c: (other_load(load, c, function), c),
    )
    if min_instances > max_instances:
        raise NoCapacity(
            f"{function} on {load.node_id}: {min_instances} instances asked, at most "
            f"{max_instances} (the agent's [bounds] max_function_instances)"
        )
    offered = sum(i.pps for i in load.of(function))
    t = t_cpu(load, function)
    lo = max(1, min_instances)
    if t is not None:
        # Natif's instantiation: ceil(required / per-instance capacity), on an idle core.
        lo = max(lo, math.ceil(offered / (margin * overload.r_max_pps(t))))
    tries = list(range(min(lo, max_instances), max_instances + 1))
    if tries[0] > 1:
        tries.append(1)  # no scale-out fits: CALVIN re-placement of the single instance
    seen: dict[str, None] = {}  # every attempt's problems, in order, once each
    for n in tries:
        if n > len(candidates):
            seen[f"{n} instances need {n} free cores, {len(candidates)} available"] = None
            continue
        cores = candidates[:n]
        limits, problems = _check_cores(load, function, cores, margin)
        if not problems:
            return Fit(function, n, tuple(cores), offered, t, tuple(limits))
        seen.update(dict.fromkeys(problems))
    if not candidates:
        seen[f"no free core on {load.node_id} (cores {sorted(load.cores)})"] = None
    raise NoCapacity(f"{function} on {load.node_id}: " + "; ".join(seen))


def pin(chain: apb.SetChainAction, index: int, f: Fit) -> None:
    """Function `index` of the chain on the instances and cores `f` chose, those cores first
    among the chain's free cores (CALVIN's placement hands them out in order). Core 0 is "not
    pinned" in the contract: an instance placed there runs where the scheduler puts it."""
    fn = chain.functions[index]
    fn.instances = f.instances if f.instances > 1 else 0
    del fn.instance_cores[:]
    if f.instances > 1:
        fn.instance_cores.extend(f.cores)
    fn.core = f.cores[0]
    rest = [c for c in chain.free_cores if c not in f.cores]
    del chain.free_cores[:]
    chain.free_cores.extend([*f.cores, *rest])


@dataclass(frozen=True)
class Checked:
    """The guard's word on a set_chain: the spec to send (re-planned or not) and a note."""

    spec: apb.SetChainAction
    note: str = ""


def is_advanced(fn: na.ChainFunction) -> bool:
    """A user-space (AF_XDP) function of the catalogue: the one the guard sizes."""
    spec = catalogue.FUNCTIONS.get(catalogue.name_of(fn))
    return spec is not None and spec.kind == catalogue.ADVANCED


@dataclass
class OverloadGuard:
    nodes: NodeBook
    margin: float = DEFAULT_MARGIN
    max_instances: int = DEFAULT_MAX_INSTANCES

    def check(self, node_id: str, spec: apb.SetChainAction) -> Checked:
        """Admit, re-plan or refuse (NoCapacity, or the CALVIN refusal as ValueError) a chain."""
        from cgloop.policy.actuators import ActuatorError, place_chain

        try:
            placed = place_chain(spec)
        except ActuatorError as exc:
            raise Inadmissible(str(exc)) from None
        load = self.nodes.load(node_id)
        if load is None:
            return Checked(spec, f"no node samples of {node_id} yet: R_max not checked")
        out = apb.SetChainAction()
        out.CopyFrom(spec)
        notes: list[str] = []
        replanned = False
        taken: set[int] = set()
        for i, fn in enumerate(placed.functions):
            if not is_advanced(fn):
                continue
            name = catalogue.name_of(fn)
            cores = list(fn.instance_cores) or ([fn.core] if fn.core else [])
            _, problems = _check_cores(load, name, cores, self.margin) if cores else ([], [])
            if not problems:
                taken.update(cores)
                continue
            f = fit(
                load,
                name,
                margin=self.margin,
                min_instances=len(cores),
                max_instances=self.max_instances,
                taken=taken,
                allowed=spec.free_cores or None,
            )
            taken.update(f.cores)
            pin(out, i, f)
            replanned = True
            notes.append(f"re-planned ({'; '.join(problems)}): {f.describe()}")
        if replanned:
            try:
                place_chain(out)  # the re-plan still passes CALVIN's admission
            except ActuatorError as exc:
                raise Inadmissible(f"re-planned chain refused: {exc}") from None
        return Checked(out, "; ".join(notes))
