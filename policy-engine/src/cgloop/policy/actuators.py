"""Actuators: how an action reaches the network.

`Actuator` is the interface the executor drives. `NodeAgentActuator` speaks the node agent's
gRPC API (cgloop.v1.NodeAgentService) for micro-loop operations, `OnosActuator` hands global
switch operations to the ONOS driver (cgloop.actuators.onos) when it is installed, and
`NotifyActuator` changes nothing. `Router` picks one per operation.

Every request carries the action id as its idempotency key, so re-sending an action after a
restart cannot apply it twice (the agent answers `replayed`). The previous value returned by
the agent is kept in `previous_parameters` and is what a rollback re-applies, under a new id.
"""

from __future__ import annotations

import importlib
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import grpc
from cgloop.policy.detections import addr_text
from cgloop.policy.planners import calvin, power
from cgloop.v1 import action_pb2 as apb
from cgloop.v1 import node_agent_pb2 as na
from cgloop.v1.node_agent_pb2_grpc import NodeAgentServiceStub

OP = apb.ActionOperation


class ActuatorError(RuntimeError):
    """Applying failed; the text says where and why (recorded as the FAILED result's message)."""


@dataclass
class Applied:
    applied_ns: int
    apply_latency_ns: int
    previous: dict[str, str] = field(default_factory=dict)
    changed: bool = True
    replayed: bool = False
    message: str = ""


class Actuator(Protocol):
    def apply(self, action: apb.Action) -> Applied: ...

    def rollback(
        self, action: apb.Action, rollback_id: str, previous: Mapping[str, str]
    ) -> Applied:
        """Restore `previous` (what `apply` returned) under the idempotency key `rollback_id`."""
        ...


class NotifyActuator:
    """Changes nothing; the action record on the actions topic is the notification."""

    def apply(self, action: apb.Action) -> Applied:
        now = time.time_ns()
        return Applied(now, 0, {}, changed=False, message="notified")

    def rollback(
        self, action: apb.Action, rollback_id: str, previous: Mapping[str, str]
    ) -> Applied:
        return Applied(time.time_ns(), 0, {}, changed=False, message="nothing to roll back")


def _ints(text: str) -> list[int]:
    return [int(x, 0) for x in text.split(",") if x.strip()]


def _int(params: Mapping[str, str], name: str, default: int | None = None) -> int:
    if name not in params:
        if default is None:
            raise ActuatorError(f"parameter {name} is missing")
        return default
    try:
        return int(params[name], 0)
    except ValueError:
        raise ActuatorError(f"parameter {name}={params[name]!r} is not an integer") from None


XMAN = {
    "off": na.XMAN_MODE_OFF,
    "load": na.XMAN_MODE_LOAD,
    "feedback": na.XMAN_MODE_FEEDBACK,
    "pinned_max": na.XMAN_MODE_PINNED_MAX,
}
XMAN_NAME = {v: k for k, v in XMAN.items()}


def chain_from_parameters(params: Mapping[str, str], free_cores: list[int]) -> calvin.Placement:
    """CALVIN-place the chain an action asks for (admission control included)."""
    functions = []
    for item in params["functions"].split(","):
        name, _, us = item.strip().partition(":")
        traits = calvin.KNOWN_FUNCTIONS.get(name)
        if traits is None:
            raise ActuatorError(
                f"function {name!r} is not in the CALVIN table "
                f"({', '.join(calvin.KNOWN_FUNCTIONS)})"
            )
        functions.append(calvin.ChainFunctionRequest(traits, float(us or 0) * 1e-6))
    request = calvin.ChainRequest(
        params["chain_id"],
        params["traffic_class"],
        tuple(functions),
        base_rtt_s=float(params.get("base_rtt_us", "0")) * 1e-6,
    )
    return calvin.place_chain(request, free_cores)


def power_plan(params: Mapping[str, str]) -> list[power.CorePolicy]:
    return power.plan_power(
        _ints(params["cores"]),
        _ints(params.get("latency_critical", "")),
        _int(params, "min_frequency_khz"),
        _int(params, "max_frequency_khz"),
        params.get("xman_mode", "load"),
    )


def _power_text(p: na.PowerPolicy) -> str:
    mode = XMAN_NAME.get(p.xman_mode, "off")
    return (
        f"cores={','.join(map(str, p.cores))};governor={p.governor};"
        f"min={p.min_frequency_khz};max={p.max_frequency_khz};mode={mode};"
        f"cstates={'forbid' if p.forbid_cstates else 'allow'}"
    )


def _power_from_text(text: str) -> na.PowerPolicy:
    f = dict(kv.split("=", 1) for kv in text.split(";"))
    return na.PowerPolicy(
        cores=_ints(f["cores"]),
        governor=f["governor"],
        min_frequency_khz=int(f["min"]),
        max_frequency_khz=int(f["max"]),
        xman_mode=XMAN.get(f["mode"], na.XMAN_MODE_OFF),
        forbid_cstates=f.get("cstates", "allow") == "forbid",
    )


def _chain_text(chain: na.ServiceChain) -> str:
    return ",".join(f"{fn.name}:{fn.kind}:{fn.core}" for fn in chain.functions)


def _chain_from_text(chain_id: str, traffic_class: str, text: str) -> na.ServiceChain:
    functions = []
    for item in filter(None, text.split(",")):
        name, kind, core = item.split(":")
        functions.append(na.ChainFunction(name=name, kind=int(kind), core=int(core)))
    return na.ServiceChain(chain_id=chain_id, traffic_class=traffic_class, functions=functions)


def agent_credentials(tls_dir: Path) -> grpc.ChannelCredentials:
    """Mutual TLS as the node agent requires it: its CA, and our client certificate and key
    (the files `cgloop-node-agent certs --out DIR` writes)."""
    files = {name: tls_dir / name for name in ("ca.pem", "client.pem", "client.key")}
    missing = [str(f) for f in files.values() if not f.is_file()]
    if missing:
        raise ActuatorError(
            f"node agent TLS directory {tls_dir}: missing {', '.join(missing)} "
            "(create them with `cgloop-node-agent certs --out DIR`)"
        )
    return grpc.ssl_channel_credentials(
        root_certificates=files["ca.pem"].read_bytes(),
        private_key=files["client.key"].read_bytes(),
        certificate_chain=files["client.pem"].read_bytes(),
    )


class NodeAgentActuator:
    """Micro-loop operations over the node agent's gRPC API, one channel per node."""

    def __init__(
        self,
        agents: Mapping[str, str],
        timeout_s: float = 2.0,
        tls_dir: Path | None = None,
        server_name: str = "localhost",
    ) -> None:
        self.agents = dict(agents)  # node id -> "host:port" or "unix:/path"
        self.timeout_s = timeout_s
        self.server_name = server_name
        self._credentials = agent_credentials(tls_dir) if tls_dir else None
        self._stubs: dict[str, NodeAgentServiceStub] = {}
        self._channels: dict[str, grpc.Channel] = {}

    def _stub(self, node_id: str) -> NodeAgentServiceStub:
        if node_id not in self._stubs:
            address = self.agents.get(node_id)
            if address is None:
                raise ActuatorError(
                    f"no node agent address for node {node_id!r} "
                    f"(known: {', '.join(sorted(self.agents)) or 'none'})"
                )
            if self._credentials is None:
                channel = grpc.insecure_channel(address)
            else:
                # The agent's certificate names `server_name`, whatever the address (a Unix
                # socket has no host name to check).
                channel = grpc.secure_channel(
                    address,
                    self._credentials,
                    options=[("grpc.ssl_target_name_override", self.server_name)],
                )
            self._channels[node_id] = channel
            self._stubs[node_id] = NodeAgentServiceStub(channel)
        return self._stubs[node_id]

    def connect(self, timeout_s: float = 5.0) -> dict[str, str]:
        """Open every node's channel now (connection and TLS handshake), so the first action
        does not pay for them; the problems of the nodes that could not be reached."""
        for node_id in self.agents:
            self._stub(node_id)
        ready = {n: grpc.channel_ready_future(ch) for n, ch in self._channels.items()}
        deadline = time.monotonic() + timeout_s  # all nodes in parallel, one deadline
        problems: dict[str, str] = {}
        for node_id, future in ready.items():
            try:
                future.result(timeout=max(deadline - time.monotonic(), 0.0))
            except grpc.FutureTimeoutError:
                future.cancel()
                problems[node_id] = f"not reachable at {self.agents[node_id]} in {timeout_s:g} s"
        return problems

    def close(self) -> None:
        for ch in self._channels.values():
            ch.close()
        self._channels.clear()
        self._stubs.clear()

    def _call(self, node_id: str, method: str, request):
        try:
            return getattr(self._stub(node_id), method)(request, timeout=self.timeout_s)
        except grpc.RpcError as exc:
            raise ActuatorError(
                f"node agent {node_id} ({self.agents.get(node_id)}) {method}: "
                f"{exc.code().name}: {exc.details()}"
            ) from None

    @staticmethod
    def _outcome(o: na.ApplyOutcome, previous: dict[str, str]) -> Applied:
        return Applied(
            applied_ns=o.applied_ns or time.time_ns(),
            apply_latency_ns=o.apply_latency_ns,
            previous=previous,
            changed=o.changed,
            replayed=o.replayed,
            message=o.message,
        )

    def apply(self, action: apb.Action) -> Applied:
        return self._send(action, action.id, dict(action.parameters), rollback=False)

    def rollback(
        self, action: apb.Action, rollback_id: str, previous: Mapping[str, str]
    ) -> Applied:
        return self._send(action, rollback_id, dict(previous), rollback=True)

    def _send(
        self, action: apb.Action, key: str, params: dict[str, str], rollback: bool
    ) -> Applied:
        t = action.target
        node = t.node_id
        op = action.operation
        if op == OP.ACTION_OPERATION_REPRIORITISE_FLOW:
            if rollback and params.get("absent") == "true":
                # The flow had no rule: send it back to the interface's default class.
                state = self._call(node, "GetState", na.GetStateRequest()).state
                default = next(
                    (
                        q.default_class_id
                        for q in state.queues
                        if q.interface_name == t.interface_name
                    ),
                    0,
                )
                params = {"class_id": str(default)}
            rule = na.FlowClassRule(
                interface_name=t.interface_name, flow=t.flow, class_id=_int(params, "class_id")
            )
            if "rewrite_dscp" in params:
                rule.rewrite_dscp = _int(params, "rewrite_dscp")
            resp = self._call(
                node,
                "SetFlowClass",
                na.SetFlowClassRequest(action_id=key, dry_run=action.dry_run, rule=rule),
            )
            prev = {"absent": "true"}
            if resp.HasField("previous"):
                prev = {"class_id": str(resp.previous.class_id)}
                if resp.previous.HasField("rewrite_dscp"):
                    prev["rewrite_dscp"] = str(resp.previous.rewrite_dscp)
            return self._outcome(resp.outcome, prev)
        if op == OP.ACTION_OPERATION_SET_CLASS_RATE:
            rate = _int(params, "rate_bps")
            resp = self._call(
                node,
                "SetClassRate",
                na.SetClassRateRequest(
                    action_id=key,
                    dry_run=action.dry_run,
                    interface_name=t.interface_name,
                    class_id=_int(params, "class_id"),
                    rate_bps=rate,
                    ceil_bps=_int(params, "ceil_bps", rate),
                ),
            )
            prev = {
                "class_id": str(resp.previous.class_id or _int(params, "class_id")),
                "rate_bps": str(resp.previous.rate_bps),
                "ceil_bps": str(resp.previous.ceil_bps),
            }
            return self._outcome(resp.outcome, prev)
        if op == OP.ACTION_OPERATION_SET_CHAIN:
            if rollback:
                chain = _chain_from_text(
                    params["chain_id"], params["traffic_class"], params.get("functions", "")
                )
            else:
                placement = chain_from_parameters(params, _ints(params.get("free_cores", "")))
                if not placement.admitted:
                    raise ActuatorError("CALVIN admission refused: " + "; ".join(placement.reasons))
                chain = na.ServiceChain(
                    chain_id=placement.chain_id,
                    traffic_class=placement.traffic_class,
                    functions=[
                        na.ChainFunction(name=f.name, kind=int(f.kind), core=f.core or 0)
                        for f in placement.functions
                    ],
                )
            resp = self._call(
                node,
                "SetChain",
                na.SetChainRequest(action_id=key, dry_run=action.dry_run, chain=chain),
            )
            # An absent previous chain rolls back to an empty chain (the class bypasses functions).
            prev = {
                "chain_id": chain.chain_id,
                "traffic_class": chain.traffic_class,
                "functions": _chain_text(resp.previous) if resp.HasField("previous") else "",
            }
            return self._outcome(resp.outcome, prev)
        if op == OP.ACTION_OPERATION_SET_POWER_POLICY:
            if rollback:
                policies = [_power_from_text(v) for k, v in sorted(params.items())]
            else:
                policies = [
                    na.PowerPolicy(
                        cores=list(cp.cores),
                        governor=params.get("governor", cp.governor),
                        min_frequency_khz=cp.min_frequency_khz,
                        max_frequency_khz=cp.max_frequency_khz,
                        xman_mode=XMAN[cp.xman_mode],
                        forbid_cstates=not cp.allow_cstates,
                    )
                    for cp in power_plan(params)
                ]
            prev: dict[str, str] = {}
            outcome = None
            for i, pol in enumerate(policies):
                resp = self._call(
                    node,
                    "SetPowerPolicy",
                    na.SetPowerPolicyRequest(
                        action_id=f"{key}/{i}" if i else key, dry_run=action.dry_run, policy=pol
                    ),
                )
                for p in resp.previous:
                    prev[f"policy.{len(prev)}"] = _power_text(p)
                outcome = resp.outcome
            assert outcome is not None
            return self._outcome(outcome, prev)
        raise ActuatorError(f"the node agent does not do {apb.ActionOperation.Name(op)}")


class OnosActuator:
    """Global switch operations through the ONOS driver of the actuators component.

    `onos_flow_rule` becomes a FlowRule (`cgloop.actuators.onos`, validated there against
    ONOS's REST definitions) matching the action's five-tuple on `target.device_id`, with a
    QUEUE (`queue_id`) or OUTPUT (`output_port`) treatment; its rollback removes the rule.
    The driver has no queue-configuration call (ONOS's REST API has none either), so
    `onos_queue` fails with a message saying so. Without the driver installed, every ONOS
    action fails with a message naming what is missing; nothing is half-applied.
    """

    def __init__(self, client: object | None = None) -> None:
        self._client = client

    def _onos(self):
        try:
            return importlib.import_module("cgloop.actuators.onos")
        except ImportError:
            raise ActuatorError(
                "the ONOS driver (cgloop.actuators.onos) is not installed"
            ) from None

    def client(self):
        if self._client is None:
            self._client = self._onos().OnosClient()
        return self._client

    def flow_rule(self, action: apb.Action):
        onos = self._onos()
        ft = action.target.flow
        params = dict(action.parameters)
        if not action.target.device_id:
            raise ActuatorError("onos_flow_rule needs target.device_id (e.g. of:0000000000000001)")
        criteria: list[object] = [onos.EthTypeCriterion(ethType=0x0800)]
        if ft.src_addr:
            criteria.append(onos.Ipv4SrcCriterion(ip=f"{addr_text(ft.src_addr)}/32"))
        if ft.dst_addr:
            criteria.append(onos.Ipv4DstCriterion(ip=f"{addr_text(ft.dst_addr)}/32"))
        if ft.ip_protocol:
            criteria.append(onos.IpProtoCriterion(protocol=ft.ip_protocol))
        if ft.ip_protocol == 17:
            criteria += [
                onos.UdpSrcCriterion(udpPort=ft.src_port),
                onos.UdpDstCriterion(udpPort=ft.dst_port),
            ]
        elif ft.ip_protocol == 6:
            criteria += [
                onos.TcpSrcCriterion(tcpPort=ft.src_port),
                onos.TcpDstCriterion(tcpPort=ft.dst_port),
            ]
        instructions: list[object] = []
        if "queue_id" in params:
            instructions.append(
                onos.QueueInstruction(
                    queueId=_int(params, "queue_id"), port=params.get("output_port")
                )
            )
        elif "output_port" in params:
            instructions.append(onos.OutputInstruction(port=params["output_port"]))
        timeout = _int(params, "timeout_s", 0)
        try:
            return onos.FlowRule(
                priority=_int(params, "priority"),
                deviceId=action.target.device_id,
                timeout=timeout,
                isPermanent=timeout == 0,
                appId=params.get("app_id"),
                selector=onos.Selector(criteria=criteria),
                treatment=onos.Treatment(instructions=instructions),
            )
        except ValueError as exc:  # pydantic's validation of ONOS's codec rules
            raise ActuatorError(f"ONOS flow rule refused by the driver's checks: {exc}") from None

    def apply(self, action: apb.Action) -> Applied:
        if action.operation != OP.ACTION_OPERATION_ONOS_FLOW_RULE:
            raise ActuatorError(
                "onos_queue: the ONOS driver has no queue-configuration call; configure switch "
                "queues out of band and steer flows into them with onos_flow_rule (queue_id)"
            )
        rule = self.flow_rule(action)
        start = time.monotonic_ns()
        if action.dry_run:
            return Applied(time.time_ns(), 0, {}, changed=False, message="dry run: rule validated")
        try:
            ref = self.client().install_flow(rule)
        except Exception as exc:  # the driver's OnosError family; never crash the loop
            raise ActuatorError(f"ONOS install_flow on {action.target.device_id}: {exc}") from None
        return Applied(
            time.time_ns(),
            time.monotonic_ns() - start,
            {"device_id": ref.device_id, "flow_id": str(ref.flow_id)},
            message=f"flow {ref.flow_id} on {ref.device_id}",
        )

    def rollback(
        self, action: apb.Action, rollback_id: str, previous: Mapping[str, str]
    ) -> Applied:
        start = time.monotonic_ns()
        onos = self._onos()
        try:
            self.client().remove_flow(
                onos.FlowRef(device_id=previous["device_id"], flow_id=previous["flow_id"])
            )
        except KeyError as exc:
            raise ActuatorError(f"cannot roll back: no {exc} in previous parameters") from None
        except Exception as exc:
            raise ActuatorError(f"ONOS remove_flow: {exc}") from None
        return Applied(time.time_ns(), time.monotonic_ns() - start, {}, message="flow removed")


class Router:
    """Sends each operation to the actuator that performs it."""

    NODE_OPS = (
        OP.ACTION_OPERATION_REPRIORITISE_FLOW,
        OP.ACTION_OPERATION_SET_CLASS_RATE,
        OP.ACTION_OPERATION_SET_CHAIN,
        OP.ACTION_OPERATION_SET_POWER_POLICY,
    )

    def __init__(
        self, node: Actuator, onos: Actuator | None = None, notify: Actuator | None = None
    ) -> None:
        self.node = node
        self.onos = onos or OnosActuator()
        self.notify = notify or NotifyActuator()

    def _pick(self, action: apb.Action) -> Actuator:
        if action.operation in self.NODE_OPS:
            return self.node
        if action.operation == OP.ACTION_OPERATION_NOTIFY:
            return self.notify
        return self.onos

    def apply(self, action: apb.Action) -> Applied:
        return self._pick(action).apply(action)

    def rollback(
        self, action: apb.Action, rollback_id: str, previous: Mapping[str, str]
    ) -> Applied:
        return self._pick(action).rollback(action, rollback_id, previous)
