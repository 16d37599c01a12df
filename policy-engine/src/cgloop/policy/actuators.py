"""Actuators: how an action reaches the network.

`Actuator` is the interface the executor drives. `NodeAgentActuator` speaks the node agent's
gRPC API (cgloop.v1.NodeAgentService) for micro-loop operations, `OnosActuator` hands global
switch operations to the ONOS driver (cgloop.actuators.onos) when it is installed, and
`NotifyActuator` changes nothing. `Router` picks one per operation.

Each actuator dispatches on the action's typed parameters (the member of `Action.spec`, or an
old action's parameter map read into the same message by `parameters.spec_of`) and returns the
state it replaced as a typed `PreviousState`; a rollback restores exactly that state.

Every request carries the action id as its idempotency key, so re-sending an action after a
restart cannot apply it twice (the agent answers `replayed`). A rollback goes under its own id.
"""

from __future__ import annotations

import importlib
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import grpc
from cgloop.policy import parameters
from cgloop.policy.detections import addr_text
from cgloop.policy.planners import calvin, catalogue, power
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
    # What the action replaced (empty: nothing to roll back).
    previous: apb.PreviousState = field(default_factory=apb.PreviousState)
    changed: bool = True
    replayed: bool = False
    message: str = ""


class Actuator(Protocol):
    def apply(self, action: apb.Action) -> Applied: ...

    def rollback(
        self, action: apb.Action, rollback_id: str, previous: apb.PreviousState
    ) -> Applied:
        """Restore `previous` (what `apply` returned) under the idempotency key `rollback_id`."""
        ...


def spec(action: apb.Action):  # -> the operation's message
    """The action's typed parameters; an old action whose map does not fit fails here."""
    try:
        return parameters.spec_of(action)
    except parameters.ParameterError as exc:
        raise ActuatorError(str(exc)) from None


class NotifyActuator:
    """Changes nothing; the action record on the actions topic is the notification."""

    def apply(self, action: apb.Action) -> Applied:
        return Applied(time.time_ns(), 0, changed=False, message="notified")

    def rollback(
        self, action: apb.Action, rollback_id: str, previous: apb.PreviousState
    ) -> Applied:
        return Applied(time.time_ns(), 0, changed=False, message="nothing to roll back")


XMAN = {
    name: i
    for i, name in enumerate(["unspecified", *parameters.enum_names(na.XmanMode.DESCRIPTOR)])
}


def place_chain(s: apb.SetChainAction) -> na.ServiceChain:
    """The chain CALVIN-placed (admission control included): each function's kind from the
    catalogue, a core of its own for each advanced one."""
    try:
        return calvin.place_service_chain(
            list(s.functions),
            chain_id=s.chain_id,
            traffic_class=s.traffic_class,
            base_rtt_s=s.base_rtt_us * 1e-6,
            free_cores=list(s.free_cores),
            processing_s=[us * 1e-6 for us in s.processing_us] if s.processing_us else None,
        )
    except (catalogue.CatalogueError, calvin.AdmissionRefused, ValueError) as exc:
        raise ActuatorError(f"set_chain {s.chain_id}: {exc}") from None


def power_policies(s: apb.SetPowerPolicyAction) -> list[na.PowerPolicy]:
    """The X-MAN plan of a set_power_policy: one policy per group of cores set alike, the
    groups that allow C-states first. The agent bounds the cores it keeps out of C-states
    (`max_cstate_forbidden_cores`) counting those an earlier policy forbade: a plan that moves
    the latency-critical core (X-MAN on core 1, then on core 0) must release the old one
    before it forbids the new one."""
    mode = s.xman_mode or na.XMAN_MODE_LOAD
    try:
        plan = power.plan_power(
            s.cores,
            s.latency_critical,
            s.min_frequency_khz,
            s.max_frequency_khz,
            na.XmanMode.Name(mode).removeprefix("XMAN_MODE_").lower(),
        )
    except ValueError as exc:
        raise ActuatorError(f"set_power_policy: {exc}") from None
    return [
        na.PowerPolicy(
            cores=list(cp.cores),
            governor=s.governor if s.HasField("governor") else cp.governor,
            min_frequency_khz=cp.min_frequency_khz,
            max_frequency_khz=cp.max_frequency_khz,
            xman_mode=XMAN[cp.xman_mode],
            forbid_cstates=not cp.allow_cstates,
        )
        for cp in sorted(plan, key=lambda cp: not cp.allow_cstates)
    ]


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
    def _outcome(o: na.ApplyOutcome, previous: apb.PreviousState) -> Applied:
        return Applied(
            applied_ns=o.applied_ns or time.time_ns(),
            apply_latency_ns=o.apply_latency_ns,
            previous=previous,
            changed=o.changed,
            replayed=o.replayed,
            message=o.message,
        )

    def apply(self, action: apb.Action) -> Applied:
        s = spec(action)
        node, key, dry = action.target.node_id, action.id, action.dry_run
        if isinstance(s, apb.ReprioritiseFlowAction):
            rule = na.FlowClassRule(
                interface_name=action.target.interface_name,
                flow=action.target.flow,
                class_id=s.class_id,
            )
            if s.HasField("rewrite_dscp"):
                rule.rewrite_dscp = s.rewrite_dscp
            return self._flow_class(node, key, dry, rule)
        if isinstance(s, apb.ProtectFlowAction):
            pf = na.ProtectedFlow(
                interface_name=action.target.interface_name,
                flow=action.target.flow,
                latency_slo_ns=s.latency_slo_ns,
                class_id=s.class_id,
                ttl_ns=s.ttl_ns,
            )
            if s.HasField("rewrite_dscp"):
                pf.rewrite_dscp = s.rewrite_dscp
            return self._protect(node, key, dry, [pf])
        if isinstance(s, apb.SetClassRateAction):
            return self._class_rate(
                node,
                key,
                dry,
                action.target.interface_name,
                s.class_id,
                s.rate_bps,
                s.ceil_bps if s.HasField("ceil_bps") else s.rate_bps,
            )
        if isinstance(s, apb.SetChainAction):
            return self._chain(node, key, dry, place_chain(s))
        if isinstance(s, apb.SetPowerPolicyAction):
            return self._power(node, key, dry, power_policies(s))
        raise ActuatorError(
            f"the node agent does not do {apb.ActionOperation.Name(action.operation)}"
        )

    def rollback(
        self, action: apb.Action, rollback_id: str, previous: apb.PreviousState
    ) -> Applied:
        node, t = action.target.node_id, action.target
        which = previous.WhichOneof("state")
        if which == "flow_class":
            p = previous.flow_class
            # No rule before: class_id 0 removes the rule the action added.
            rule = na.FlowClassRule(
                interface_name=t.interface_name, flow=t.flow, class_id=p.class_id
            )
            if p.HasField("rewrite_dscp"):
                rule.rewrite_dscp = p.rewrite_dscp
            return self._flow_class(node, rollback_id, action.dry_run, rule)
        if which == "class_rate":
            p = previous.class_rate
            return self._class_rate(
                node,
                rollback_id,
                action.dry_run,
                t.interface_name,
                p.class_id,
                p.rate_bps,
                p.ceil_bps,
            )
        if which == "chain":
            p = previous.chain
            chain = (
                p.chain
                if p.HasField("chain")
                # No chain before: an empty one (the class bypasses functions).
                else na.ServiceChain(chain_id=p.chain_id, traffic_class=p.traffic_class)
            )
            return self._chain(node, rollback_id, action.dry_run, chain)
        if which == "power_policies":
            return self._power(
                node, rollback_id, action.dry_run, list(previous.power_policies.policies)
            )
        if which == "protections":
            return self._protect(
                node, rollback_id, action.dry_run, restore_protections(t, previous.protections)
            )
        raise ActuatorError(
            f"cannot roll back {apb.ActionOperation.Name(action.operation)} on the node agent: "
            f"no previous state recorded ({which or 'none'})"
        )

    def _flow_class(self, node: str, key: str, dry: bool, rule: na.FlowClassRule) -> Applied:
        resp = self._call(
            node, "SetFlowClass", na.SetFlowClassRequest(action_id=key, dry_run=dry, rule=rule)
        )
        prev = apb.PreviousFlowClass()  # no class: the flow had no rule
        if resp.HasField("previous"):
            prev.class_id = resp.previous.class_id
            if resp.previous.HasField("rewrite_dscp"):
                prev.rewrite_dscp = resp.previous.rewrite_dscp
        return self._outcome(resp.outcome, apb.PreviousState(flow_class=prev))

    def _class_rate(
        self, node: str, key: str, dry: bool, interface: str, class_id: int, rate: int, ceil: int
    ) -> Applied:
        resp = self._call(
            node,
            "SetClassRate",
            na.SetClassRateRequest(
                action_id=key,
                dry_run=dry,
                interface_name=interface,
                class_id=class_id,
                rate_bps=rate,
                ceil_bps=ceil,
            ),
        )
        prev = apb.PreviousClassRate(
            class_id=resp.previous.class_id or class_id,
            rate_bps=resp.previous.rate_bps,
            ceil_bps=resp.previous.ceil_bps,
        )
        return self._outcome(resp.outcome, apb.PreviousState(class_rate=prev))

    def _chain(self, node: str, key: str, dry: bool, chain: na.ServiceChain) -> Applied:
        resp = self._call(
            node, "SetChain", na.SetChainRequest(action_id=key, dry_run=dry, chain=chain)
        )
        prev = apb.PreviousChain(chain_id=chain.chain_id, traffic_class=chain.traffic_class)
        if resp.HasField("previous"):
            prev.chain.CopyFrom(resp.previous)
        return self._outcome(resp.outcome, apb.PreviousState(chain=prev))

    def _protect(self, node: str, key: str, dry: bool, flows: list[na.ProtectedFlow]) -> Applied:
        resp = self._call(
            node, "ProtectFlows", na.ProtectFlowsRequest(action_id=key, dry_run=dry, flows=flows)
        )
        prev = apb.PreviousProtections(flows=list(resp.previous))
        return self._outcome(resp.outcome, apb.PreviousState(protections=prev))

    def power_state(self, node: str, cores: list[int]) -> na.GetPowerStateResponse:
        """What the agent reads back from its cpufreq/cpuidle tree for these cores."""
        return self._call(node, "GetPowerState", na.GetPowerStateRequest(cores=cores))

    def _power(self, node: str, key: str, dry: bool, policies: list[na.PowerPolicy]) -> Applied:
        prev = apb.PreviousPowerPolicies()
        outcome = None
        if len(policies) > 1 and not dry:
            # One request per group of cores: the agent validates each (limits within the
            # hardware's, governors it has) in a dry run first, so a group it would refuse
            # fails the action before any group has changed. Not the C-state bound: the
            # agent counts the cores earlier policies forbade, which the groups before a
            # forbidding one release only once applied; that is checked for real below.
            for i, pol in enumerate(policies):
                check = na.PowerPolicy()
                check.CopyFrom(pol)
                check.forbid_cstates = False
                self._call(
                    node,
                    "SetPowerPolicy",
                    na.SetPowerPolicyRequest(
                        action_id=f"{key}/check{i}", dry_run=True, policy=check
                    ),
                )
        for i, pol in enumerate(policies):
            try:
                resp = self._call(
                    node,
                    "SetPowerPolicy",
                    na.SetPowerPolicyRequest(
                        action_id=f"{key}/{i}" if i else key, dry_run=dry, policy=pol
                    ),
                )
            except ActuatorError:
                # A group refused after others were applied: put those back, then fail.
                for j, back in enumerate(prev.policies if not dry else []):
                    self._call(
                        node,
                        "SetPowerPolicy",
                        na.SetPowerPolicyRequest(action_id=f"{key}/undo{j}", policy=back),
                    )
                raise
            prev.policies.extend(resp.previous)
            outcome = resp.outcome
        if outcome is None:
            raise ActuatorError("set_power_policy: no cores to set")
        return self._outcome(outcome, apb.PreviousState(power_policies=prev))


def restore_protections(
    target: apb.ActionTarget, previous: apb.PreviousProtections, now_ns: int | None = None
) -> list[na.ProtectedFlow]:
    """The ProtectFlows request that puts back the protections before a protect_flow: each one
    that existed for the rest of its time to live (at least the agent's 1 s minimum), and the
    target flow's removed (ttl 0) when it had none or its protection has lapsed since."""
    now = time.time_ns() if now_ns is None else now_ns
    out = []
    for p in previous.flows:
        if p.expires_ns <= now:
            continue
        back = na.ProtectedFlow()
        back.CopyFrom(p)
        back.ttl_ns = max(p.expires_ns - now, 1_000_000_000)
        back.expires_ns, back.promoted, back.promotions = 0, False, 0  # read back, not sent
        out.append(back)
    if not any(p.interface_name == target.interface_name and p.flow == target.flow for p in out):
        out.append(na.ProtectedFlow(interface_name=target.interface_name, flow=target.flow))
    return out


class OnosActuator:
    """Global switch operations through the ONOS driver of the actuators component.

    Each becomes the driver's model (`cgloop.actuators.onos`, validated there against ONOS's
    REST definitions): `onos_flow_rule` a FlowRule matching the action's five-tuple on
    `target.device_id`, with a QUEUE (`queue_id`) or OUTPUT (`output_port`) treatment;
    `onos_meter` a MeterRequest on `target.device_id`; `onos_intent` a PointToPointIntent for
    the five-tuple between two connect points. Each rollback removes what was installed. The
    driver has no queue-configuration call (ONOS's REST API has none either), so `onos_queue`
    fails with a message saying so. Without the driver installed, every ONOS action fails with
    a message naming what is missing; nothing is half-applied.
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

    def _selector(self, action: apb.Action):
        """The action's five-tuple as ONOS criteria (IPv4)."""
        onos = self._onos()
        ft = action.target.flow
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
        return onos.Selector(criteria=criteria)

    def _device(self, action: apb.Action, what: str) -> str:
        if not action.target.device_id:
            raise ActuatorError(f"{what} needs target.device_id (e.g. of:0000000000000001)")
        return action.target.device_id

    def flow_rule(self, action: apb.Action):
        onos = self._onos()
        s = spec(action)
        if not isinstance(s, apb.OnosFlowRuleAction):
            raise ActuatorError(f"not an onos_flow_rule action: {type(s).__name__}")
        device = self._device(action, "onos_flow_rule")
        instructions: list[object] = []
        port = s.output_port if s.HasField("output_port") else None
        if s.HasField("queue_id"):
            instructions.append(onos.QueueInstruction(queueId=s.queue_id, port=port))
        elif port is not None:
            instructions.append(onos.OutputInstruction(port=port))
        try:
            return onos.FlowRule(
                priority=s.priority,
                deviceId=device,
                timeout=s.timeout_s,
                isPermanent=s.timeout_s == 0,
                appId=s.app_id if s.HasField("app_id") else None,
                selector=self._selector(action),
                treatment=onos.Treatment(instructions=instructions),
            )
        except ValueError as exc:  # pydantic's validation of ONOS's codec rules
            raise ActuatorError(f"ONOS flow rule refused by the driver's checks: {exc}") from None

    def meter(self, action: apb.Action, s: apb.OnosMeterAction):
        onos = self._onos()
        device = self._device(action, "onos_meter")
        try:
            return onos.MeterRequest(
                deviceId=device,
                unit=apb.MeterUnit.Name(s.unit).removeprefix("METER_UNIT_"),
                burst=s.burst,
                bands=[
                    onos.Band(
                        type=apb.MeterBandType.Name(b.type).removeprefix("METER_BAND_TYPE_"),
                        rate=b.rate,
                        burstSize=b.burst_size,
                        prec=b.prec,
                    )
                    for b in s.bands
                ],
            )
        except ValueError as exc:
            raise ActuatorError(f"ONOS meter refused by the driver's checks: {exc}") from None

    def intent(self, action: apb.Action, s: apb.OnosIntentAction):
        onos = self._onos()
        try:
            return onos.PointToPointIntent(
                appId=s.app_id,
                priority=s.priority or 100,
                ingressPoint=onos.ConnectPoint(device=s.ingress.device_id, port=s.ingress.port),
                egressPoint=onos.ConnectPoint(device=s.egress.device_id, port=s.egress.port),
                selector=self._selector(action),
            )
        except ValueError as exc:
            raise ActuatorError(f"ONOS intent refused by the driver's checks: {exc}") from None

    def apply(self, action: apb.Action) -> Applied:
        s = None if action.operation == OP.ACTION_OPERATION_ONOS_QUEUE else spec(action)
        if isinstance(s, apb.OnosFlowRuleAction):
            body, call = self.flow_rule(action), "install_flow"
        elif isinstance(s, apb.OnosMeterAction):
            body, call = self.meter(action, s), "add_meter"
        elif isinstance(s, apb.OnosIntentAction):
            body, call = self.intent(action, s), "submit_intent"
        else:
            raise ActuatorError(
                "onos_queue: the ONOS driver has no queue-configuration call; configure switch "
                "queues out of band and steer flows into them with onos_flow_rule (queue_id)"
            )
        start = time.monotonic_ns()
        if action.dry_run:
            return Applied(time.time_ns(), 0, changed=False, message=f"dry run: {call} validated")
        try:
            ref = getattr(self.client(), call)(body)
        except Exception as exc:  # the driver's OnosError family; never crash the loop
            raise ActuatorError(f"ONOS {call} on {action.target.device_id}: {exc}") from None
        if call == "install_flow":
            prev = apb.PreviousState(
                onos_flow_rule=apb.InstalledFlowRule(
                    device_id=ref.device_id, flow_id=str(ref.flow_id)
                )
            )
            note = f"flow {ref.flow_id} on {ref.device_id}"
        elif call == "add_meter":
            prev = apb.PreviousState(
                onos_meter=apb.InstalledMeter(device_id=ref.device_id, meter_id=ref.meter_id)
            )
            note = f"meter {ref.meter_id} on {ref.device_id}"
        else:
            prev = apb.PreviousState(
                onos_intent=apb.InstalledIntent(app_id=ref.app_id, key=ref.key)
            )
            note = f"intent {ref.key} of {ref.app_id}"
        return Applied(time.time_ns(), time.monotonic_ns() - start, prev, message=note)

    def rollback(
        self, action: apb.Action, rollback_id: str, previous: apb.PreviousState
    ) -> Applied:
        start = time.monotonic_ns()
        onos = self._onos()
        which = previous.WhichOneof("state")
        try:
            if which == "onos_flow_rule":
                p = previous.onos_flow_rule
                self.client().remove_flow(onos.FlowRef(device_id=p.device_id, flow_id=p.flow_id))
            elif which == "onos_meter":
                m = previous.onos_meter
                self.client().remove_meter(
                    onos.client.MeterRef(device_id=m.device_id, meter_id=m.meter_id)
                )
            elif which == "onos_intent":
                i = previous.onos_intent
                self.client().withdraw_intent(onos.client.IntentRef(app_id=i.app_id, key=i.key))
            else:
                raise ActuatorError("cannot roll back: nothing installed through ONOS recorded")
        except ActuatorError:
            raise
        except Exception as exc:
            raise ActuatorError(f"ONOS rollback of {which}: {exc}") from None
        return Applied(time.time_ns(), time.monotonic_ns() - start, message=f"{which} removed")


class Router:
    """Sends each operation to the actuator that performs it."""

    NODE_OPS = (
        OP.ACTION_OPERATION_REPRIORITISE_FLOW,
        OP.ACTION_OPERATION_PROTECT_FLOW,
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
        self, action: apb.Action, rollback_id: str, previous: apb.PreviousState
    ) -> Applied:
        return self._pick(action).rollback(action, rollback_id, previous)

    def power_state(self, node: str, cores: list[int]) -> na.GetPowerStateResponse:
        """The node agent's read-back of its cores (set_power_policy's verification)."""
        read = getattr(self.node, "power_state", None)
        if read is None:
            raise ActuatorError("the node actuator cannot read power state back")
        return read(node, cores)
