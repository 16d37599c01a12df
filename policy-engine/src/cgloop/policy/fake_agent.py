"""An in-memory NodeAgentService served over real gRPC on loopback (tests and benchmarks).

It implements the agent's wire contract (idempotency by action_id with `replayed` answers, dry
runs, previous values for rollback) on dictionaries instead of tc, BPF maps and sysfs, and
records every call. It refuses what the real agent refuses, with the same status codes and
wording: the bounds guard (`AgentBounds`, the agent's bounds.rs), queue hierarchies
(queues.rs), flow rules into leaf classes only, and chains through the chain-function
catalogue both read from node_agent.proto (`planners.catalogue`, the agent's chains.rs).
tests/test_node_agent_netns.py sends the same requests to both and compares the answers.
What needs the node itself is not modelled: whether a mirror's interface exists (the real agent
answers NOT_FOUND), the kernel's answers. GetState reports what was applied, shaped as the real
agent reports it.
"""

from __future__ import annotations

import json
import os
import threading
import time
from concurrent import futures
from dataclasses import dataclass, field

import grpc
from cgloop.policy import fake_guard
from cgloop.policy.fake_guard import handle
from cgloop.policy.planners import catalogue
from cgloop.v1 import node_agent_pb2 as na
from cgloop.v1 import node_agent_pb2_grpc as na_grpc

MAX_DEPTH = 8  # HTB's levels (queues.rs)


def hierarchy(interface: str = "veth0", ceil_bps: int = 1_000_000_000) -> na.QueueHierarchy:
    """The tests' standard tree: root 1:1, gaming 1:10, l4s 1:20, best-effort 1:30 (default)."""
    h = na.QueueHierarchy(interface_name=interface, default_class_id=0x10030)
    h.classes.add(name="root", class_id=0x10001, rate_bps=ceil_bps, ceil_bps=ceil_bps)
    for name, minor, prio in (("gaming", 0x10, 0), ("l4s", 0x20, 1), ("best-effort", 0x30, 7)):
        h.classes.add(
            name=name,
            class_id=0x10000 | minor,
            parent_class_id=0x10001,
            rate_bps=ceil_bps // 4,
            ceil_bps=ceil_bps,
            priority=prio,
        )
    return h


class Refused(Exception):
    """A request the agent refuses: its gRPC status code and message."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass
class AgentBounds:
    """The real agent's `[bounds]` that a request can break, with its defaults (config.rs) and
    its rules (bounds.rs): interfaces a request names (`["*"]` = any), cores (online on the
    node, and in `cores` when set), rates in bit/s, a child class never faster than its
    parent's ceil, counts of classes and chain functions."""

    interfaces: list[str] = field(default_factory=lambda: ["*"])
    cores: list[int] = field(default_factory=list)
    online_cpus: list[int] = field(default_factory=lambda: sorted(os.sched_getaffinity(0)))
    min_rate_bps: int = 8_000
    max_rate_bps: int = 100_000_000_000
    max_chain_functions: int = 8
    max_chains: int = 128
    # Natif's scale-out: most instances of an advanced function (ChainFunction.instances).
    max_function_instances: int = 4
    max_classes: int = 64
    max_burst_bytes: int = 64 * 1024 * 1024
    # The agent's [guard] max_protected_flows (ProtectFlows).
    max_protected_flows: int = 256
    # Each core's cpufreq range (cpuinfo_min_freq..cpuinfo_max_freq, kHz): a power policy's
    # limits outside it are refused (power/manager.rs). The default takes any CPU's; the lab's
    # emulated tree has 1.2..3.0 GHz (cgloop.loop.power).
    cpuinfo_khz: tuple[int, int] = (400_000, 5_000_000)

    def interface(self, what: str, name: str) -> None:
        if not name:
            raise Refused(grpc.StatusCode.INVALID_ARGUMENT, f"{what} is empty: name an interface")
        if "*" not in self.interfaces and name not in self.interfaces:
            raise Refused(
                grpc.StatusCode.PERMISSION_DENIED,
                f"{what}: interface {json.dumps(name)} is not in the agent's [bounds] "
                f"interfaces {json.dumps(self.interfaces)}",
            )

    def core(self, what: str, core: int) -> None:
        if core not in self.online_cpus:
            raise Refused(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"{what}: core {core} does not exist on this node (online CPUs: "
                f"{cpu_list(self.online_cpus)})",
            )
        if self.cores and core not in self.cores:
            raise Refused(
                grpc.StatusCode.PERMISSION_DENIED,
                f"{what}: core {core} is not in the agent's [bounds] cores {self.cores}",
            )

    def rate(self, what: str, bps: int) -> None:
        if not self.min_rate_bps <= bps <= self.max_rate_bps:
            raise Refused(
                grpc.StatusCode.OUT_OF_RANGE,
                f"{what} {bps} is outside the bounds {self.min_rate_bps}..{self.max_rate_bps}",
            )

    def chain(self, chain: na.ServiceChain) -> None:
        """Guard::chain: the count, each function's core and the interfaces and rates its
        parameters name (as the catalogue declares them)."""
        max_fns = min(self.max_chain_functions, 8)  # the datapath's MAX_CHAIN_FNS
        if len(chain.functions) > max_fns:
            raise Refused(
                grpc.StatusCode.OUT_OF_RANGE,
                f"chain {chain.chain_id} has {len(chain.functions)} functions; "
                f"the bound is {max_fns}",
            )
        for pos, fn in enumerate(chain.functions):
            at = f'chain function #{pos} "{catalogue.name_of(fn)}"'
            if fn.core:  # 0: not pinned
                self.core(f"{at}: core", fn.core)
            if catalogue.spec_of(fn) is None:
                continue  # the catalogue check names it
            try:
                catalogue.check_instances(fn, pos, self.max_function_instances)
            except catalogue.CatalogueError as e:
                raise Refused(grpc.StatusCode.INVALID_ARGUMENT, str(e)) from e
            for i, core in enumerate(fn.instance_cores):
                if core:  # 0: not pinned
                    self.core(f"{at}: instance_cores[{i}]", core)
            for param, value in catalogue.values(fn):
                if param.interface and param.type == "str":
                    self.interface(f"{at}: parameter {param.name}", value.strip())
                if param.rate and param.type == "uint":
                    self.rate(f"{at}: parameter {param.name}", int(value))

    def hierarchy(self, h: na.QueueHierarchy) -> None:
        """queues.rs `validate` and Guard::hierarchy_rates."""
        invalid = grpc.StatusCode.INVALID_ARGUMENT
        if not h.interface_name:
            raise Refused(invalid, "hierarchy.interface_name is empty")
        if len(h.classes) > self.max_classes:
            raise Refused(
                grpc.StatusCode.OUT_OF_RANGE,
                f"{len(h.classes)} classes requested; the bound is {self.max_classes}",
            )
        if not h.classes:
            return
        major = h.classes[0].class_id >> 16
        by_id: dict[int, na.HtbClass] = {}
        names: set[str] = set()
        for c in h.classes:
            cid = handle(c.class_id)
            if not c.name:
                raise Refused(invalid, f"class {cid} has no name")
            if c.name in names:
                raise Refused(invalid, f"class name {json.dumps(c.name)} is used twice")
            names.add(c.name)
            if c.class_id >> 16 == 0 or c.class_id & 0xFFFF == 0:
                raise Refused(
                    invalid,
                    f"class {c.name} ({cid}): class_id needs a major and a non-zero minor, "
                    "e.g. 1:10 = 0x00010010",
                )
            if c.class_id >> 16 != major:
                raise Refused(
                    invalid, f"class {c.name} ({cid}): all classes must share the major {major:x}"
                )
            if c.parent_class_id and c.parent_class_id >> 16 != major:
                raise Refused(
                    invalid,
                    f"class {c.name} ({cid}): parent {handle(c.parent_class_id)} is under "
                    "another qdisc",
                )
            if c.class_id in by_id:
                raise Refused(invalid, f"class_id {cid} is used twice")
            by_id[c.class_id] = c
            if c.priority > 7:
                raise Refused(
                    invalid, f"class {c.name} ({cid}): priority {c.priority} is not within 0..7"
                )
            for what, v in (("burst_bytes", c.burst_bytes), ("cburst_bytes", c.cburst_bytes)):
                if v > self.max_burst_bytes:
                    raise Refused(
                        grpc.StatusCode.OUT_OF_RANGE,
                        f"class {c.name} ({cid}): {what} {v} exceeds the bound "
                        f"{self.max_burst_bytes}",
                    )
        for c in h.classes:
            depth, cur = 0, c.parent_class_id
            while cur:
                if cur not in by_id:
                    raise Refused(
                        invalid,
                        f"class {c.name} ({handle(c.class_id)}): parent {handle(cur)} is not in "
                        "the hierarchy",
                    )
                depth += 1
                if depth > MAX_DEPTH:
                    raise Refused(
                        invalid,
                        f"class {c.name} ({handle(c.class_id)}): deeper than HTB's {MAX_DEPTH} "
                        "levels, or a cycle",
                    )
                cur = by_id[cur].parent_class_id
        for c in h.classes:
            cid = handle(c.class_id)
            for what, v in (("rate_bps", c.rate_bps), ("ceil_bps", c.ceil_bps)):
                self.rate(f"class {c.name} ({cid}): {what}", v)
            if c.ceil_bps < c.rate_bps:
                raise Refused(
                    invalid,
                    f"class {c.name} ({cid}): ceil_bps {c.ceil_bps} is below rate_bps {c.rate_bps}",
                )
            p = by_id.get(c.parent_class_id) if c.parent_class_id else None
            for what, v in (("rate_bps", c.rate_bps), ("ceil_bps", c.ceil_bps)):
                if p is not None and v > p.ceil_bps:
                    raise Refused(
                        invalid,
                        f"class {c.name} ({cid}): {what} {v} exceeds the ceil_bps {p.ceil_bps} "
                        f"of its parent {p.name} ({handle(p.class_id)})",
                    )
        parents = {c.parent_class_id for c in h.classes}
        default = h.default_class_id
        if default not in by_id:
            raise Refused(
                invalid, f"default_class_id {handle(default)} is not a class of the hierarchy"
            )
        if default in parents:
            raise Refused(
                invalid,
                f"default_class_id {handle(default)} has children; HTB queues only in leaf classes",
            )


def cpu_list(cpus: list[int]) -> str:
    """The kernel's CPU list form ("0-3,6"), as the agent writes it."""
    parts, run = [], []
    for c in sorted(cpus):
        if run and c != run[-1] + 1:
            parts.append(run)
            run = []
        run.append(c)
    if run:
        parts.append(run)
    return ",".join(str(r[0]) if len(r) == 1 else f"{r[0]}-{r[-1]}" for r in parts)


def leaves(h: na.QueueHierarchy) -> set[int]:
    parents = {c.parent_class_id for c in h.classes}
    return {c.class_id for c in h.classes if c.class_id not in parents}


def reported(chain: na.ServiceChain) -> na.ServiceChain:
    """A chain as the agent's GetState reads it back from its datapath: each function with its
    catalogue kind, rates in whole bytes/s (the datapath keeps bytes/s), counters zero."""
    out = na.ServiceChain()
    out.CopyFrom(chain)
    for fn in out.functions:
        spec = catalogue.spec_of(fn)
        if spec is not None:
            fn.kind = spec.kind
        if catalogue.name_of(fn) == "rate_limit":
            fn.rate_limit.rate_bps -= fn.rate_limit.rate_bps % 8
        fn.packets = fn.dropped_packets = 0
    return out


@dataclass
class MemoryAgentState:
    flow_rules: dict[tuple[str, bytes], na.FlowClassRule] = field(default_factory=dict)
    # interface -> its HTB tree, classes as applied (SetClassRate changes them in place)
    hierarchies: dict[str, na.QueueHierarchy] = field(default_factory=dict)
    chains: dict[str, na.ServiceChain] = field(default_factory=dict)
    power: dict[int, na.PowerPolicy] = field(default_factory=dict)
    # (interface, serialised five-tuple) -> the latency guard's protection (fake_guard)
    protections: dict[fake_guard.Key, na.ProtectedFlow] = field(default_factory=dict)
    generation: int = 0


class MemoryNodeAgent(na_grpc.NodeAgentServiceServicer):
    """`hierarchies`: the queue trees in place at start (default: `hierarchy("veth0")`, as a
    real agent after that ApplyQueueHierarchy; pass `()` for an agent with none)."""

    def __init__(
        self,
        node_id: str = "node-a",
        apply_delay_s: float = 0.0,
        bounds: AgentBounds | None = None,
        hierarchies: tuple[na.QueueHierarchy, ...] | list[na.QueueHierarchy] | None = None,
    ) -> None:
        self.node_id = node_id
        self.bounds = bounds or AgentBounds()
        self.state = MemoryAgentState()
        for h in (hierarchy(),) if hierarchies is None else hierarchies:
            self.seed_hierarchy(h)
        self.calls: list[tuple[str, str]] = []  # (method, action_id)
        self.changes = 0  # applies that changed something (not replays, not dry runs)
        self.apply_delay_s = apply_delay_s
        self._replies: dict[str, object] = {}
        self._lock = threading.Lock()

    def seed_hierarchy(self, h: na.QueueHierarchy) -> None:
        """Puts a queue tree in place without a call (checked as ApplyQueueHierarchy would)."""
        self.bounds.hierarchy(h)
        self.state.hierarchies[h.interface_name] = _copy(h)

    def _outcome(self, changed: bool, dry_run: bool, start: int, msg: str) -> na.ApplyOutcome:
        return na.ApplyOutcome(
            changed=changed and not dry_run,
            dry_run=dry_run,
            apply_latency_ns=time.monotonic_ns() - start,
            applied_ns=time.time_ns(),
            message=msg,
        )

    def _once(self, method: str, request, context, build):
        with self._lock:
            self.calls.append((method, request.action_id))
            if request.action_id and request.action_id in self._replies:
                reply = type(self._replies[request.action_id])()
                reply.CopyFrom(self._replies[request.action_id])
                reply.outcome.replayed = True
                return reply
            if self.apply_delay_s:
                time.sleep(self.apply_delay_s)
            try:
                reply = build(time.monotonic_ns())
            except Refused as e:
                context.abort(e.code, str(e))
            except catalogue.CatalogueError as e:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
            if reply.outcome.changed:
                self.changes += 1
                self.state.generation += 1
            if request.action_id and not request.dry_run:
                self._replies[request.action_id] = reply
            return reply

    def _tree(self, interface: str) -> na.QueueHierarchy:
        h = self.state.hierarchies.get(interface)
        if h is None:
            raise Refused(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"interface {interface} has no queue hierarchy from this agent; apply one first",
            )
        return h

    def _classes(self, interface: str) -> tuple[set[int], set[int]]:
        """The leaf classes and all classes of the interface's tree (refused without one)."""
        h = self._tree(interface)
        return leaves(h), {c.class_id for c in h.classes}

    def ApplyQueueHierarchy(self, request, context):
        def build(start: int) -> na.ApplyQueueHierarchyResponse:
            h = request.hierarchy
            self.bounds.interface("hierarchy.interface_name", h.interface_name)
            self.bounds.hierarchy(h)
            keep = leaves(h)
            for r in self.state.flow_rules.values():
                if r.interface_name == h.interface_name and r.class_id not in keep:
                    raise Refused(
                        grpc.StatusCode.FAILED_PRECONDITION,
                        f"class {handle(r.class_id)} is used by a flow/DSCP rule on "
                        f"{h.interface_name} and would no longer be a leaf class; move the "
                        "rule first",
                    )
            prev = self.state.hierarchies.get(h.interface_name)
            if not request.dry_run:
                if h.classes:
                    self.state.hierarchies[h.interface_name] = _copy(h)
                else:
                    self.state.hierarchies.pop(h.interface_name, None)
            resp = na.ApplyQueueHierarchyResponse(
                outcome=self._outcome(prev != h, request.dry_run, start, "tc htb"), applied=h
            )
            if prev is not None:
                resp.previous.CopyFrom(prev)
            return resp

        return self._once("ApplyQueueHierarchy", request, context, build)

    def SetFlowClass(self, request, context):
        def build(start: int) -> na.SetFlowClassResponse:
            rule = request.rule
            iface = rule.interface_name
            self.bounds.interface("rule.interface_name", iface)
            if rule.class_id:
                h = self._tree(iface)
                if rule.class_id not in leaves(h):
                    if any(c.class_id == rule.class_id for c in h.classes):
                        raise Refused(
                            grpc.StatusCode.INVALID_ARGUMENT,
                            f"class {handle(rule.class_id)} on {iface} has children; steer "
                            "flows into a leaf class",
                        )
                    raise Refused(
                        grpc.StatusCode.NOT_FOUND,
                        f"interface {iface} has no class {handle(rule.class_id)}",
                    )
            if rule.HasField("rewrite_dscp") and rule.rewrite_dscp > 63:
                raise Refused(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    f"rewrite_dscp {rule.rewrite_dscp} is not within 0..63",
                )
            has_flow, has_dscp = rule.HasField("flow"), rule.HasField("match_dscp")
            if has_flow and has_dscp:
                raise Refused(
                    grpc.StatusCode.INVALID_ARGUMENT, "set either flow or match_dscp, not both"
                )
            if not has_flow and not has_dscp:
                raise Refused(
                    grpc.StatusCode.INVALID_ARGUMENT, "rule needs a flow (5-tuple) or match_dscp"
                )
            if has_dscp and rule.match_dscp > 63:
                raise Refused(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    f"match_dscp {rule.match_dscp} is not within 0..63",
                )
            what = rule.flow.SerializeToString() if has_flow else b"dscp:%d" % rule.match_dscp
            key = (iface, what)
            prev = self.state.flow_rules.get(key)
            stored = _copy(rule)
            stored.matched_packets = 0
            if not request.dry_run:
                if rule.class_id:
                    self.state.flow_rules[key] = stored
                else:  # class 0 removes the rule
                    self.state.flow_rules.pop(key, None)
            changed = prev != stored and not (prev is None and rule.class_id == 0)
            resp = na.SetFlowClassResponse(
                outcome=self._outcome(changed, request.dry_run, start, "bpf flow_class"),
                applied=rule,
            )
            if prev is not None:
                resp.previous.CopyFrom(prev)
            return resp

        return self._once("SetFlowClass", request, context, build)

    def SetClassRate(self, request, context):
        def build(start: int) -> na.SetClassRateResponse:
            iface = request.interface_name
            self.bounds.interface("interface_name", iface)
            h = self._tree(iface)
            prev = next((c for c in h.classes if c.class_id == request.class_id), None)
            if prev is None:
                raise Refused(
                    grpc.StatusCode.NOT_FOUND,
                    f"interface {iface} has no class {handle(request.class_id)}",
                )
            changed_tree = _copy(h)
            for c in changed_tree.classes:
                if c.class_id == request.class_id:
                    c.rate_bps, c.ceil_bps = request.rate_bps, request.ceil_bps
            self.bounds.hierarchy(changed_tree)
            new = next(c for c in changed_tree.classes if c.class_id == request.class_id)
            previous = _copy(prev)
            if not request.dry_run:
                self.state.hierarchies[iface] = changed_tree
            changed = (prev.rate_bps, prev.ceil_bps) != (request.rate_bps, request.ceil_bps)
            return na.SetClassRateResponse(
                outcome=self._outcome(changed, request.dry_run, start, "tc class change"),
                applied=new,
                previous=previous,
            )

        return self._once("SetClassRate", request, context, build)

    def SetChain(self, request, context):
        def build(start: int) -> na.SetChainResponse:
            if not request.HasField("chain"):
                raise Refused(grpc.StatusCode.INVALID_ARGUMENT, "chain is missing")
            chain = request.chain
            if not chain.traffic_class:
                raise Refused(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    "chain.traffic_class is empty: name the HTB class the chain serves",
                )
            self.bounds.chain(chain)
            catalogue.check_chain(chain)
            targets = [
                i
                for i, h in self.state.hierarchies.items()
                if any(c.name == chain.traffic_class for c in h.classes)
            ]
            if not targets and chain.functions:
                raise Refused(
                    grpc.StatusCode.FAILED_PRECONDITION,
                    f"no queue hierarchy has a class named {json.dumps(chain.traffic_class)}; "
                    "apply one first",
                )
            prev = self.state.chains.get(chain.traffic_class)
            stored = _copy(chain)
            for fn in stored.functions:
                fn.packets = fn.dropped_packets = 0
            if (
                prev is None
                and chain.functions
                and len(self.state.chains) >= self.bounds.max_chains
            ):
                raise Refused(
                    grpc.StatusCode.OUT_OF_RANGE,
                    f"{len(self.state.chains)} chains in place; the bound is "
                    f"{self.bounds.max_chains}",
                )
            changed = prev != stored and not (prev is None and not chain.functions)
            if not request.dry_run:
                if chain.functions:
                    self.state.chains[chain.traffic_class] = stored
                else:
                    self.state.chains.pop(chain.traffic_class, None)
            resp = na.SetChainResponse(
                outcome=self._outcome(changed, request.dry_run, start, "chain"), applied=chain
            )
            if prev is not None:
                resp.previous.CopyFrom(prev)
            return resp

        return self._once("SetChain", request, context, build)

    def SetPowerPolicy(self, request, context):
        def build(start: int) -> na.SetPowerPolicyResponse:
            for i, core in enumerate(request.policy.cores):
                self.bounds.core(f"policy.cores[{i}]", core)
            lo, hi = self.bounds.cpuinfo_khz
            p = request.policy
            low, high = p.min_frequency_khz or lo, p.max_frequency_khz or hi
            if low < lo or high > hi or low > high:
                core = p.cores[0] if p.cores else 0
                raise Refused(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    f"power policy: limits {low}..{high} kHz outside the allowed {lo}..{hi} kHz "
                    f"of policy{core} or inverted",
                )
            if p.forbid_cstates:
                # The agent's bound (power_glue.rs check_cstates): the cores it keeps out of
                # C-states after this policy, those an earlier policy forbade included, at most
                # max_cstate_forbidden_cores (default: all cores but one, at least one).
                cpus = self.bounds.online_cpus
                limit = max(len(cpus) - 1, 1)
                after = sorted(
                    {c for c, q in self.state.power.items() if q.forbid_cstates} | set(p.cores)
                )
                if len(after) > limit:
                    raise Refused(
                        grpc.StatusCode.OUT_OF_RANGE,
                        f"policy.forbid_cstates: cores {after} would be kept out of C-states, "
                        f"more than max_cstate_forbidden_cores = {limit}",
                    )
            prev = {c: self.state.power.get(c) for c in request.policy.cores}
            if not request.dry_run:
                for c in request.policy.cores:
                    self.state.power[c] = request.policy
            return na.SetPowerPolicyResponse(
                outcome=self._outcome(True, request.dry_run, start, "cpufreq"),
                applied=request.policy,
                previous=_groups(prev),
            )

        return self._once("SetPowerPolicy", request, context, build)

    def ProtectFlows(self, request, context):
        def build(start: int) -> na.ProtectFlowsResponse:
            if not request.flows:
                raise Refused(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    "flows is empty: name a flow to protect (or to release with ttl_ns 0)",
                )
            for i, p in enumerate(request.flows):
                self.bounds.interface(f"flows[{i}].interface_name", p.interface_name)
                problem = fake_guard.check(i, p, self._classes)
                if problem is not None:
                    raise Refused(*problem)
            now = time.time_ns()
            fake_guard.expire(self.state.protections, now)
            after, resp, changed, summary = fake_guard.protect(
                self.state.protections, request, now
            )
            problem = fake_guard.too_many(after, self.bounds.max_protected_flows)
            if problem is not None:
                raise Refused(*problem)
            if not request.dry_run:
                self.state.protections = after
            resp.outcome.CopyFrom(self._outcome(changed, request.dry_run, start, summary))
            return resp

        return self._once("ProtectFlows", request, context, build)

    def GetPowerState(self, request, context):
        """What the agent reads back from its cpufreq/cpuidle tree: each core's limits and
        governor as set (the kernel's defaults for a core never set), and C-states forbidden
        where a policy forbade them (only POLL left enabled)."""
        with self._lock:
            self.calls.append(("GetPowerState", ""))
            lo, hi = self.bounds.cpuinfo_khz
            cores = list(request.cores) or list(self.bounds.online_cpus)
            resp = na.GetPowerStateResponse(policies=_groups(self.state.power))
            for core in cores:
                pol = self.state.power.get(core)
                low = (pol.min_frequency_khz if pol else 0) or lo
                high = (pol.max_frequency_khz if pol else 0) or hi
                resp.cores.add(
                    core=core,
                    frequency_khz=high,
                    min_frequency_khz=low,
                    max_frequency_khz=high,
                    governor=(pol.governor if pol else "") or "schedutil",
                )
                forbidden = bool(pol and pol.forbid_cstates)
                resp.idle.add(
                    core=core,
                    cstates_forbidden=forbidden,
                    enabled_idle_states=["POLL"] if forbidden else ["POLL", "haltpoll"],
                )
            return resp

    def GetState(self, request, context):
        with self._lock:
            self.calls.append(("GetState", ""))
            fake_guard.expire(self.state.protections, time.time_ns())
            return na.GetStateResponse(
                state=na.NodeState(
                    node_id=self.node_id,
                    generation=self.state.generation,
                    timestamp_ns=time.time_ns(),
                    queues=[_copy(h) for h in self.state.hierarchies.values()],
                    flow_classes=list(self.state.flow_rules.values()),
                    power_policies=_groups(self.state.power),
                    chains=[reported(c) for c in self.state.chains.values()],
                    protected_flows=list(self.state.protections.values()),
                )
            )


def _copy(msg):
    out = type(msg)()
    out.CopyFrom(msg)
    return out


def _groups(policies: dict[int, na.PowerPolicy | None]) -> list[na.PowerPolicy]:
    """Cores that share a setting, one policy each (a core never set: the kernel's default)."""
    groups: dict[bytes, na.PowerPolicy] = {}
    for core, pol in sorted(policies.items()):
        base = pol or na.PowerPolicy(governor="schedutil", xman_mode=na.XMAN_MODE_OFF)
        g = _copy(base)
        del g.cores[:]
        key = g.SerializeToString(deterministic=True)
        groups.setdefault(key, g).cores.append(core)
    return list(groups.values())


class AgentServer:
    """Serves a MemoryNodeAgent on 127.0.0.1:<free port>; use as a context manager."""

    def __init__(self, agent: MemoryNodeAgent | None = None, workers: int = 4) -> None:
        self.agent = agent or MemoryNodeAgent()
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=workers))
        na_grpc.add_NodeAgentServiceServicer_to_server(self.agent, self.server)
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.address = f"127.0.0.1:{self.port}"

    def __enter__(self) -> AgentServer:
        self.server.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.stop(grace=None).wait(5)
