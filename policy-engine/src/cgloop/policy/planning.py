"""Planned actions: a policy's `action.plan` has a planner fill in what YAML cannot know.

Two planners, both for `set_chain`, both reading the node samples (`nodes.NodeBook`):

- `scale_out` (Natif, Hajji §6.2; CALVIN): the function a `function_overload` detection names
  (`function`, e.g. "{label:function_name}") gets the instances and cores `capacity.fit`
  chooses on the target node: at least two instances (`min_instances`), each on a core of its
  own among the node's least-loaded ones, each under margin x R_max; when no scale-out fits,
  one instance moved to the least-loaded core (CALVIN re-placement). The agent distributes
  whole flows over the instances (a hash of the five-tuple).
- `place` (Xiang thesis §2.3: LB / LC / LBLC, `planners.sfc`): a gaming session whose flow
  has no chain yet gets one on a node of its path. The candidates are the policy's `candidates`
  (e.g. the edge that saw the flow, "{label:node_id}", and the core router); the first one is
  the service node (the session's edge). Each candidate is an `sfc.Node` whose load is the sum
  of its cores' utilisation (cores' worth of work) and whose slots are its cores free for an
  advanced function (below the overload margin, no advanced instance on them); a candidate
  without samples is left out (none with samples: the service node). The heuristic places the
  chain's advanced functions (each a core of its own, each adding one core of load; a chain of
  basic functions only is one unit): LB on the least-loaded node, ties to the candidate listed
  first (the nearest: the service node), LC on the service node first, LBLC like LB then
  grouped from the service node. A node agent runs a class's whole chain, basic functions in
  BPF before the hand-over, so the node the heuristic gives most units gets the whole chain,
  on the core `capacity.fit` picks there. Each
  session (the detection's subject: its flow) is placed once: the classifier's repeated
  detections of a placed session are dropped (no action, no record) until the placement
  fails or is rolled back.

and one for `set_power_policy`:

- `xman` (Xiang thesis ch. 4, `planners.power`): the node's sampled cores; latency-critical
  are the cores its advanced (user-space) function instances run on (none: the policy's
  `latency_critical`), pinned at the top of the sampled frequency range with C-states off; the
  others run X-MAN within the sampled range (the scaling limits the agent reports, so never a
  limit the node's cpufreq refuses). Without samples the policy's own values are sent.

A planner that cannot plan refuses the action with the reason (`guard plan: …`, or
`guard overload: …` when no placement keeps R_max), recorded like any refusal.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

from cgloop.policy import capacity, decide
from cgloop.policy import detections as dets
from cgloop.policy.guards import Refusal
from cgloop.policy.model import Plan, PlanKind
from cgloop.policy.nodes import NodeBook
from cgloop.policy.planners import catalogue, sfc
from cgloop.v1 import action_pb2 as apb
from cgloop.v1 import detection_pb2 as dpb
from cgloop.v1 import node_agent_pb2 as na


def starved_core(det: dpb.Detection) -> int | None:
    """The core a function_overload says its instance was starved on: the detection's `core`
    label when its evidence shows the worker stalled past the detector's threshold
    (`stalled_ns` >= its threshold) with frames waiting. Another task holds that core, so no
    instance of the function may be placed there. The samples cannot say so yet: the sample
    the detection came from is the hog's first, and per-core load is an interval's average.
    None otherwise, and for core 0, which the contract reads as "not pinned"."""
    ev = {e.name: e for e in det.evidence}
    stalled, waiting = ev.get("stalled_ns"), ev.get("rx_waiting")
    if stalled is None or waiting is None or not (
        stalled.threshold > 0 and stalled.value >= stalled.threshold and waiting.value > 0
    ):
        return None
    try:
        core = int(det.labels.get("core", ""))
    except ValueError:
        return None
    return core if core > 0 else None


class Skip(Exception):
    """Nothing to do (the session's node has its chain already)."""


@dataclass(frozen=True)
class Planned:
    note: str
    session: str = ""  # place: the session placed (the detection's subject key)


def _advanced(chain: apb.SetChainAction) -> list[int]:
    return [
        i
        for i, fn in enumerate(chain.functions)
        if catalogue.FUNCTIONS[catalogue.name_of(fn)].kind == catalogue.ADVANCED
    ]


@dataclass
class Planner:
    nodes: NodeBook
    margin: float = capacity.DEFAULT_MARGIN
    max_instances: int = capacity.DEFAULT_MAX_INSTANCES
    # session (detection subject key) -> id of the action that placed its chain
    placed: OrderedDict[str, str] = field(default_factory=OrderedDict)
    max_placed: int = 100_000

    def plan(self, plan: Plan, det: dpb.Detection, action: apb.Action) -> Planned:
        """Fill in `action` (a set_chain) in place; raises PlanRefused (with the refusal to
        record) or Skip (nothing to do)."""
        if plan.planner is PlanKind.SCALE_OUT:
            return self._scale_out(plan, det, action)
        if plan.planner is PlanKind.XMAN:
            return self._xman(action)
        return self._place(plan, det, action)

    # --- X-MAN power plan --------------------------------------------------------------------

    def _xman(self, action: apb.Action) -> Planned:
        s = action.set_power_policy
        node = action.target.node_id
        load = self.nodes.load(node)
        if load is None or not load.cores:
            return Planned(f"no node samples of {node}: the policy's cores and limits")
        cores = sorted(load.cores)
        critical = sorted(
            {
                i.core
                for i in load.instances
                if i.core in load.cores
                and (spec := catalogue.FUNCTIONS.get(i.function)) is not None
                and spec.kind == catalogue.ADVANCED
            }
        ) or sorted(set(s.latency_critical) & set(cores))
        lows = [lo for lo, _ in load.frequencies.values() if lo]
        highs = [hi for _, hi in load.frequencies.values() if hi]
        del s.cores[:]
        s.cores.extend(cores)
        del s.latency_critical[:]
        s.latency_critical.extend(critical)
        if lows and highs and min(lows) <= max(highs):
            s.min_frequency_khz, s.max_frequency_khz = min(lows), max(highs)
        return Planned(
            f"planned X-MAN on cores {','.join(map(str, cores))}: latency-critical "
            f"{','.join(map(str, critical)) or 'none'} pinned at {s.max_frequency_khz} kHz, "
            f"C-states off; the others {s.min_frequency_khz}..{s.max_frequency_khz} kHz"
        )

    # --- Natif scale-out ---------------------------------------------------------------------

    def _scale_out(self, plan: Plan, det: dpb.Detection, action: apb.Action) -> Planned:
        s = action.set_chain
        node = action.target.node_id
        advanced = _advanced(s)
        name = decide.resolve(plan.function, det) if plan.function else ""
        if name:
            at = [i for i in advanced if catalogue.name_of(s.functions[i]) == name]
            if not at:
                known = ", ".join(catalogue.name_of(s.functions[i]) for i in advanced)
                raise PlanRefused(
                    "plan",
                    f"function {name!r} is not an advanced function of chain {s.chain_id} "
                    f"(advanced: {known or 'none'})",
                )
        else:
            at = advanced[:1]
            if not at:
                raise PlanRefused("plan", f"chain {s.chain_id} has no advanced function to scale")
        load = self.nodes.load(node)
        if load is None:
            raise PlanRefused("plan", f"no node samples of {node} yet: cannot size the scale-out")
        fn = s.functions[at[0]]
        starved = starved_core(det)
        try:
            f = capacity.fit(
                load,
                catalogue.name_of(fn),
                margin=self.margin,
                min_instances=plan.min_instances,
                max_instances=self.max_instances,
                taken=[starved] if starved is not None else (),
                allowed=s.free_cores or None,
            )
        except capacity.NoCapacity as exc:
            raise PlanRefused("overload", str(exc)) from None
        _pin(s, at[0], f)
        how = "scale-out" if f.instances > 1 else "re-placement (no scale-out fits)"
        return Planned(f"planned {how}: {f.describe()}")

    # --- LB / LC / LBLC placement of a new session's chain -----------------------------------



    def _place(self, plan: Plan, det: dpb.Detection, action: apb.Action) -> Planned:
        s = action.set_chain
        try:
            candidates = [decide.resolve(c, det) for c in plan.candidates]
        except decide.MissingLabel as exc:
            raise PlanRefused("target", f"{exc}; cannot resolve the placement candidates") from None
        candidates = list(dict.fromkeys(c for c in candidates if c))
        if not candidates:
            raise PlanRefused("plan", "no placement candidates")
        service = candidates[0]
        advanced = _advanced(s)
        session = dets.subject_key(det)
        if session in self.placed:
            raise Skip
        chain = na.ServiceChain(chain_id=s.chain_id, traffic_class=s.traffic_class)
        chain.functions.extend(s.functions)
        try:
            catalogue.check_chain(chain)  # what the agent would refuse, refused here
        except catalogue.CatalogueError as exc:
            raise PlanRefused("plan", str(exc)) from None
        # What the heuristics place: the functions that need capacity, each advanced one a core
        # of its own (CALVIN); the basic ones run in BPF beside it on the same node. A chain of
        # basic functions only is one unit.
        units = [catalogue.name_of(s.functions[i]) for i in advanced] or [s.chain_id]
        loads = {c: self.nodes.load(c) for c in candidates}
        nodes = []
        for c in candidates:
            load = loads[c]
            if load is None:
                continue
            taken = {
                i.core
                for i in load.instances
                if (spec := catalogue.FUNCTIONS.get(i.function)) is not None
                and spec.kind == catalogue.ADVANCED
            }
            free = [k for k, u in load.cores.items() if u < self.margin and k not in taken]
            # Load in cores' worth of work: each unit placed adds one (a core).
            nodes.append(
                sfc.Node(c, slots=len(free) if advanced else 1, load=sum(load.cores.values()))
            )
        if nodes:
            h = plan.heuristic.value
            try:
                if h == "lb":
                    mapping = sfc.lb(units, nodes)
                elif h == "lc":
                    mapping = sfc.lc(units, nodes, service if loads[service] else nodes[0].name)
                else:
                    mapping = sfc.lblc(units, nodes, service)
            except ValueError as exc:
                raise PlanRefused("plan", f"{h}: {exc}") from None
            node = max(dict.fromkeys(mapping), key=mapping.count)
        else:
            node = service
        action.target.node_id = node
        why = ", ".join(
            f"{n.name} (load {n.load:.1f} cores, {n.slots} slots)" for n in nodes
        ) or f"no node samples: the service node {service}"
        load = loads.get(node)
        note = f"placed by {plan.heuristic.value.upper()} on {node}: candidates {why}"
        if load is not None:
            for i in advanced:
                fn = s.functions[i]
                try:
                    f = capacity.fit(load, catalogue.name_of(fn), margin=self.margin)
                except capacity.NoCapacity as exc:
                    raise PlanRefused("overload", str(exc)) from None
                _pin(s, i, f)
                note += f"; {f.describe()}"
        return Planned(note, session)

    def committed(self, planned: Planned, action: apb.Action) -> None:
        """The placement passed the guards: the session's chain is on its way."""
        if planned.session:
            self.placed[planned.session] = action.id
            while len(self.placed) > self.max_placed:
                self.placed.popitem(last=False)

    def forget(self, action: apb.Action) -> None:
        """The placement failed or was rolled back: the session may be placed again."""
        for session, action_id in list(self.placed.items()):
            if action_id == action.id:
                del self.placed[session]


class PlanRefused(Exception):
    def __init__(self, guard: str, reason: str) -> None:
        super().__init__(reason)
        self.refusal = Refusal(guard, reason)


def _pin(chain: apb.SetChainAction, index: int, f: capacity.Fit) -> None:
    """The function's instances on the cores `f` chose; those cores first among the chain's
    free cores, which CALVIN's placement hands out in order (core 0 is "not pinned" in the
    contract: a function placed there runs where the scheduler puts it)."""
    capacity.pin(chain, index, f)
