"""Deciding: which policies a detection triggers, and the action each one proposes.

Pure: no journal, no actuator, no clock of its own. `Decider.triggered` applies matching and
hysteresis (a policy acts after `consecutive` matching detections of one subject), and
`propose` builds the action a policy orders for a detection: its target and typed parameters
with the templates resolved, its expected effect (an SLO objective taken for the detection's
platform, `Expect.resolve`), its deterministic id (policy, triggering detection, target) and
its guard proposal, or the refusal when the target or the parameters cannot be resolved.
The engine (cgloop.policy.engine) journals, guards and executes what this returns.
"""

from __future__ import annotations

import uuid
from collections import OrderedDict
from dataclasses import dataclass, field

from cgloop.policy import detections as dets
from cgloop.policy import parameters
from cgloop.policy.guards import NS, Proposal, Refusal
from cgloop.policy.model import Comparator, Mode, Operation, Policy, Subject
from cgloop.v1 import action_pb2 as apb
from cgloop.v1 import detection_pb2 as dpb
from cgloop.v1.common_pb2 import RecordHeader

ID_NAMESPACE = uuid.UUID("6b1f3c2e-4a57-4d0e-9a3c-5c1a0e7f2b90")
OPERATION = {op: apb.ActionOperation.Value(f"ACTION_OPERATION_{op.name}") for op in Operation}
OPERATION_NAME = {v: k for k, v in OPERATION.items()}
COMPARATOR = {c: apb.Comparator.Value(f"COMPARATOR_{c.name}") for c in Comparator}
LEVEL = {"micro": apb.ACTION_LEVEL_MICRO, "global": apb.ACTION_LEVEL_GLOBAL}


class MissingLabel(ValueError):
    pass


@dataclass
class DecideStats:
    detections: int = 0
    duplicates: int = 0
    unmatched: int = 0
    pending_trigger: int = 0


@dataclass
class _Trigger:
    count: int = 0
    last_ns: int = 0


@dataclass
class Proposed:
    """A policy's action for one detection: to guard and journal (or refused already)."""

    action: apb.Action
    target_key: str
    proposal: Proposal
    refusal: Refusal | None


def resolve(template: str | None, det: dpb.Detection) -> str:
    """`{subject}` and `{label:NAME}` filled in from the detection."""
    if not template:
        return ""
    out = template.replace("{subject}", dets.subject_value(det))
    while "{label:" in out:
        start = out.index("{label:")
        end = out.index("}", start)
        name = out[start + 7 : end]
        if name not in det.labels:
            raise MissingLabel(f"the detection has no label {name!r}")
        out = out[:start] + det.labels[name] + out[end + 1 :]
    return out


def target(p: Policy, det: dpb.Detection) -> apb.ActionTarget:
    t = p.action.target
    out = apb.ActionTarget(
        node_id=resolve(t.node_id, det),
        interface_name=resolve(t.interface_name, det),
        device_id=resolve(t.device_id, det),
    )
    which = det.WhichOneof("subject")
    if which == "flow":
        out.flow.CopyFrom(det.flow)
    elif which == "queue":
        out.node_id = out.node_id or det.queue.node_id
        out.interface_name = out.interface_name or det.queue.interface_name
        out.queue_id = det.queue.queue_id
    elif which == "node_id":
        out.node_id = out.node_id or det.node_id
    if t.queue_id is not None:
        out.queue_id = t.queue_id
    return out


def target_key(op: Operation, target: apb.ActionTarget) -> str:
    """What one action at a time may change (guards count per key)."""
    parts = [f"node={target.node_id}"] if target.node_id else []
    if target.device_id:
        parts.append(f"device={target.device_id}")
    if op is Operation.PROTECT_FLOW:
        # A key of its own: a protection renewed every few seconds never holds, cools down or
        # keeps in flight the reprioritise_flow of the same flow.
        parts.append("protect")
    if op in (Operation.REPRIORITISE_FLOW, Operation.PROTECT_FLOW) and target.HasField("flow"):
        parts.append(f"flow={dets.flow_text(target.flow)}")
    per_interface = (Operation.SET_CLASS_RATE, Operation.REPRIORITISE_FLOW, Operation.PROTECT_FLOW)
    if op in per_interface and target.interface_name:
        parts.append(f"if={target.interface_name}")
    if op in (Operation.ONOS_QUEUE,):
        parts.append(f"queue={target.queue_id}")
    return ";".join(parts) or "global"


def numbers(action: apb.Action) -> dict[str, float]:
    """The action's numeric parameters, for the guards' bounds ({} if unreadable)."""
    try:
        return parameters.numbers(parameters.spec_of(action))
    except parameters.ParameterError:
        return {}


def spec(p: Policy, det: dpb.Detection):  # -> the operation's message
    """The policy's parameters as the operation's message, templates resolved."""
    return parameters.parse(
        p.action.operation.value,
        parameters.resolve(p.action.parameters, lambda text: resolve(text, det)),
    )


@dataclass
class Decider:
    policies: list[Policy]
    remember_detections: int = 100_000
    stats: DecideStats = field(default_factory=DecideStats)

    def __post_init__(self) -> None:
        self._by_kind: dict[object, list[Policy]] = {}
        for p in self.policies:  # already in priority order
            if p.enabled:
                for k in p.match.kinds:
                    self._by_kind.setdefault(k, []).append(p)
        self._triggers: dict[tuple[str, str], _Trigger] = {}
        self._seen: OrderedDict[str, None] = OrderedDict()

    @staticmethod
    def matches(p: Policy, det: dpb.Detection, subject: Subject | None) -> bool | None:
        """True: matches; False: same kind and subject type but below the bar; None: unrelated."""
        if p.match.subject is not Subject.ANY and subject is not p.match.subject:
            return None
        for k, v in p.match.labels.items():
            if k not in det.labels or (v != "*" and det.labels[k] != v):
                return None
        return (
            dets.severity_rank(det) >= p.match.severity_at_least.rank
            and det.confidence >= p.match.min_confidence
        )

    def triggered(self, det: dpb.Detection, now: int) -> list[tuple[Policy, str]]:
        """The policies this detection makes act, with the subject key (hysteresis applied;
        a redelivered detection triggers nothing)."""
        self.stats.detections += 1
        if det.id and det.id in self._seen:
            self.stats.duplicates += 1  # Kafka redelivery: counted once
            return []
        if det.id:
            self._seen[det.id] = None
            if len(self._seen) > self.remember_detections:
                self._seen.popitem(last=False)
        candidates = self._by_kind.get(dets.kind_of(det))
        if not candidates:
            self.stats.unmatched += 1
            return []
        subject = dets.subject_of(det)
        skey = ""  # built only for a policy that matches (most detections match none)
        out = []
        for p in candidates:
            m = self.matches(p, det, subject)
            if m is None:
                continue
            skey = skey or dets.subject_key(det)
            trig = self._triggers.setdefault((p.id, skey), _Trigger())
            if not m:
                trig.count = 0  # recovered below the bar: hysteresis starts again
                continue
            if trig.count and now - trig.last_ns > p.trigger.within * NS:
                trig.count = 0
            trig.count += 1
            trig.last_ns = now
            if trig.count < p.trigger.consecutive:
                self.stats.pending_trigger += 1
                continue
            trig.count = 0
            out.append((p, skey))
        if not out:
            self.stats.unmatched += 1
        return out

    @staticmethod
    def propose(
        p: Policy,
        det: dpb.Detection,
        skey: str,
        now: int,
        header: RecordHeader,
        approval_timeout_s: float,
    ) -> Proposed:
        op = p.action.operation
        action = apb.Action(
            header=header,
            reason_detection_ids=[det.id] if det.id else [],
            policy_id=p.id,
            level=LEVEL[p.level.value],
            operation=OPERATION[op],
            deadline_ns=now + int(p.action.deadline * NS),
            state=apb.ACTION_STATE_PROPOSED,
            dry_run=p.mode is Mode.DRY_RUN,
        )
        if p.mode is Mode.APPROVE:
            action.deadline_ns += int(approval_timeout_s * NS)
        if p.action.expect is not None:
            e = p.action.expect
            action.expected_effect.CopyFrom(
                apb.ExpectedEffect(
                    metric=e.metric,
                    comparator=COMPARATOR[e.comparator],
                    value=e.resolve(det.labels),
                    within_ns=int(e.within * NS),
                )
            )
        refusal: Refusal | None = None
        try:
            action.target.CopyFrom(target(p, det))
            tkey = target_key(op, action.target)
        except MissingLabel as exc:
            tkey = skey
            refusal = Refusal("target", f"{exc}; cannot resolve {p.id}'s target")
        try:
            getattr(action, op.value).CopyFrom(spec(p, det))
        except MissingLabel as exc:
            refusal = refusal or Refusal("target", f"{exc}; cannot resolve {p.id}'s parameters")
        except parameters.ParameterError as exc:  # a label filled in made a value invalid
            refusal = refusal or Refusal("parameters", f"{p.id}: {exc}")
        action.id = str(uuid.uuid5(ID_NAMESPACE, f"{p.id}|{det.id}|{tkey}"))
        proposal = Proposal(
            action.id,
            p,
            op,
            tkey,
            numbers(action),
            node_id=action.target.node_id,
            addresses=tuple(
                dets.addr_text(a)
                for a in (action.target.flow.src_addr, action.target.flow.dst_addr)
                if a
            ),
            device_id=action.target.device_id,
        )
        return Proposed(action, tkey, proposal, refusal)
