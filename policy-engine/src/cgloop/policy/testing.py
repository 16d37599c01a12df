"""Test support: detection and probe builders, a manual clock, and an in-memory
NodeAgentService served over real gRPC on loopback (for tests and benchmarks).

The in-memory agent implements the agent's wire contract (idempotency by action_id with
`replayed` answers, dry runs, previous values for rollback) on dictionaries instead of tc and
sysfs, and records every call. It refuses what the real agent's bounds guard refuses, with the
same status codes (`AgentBounds`, checked against the real agent by
tests/test_node_agent_netns.py). The real Rust agent is exercised against the engine by the
end-to-end tests.
"""

from __future__ import annotations

import ipaddress
import itertools
import os
import threading
import time
import uuid
from concurrent import futures
from dataclasses import dataclass, field

import grpc
from cgloop.contracts import SCHEMA_VERSION
from cgloop.v1 import detection_pb2 as dpb
from cgloop.v1 import node_agent_pb2 as na
from cgloop.v1 import node_agent_pb2_grpc as na_grpc
from cgloop.v1.common_pb2 import FiveTuple, RecordHeader
from cgloop.v1.probe_pb2 import ProbeRecordBatch


@dataclass
class AgentBounds:
    """The real agent's `[bounds]` that a request can break, with its defaults
    (actuators/node-agent/src/config.rs) and its rules (bounds.rs): interfaces a request names
    (`["*"]` = any), cores (online on the node, and in `cores` when set), rates in bit/s, a
    child class never faster than its parent's ceil, at most `max_chain_functions`."""

    interfaces: list[str] = field(default_factory=lambda: ["*"])
    cores: list[int] = field(default_factory=list)
    online_cpus: list[int] = field(default_factory=lambda: sorted(os.sched_getaffinity(0)))
    min_rate_bps: int = 8_000
    max_rate_bps: int = 100_000_000_000
    max_chain_functions: int = 8

    def interface(self, context, what: str, name: str) -> None:
        if not name:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"{what} is empty: name an interface")
        if "*" not in self.interfaces and name not in self.interfaces:
            context.abort(
                grpc.StatusCode.PERMISSION_DENIED,
                f"{what}: interface {name!r} is not in the agent's [bounds] interfaces "
                f"{self.interfaces}",
            )

    def core(self, context, what: str, core: int) -> None:
        if core not in self.online_cpus:
            context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"{what}: core {core} does not exist on this node (online: {self.online_cpus})",
            )
        if self.cores and core not in self.cores:
            context.abort(
                grpc.StatusCode.PERMISSION_DENIED,
                f"{what}: core {core} is not in the agent's [bounds] cores {self.cores}",
            )

    def rate(self, context, what: str, bps: int) -> None:
        if not self.min_rate_bps <= bps <= self.max_rate_bps:
            context.abort(
                grpc.StatusCode.OUT_OF_RANGE,
                f"{what} {bps} is outside the bounds {self.min_rate_bps}..{self.max_rate_bps}",
            )

    def chain(self, context, chain: na.ServiceChain) -> None:
        if len(chain.functions) > self.max_chain_functions:
            context.abort(
                grpc.StatusCode.OUT_OF_RANGE,
                f"chain {chain.chain_id} has {len(chain.functions)} functions; "
                f"the bound is {self.max_chain_functions}",
            )
        for pos, fn in enumerate(chain.functions):
            at = f"chain function #{pos} {fn.name!r}"
            if fn.core:  # 0: not pinned
                self.core(context, f"{at}: core", fn.core)
            for key, value in fn.params.items():
                if key in ("interface", "redirect") or key.endswith("_interface"):
                    self.interface(context, f"{at}: parameter {key}", value.strip())
                if (key == "rate_bps" or key.endswith("_rate_bps")) and value.strip().isdigit():
                    self.rate(context, f"{at}: parameter {key}", int(value))


@dataclass
class MemoryAgentState:
    flow_rules: dict[tuple[str, bytes], na.FlowClassRule] = field(default_factory=dict)
    classes: dict[tuple[str, int], na.HtbClass] = field(default_factory=dict)
    chains: dict[str, na.ServiceChain] = field(default_factory=dict)
    power: dict[int, na.PowerPolicy] = field(default_factory=dict)
    queues: list[na.QueueHierarchy] = field(default_factory=list)
    generation: int = 0


class MemoryNodeAgent(na_grpc.NodeAgentServiceServicer):
    def __init__(
        self,
        node_id: str = "node-a",
        apply_delay_s: float = 0.0,
        bounds: AgentBounds | None = None,
    ) -> None:
        self.node_id = node_id
        self.bounds = bounds or AgentBounds()
        self.state = MemoryAgentState()
        self.calls: list[tuple[str, str]] = []  # (method, action_id)
        self.changes = 0  # applies that changed something (not replays, not dry runs)
        self.apply_delay_s = apply_delay_s
        self._replies: dict[str, object] = {}
        self._lock = threading.Lock()

    def _outcome(self, changed: bool, dry_run: bool, start: int, msg: str) -> na.ApplyOutcome:
        return na.ApplyOutcome(
            changed=changed and not dry_run,
            dry_run=dry_run,
            apply_latency_ns=time.monotonic_ns() - start,
            applied_ns=time.time_ns(),
            message=msg,
        )

    def _once(self, method: str, request, build):
        with self._lock:
            self.calls.append((method, request.action_id))
            if request.action_id and request.action_id in self._replies:
                reply = type(self._replies[request.action_id])()
                reply.CopyFrom(self._replies[request.action_id])
                reply.outcome.replayed = True
                return reply
            if self.apply_delay_s:
                time.sleep(self.apply_delay_s)
            reply = build()
            if reply.outcome.changed:
                self.changes += 1
                self.state.generation += 1
            if request.action_id and not request.dry_run:
                self._replies[request.action_id] = reply
            return reply

    def SetFlowClass(self, request, context):
        def build() -> na.SetFlowClassResponse:
            start = time.monotonic_ns()
            self.bounds.interface(context, "rule.interface_name", request.rule.interface_name)
            key = (request.rule.interface_name, request.rule.flow.SerializeToString())
            prev = self.state.flow_rules.get(key)
            if not request.dry_run:
                self.state.flow_rules[key] = request.rule
            resp = na.SetFlowClassResponse(
                outcome=self._outcome(prev != request.rule, request.dry_run, start, "tc filter"),
                applied=request.rule,
            )
            if prev is not None:
                resp.previous.CopyFrom(prev)
            return resp

        return self._once("SetFlowClass", request, build)

    def SetClassRate(self, request, context):
        def build() -> na.SetClassRateResponse:
            start = time.monotonic_ns()
            self.bounds.interface(context, "interface_name", request.interface_name)
            for what, bps in (("rate_bps", request.rate_bps), ("ceil_bps", request.ceil_bps)):
                self.bounds.rate(context, what, bps)
            key = (request.interface_name, request.class_id)
            prev = self.state.classes.get(key)
            if prev is None:
                context.abort(
                    grpc.StatusCode.NOT_FOUND,
                    f"class {request.class_id:#x} not on {request.interface_name}",
                )
            new = na.HtbClass()
            new.CopyFrom(prev)
            new.rate_bps, new.ceil_bps = request.rate_bps, request.ceil_bps
            if new.ceil_bps < new.rate_bps:
                context.abort(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    f"class {new.name}: ceil_bps {new.ceil_bps} is below rate_bps {new.rate_bps}",
                )
            parent = self.state.classes.get((request.interface_name, new.parent_class_id))
            for what, bps in (("rate_bps", new.rate_bps), ("ceil_bps", new.ceil_bps)):
                if parent is not None and bps > parent.ceil_bps:
                    context.abort(
                        grpc.StatusCode.INVALID_ARGUMENT,
                        f"class {new.name}: {what} {bps} exceeds the ceil_bps "
                        f"{parent.ceil_bps} of its parent {parent.name}",
                    )
            if not request.dry_run:
                self.state.classes[key] = new
            return na.SetClassRateResponse(
                outcome=self._outcome(prev != new, request.dry_run, start, "tc class change"),
                applied=new,
                previous=prev,
            )

        return self._once("SetClassRate", request, build)

    def SetChain(self, request, context):
        def build() -> na.SetChainResponse:
            start = time.monotonic_ns()
            self.bounds.chain(context, request.chain)
            prev = self.state.chains.get(request.chain.traffic_class)
            if not request.dry_run:
                self.state.chains[request.chain.traffic_class] = request.chain
            resp = na.SetChainResponse(
                outcome=self._outcome(prev != request.chain, request.dry_run, start, "chain"),
                applied=request.chain,
            )
            if prev is not None:
                resp.previous.CopyFrom(prev)
            return resp

        return self._once("SetChain", request, build)

    def SetPowerPolicy(self, request, context):
        def build() -> na.SetPowerPolicyResponse:
            start = time.monotonic_ns()
            for i, core in enumerate(request.policy.cores):
                self.bounds.core(context, f"policy.cores[{i}]", core)
            prev = {c: self.state.power.get(c) for c in request.policy.cores}
            groups: dict[bytes, na.PowerPolicy] = {}
            for core, pol in prev.items():
                base = pol or na.PowerPolicy(governor="schedutil", xman_mode=na.XMAN_MODE_OFF)
                g = na.PowerPolicy()
                g.CopyFrom(base)
                del g.cores[:]
                key = g.SerializeToString(deterministic=True)
                groups.setdefault(key, g).cores.append(core)
            if not request.dry_run:
                for c in request.policy.cores:
                    self.state.power[c] = request.policy
            return na.SetPowerPolicyResponse(
                outcome=self._outcome(True, request.dry_run, start, "cpufreq"),
                applied=request.policy,
                previous=list(groups.values()),
            )

        return self._once("SetPowerPolicy", request, build)

    def GetState(self, request, context):
        with self._lock:
            self.calls.append(("GetState", ""))
            return na.GetStateResponse(
                state=na.NodeState(
                    node_id=self.node_id,
                    generation=self.state.generation,
                    timestamp_ns=time.time_ns(),
                    queues=self.state.queues,
                    flow_classes=list(self.state.flow_rules.values()),
                    chains=list(self.state.chains.values()),
                )
            )


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


SERVER = "10.0.0.1"
CLIENT = "10.0.0.2"
_seq = itertools.count(1)


@dataclass
class ManualClock:
    # Starts at the wall clock: actuators stamp applied_ns with theirs.
    now_ns: int = field(default_factory=time.time_ns)

    def __call__(self) -> int:
        return self.now_ns

    def advance(self, seconds: float) -> None:
        self.now_ns += int(seconds * 1e9)


def flow(client: str = CLIENT, port: int = 40000) -> FiveTuple:
    return FiveTuple(
        src_addr=ipaddress.ip_address(SERVER).packed,
        dst_addr=ipaddress.ip_address(client).packed,
        src_port=5004,
        dst_port=port,
        ip_protocol=17,
    )


def detection(
    now_ns: int,
    kind: int = dpb.DETECTION_KIND_SLO_LATENCY,
    severity: int = dpb.SEVERITY_MAJOR,
    client: str = CLIENT,
    labels: dict[str, str] | None = None,
    **subject: object,
) -> dpb.Detection:
    det = dpb.Detection(
        header=RecordHeader(
            schema_version=SCHEMA_VERSION,
            source_id="analytics/test",
            sequence=next(_seq),
            timestamp_ns=now_ns,
        ),
        id=str(uuid.uuid4()),
        kind=kind,
        severity=severity,
        confidence=0.9,
        detector="test@1",
        window_start_ns=now_ns - 1_000_000_000,
        window_end_ns=now_ns - 5_000_000,
        labels=labels
        if labels is not None
        else {"node_id": "node-a", "interface": "veth0", "platform": "GFN"},
    )
    det.evidence.add(name="p99_latency_ns", value=48e6, threshold=30e6, baseline=12e6, unit="ns")
    if subject:
        for k, v in subject.items():
            if k == "queue":
                det.queue.CopyFrom(v)  # type: ignore[arg-type]
            else:
                setattr(det, k, v)
    else:
        det.flow.CopyFrom(flow(client))
    return det


def probes(
    start_ns: int, end_ns: int, rtt_ns: int, target: str = CLIENT, every_ns: int = 50_000_000
) -> ProbeRecordBatch:
    batch = ProbeRecordBatch()
    for i, t in enumerate(range(start_ns, end_ns, every_ns)):
        batch.records.add(
            header=RecordHeader(
                schema_version=SCHEMA_VERSION,
                source_id="node-a/prober",
                sequence=next(_seq),
                timestamp_ns=t,
            ),
            probe_id="p1",
            method=3,
            source_addr=ipaddress.ip_address(SERVER).packed,
            target_addr=ipaddress.ip_address(target).packed,
            probe_sequence=i,
            packet_bytes=64,
            sent_ns=t,
            received_ns=t + rtt_ns,
            rtt_ns=rtt_ns,
        )
    return batch
