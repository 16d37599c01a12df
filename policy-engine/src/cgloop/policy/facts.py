"""What the nodes did on their own: node-level actions (ACTION_LEVEL_NODE) taken as facts.

The node agent's micro loop acts without the engine (the latency guard promotes and releases
protected flows, RFC 9957 queue protection sanctions flows, X-MAN changes core frequencies) and
announces each change on cgloop.actions.v1 as an Action followed by its ActionResult. The
engine reads them (`Engine.observe`) and:

- remembers, per target, the flow class the node put a flow in (`NodeFacts.classes`), so a
  policy that would order the same reprioritise_flow while the node's holds orders nothing
  (counted as `node_held`); the node's release (another reprioritise_flow of the flow), the
  engine's own later action on the flow or a rollback ends the fact;
- journals each node reprioritise_flow as an entry of its own (the node's action and result,
  never republished) and verifies it like its own actions: against the action's expected effect
  when the node set one, else against the protection the engine ordered for that flow (its
  probes' p99 below the protection's SLO within `verify_within_s`), else "not checked"; its
  baseline is the queue the flow left, read over the same window (the guard moves a flow at a
  fault's onset, so the time before the move is no baseline); a
  verdict the engine rolls back on restores the node's previous rule (the engine's rollback);
- counts the rest (sanctions, frequency changes): they change nothing the engine orders.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

from cgloop.v1 import action_pb2 as apb

NS = 1_000_000_000


def is_node_record(action: apb.Action) -> bool:
    return action.level == apb.ACTION_LEVEL_NODE


@dataclass(frozen=True)
class FlowClassFact:
    action_id: str
    class_id: int
    rewrite_dscp: int | None


@dataclass
class NodeFactStats:
    node_actions: int = 0
    node_flow_classes: int = 0
    node_other: int = 0
    node_not_applied: int = 0
    node_stale: int = 0
    # the engine's decisions not taken: the node had made the same move already
    node_held: int = 0


@dataclass
class NodeFacts:
    # Node actions seen without their result yet (bounded: a result lost on the way).
    max_pending: int = 10_000
    verify_within_s: float = 1.0
    # Older changes are history (a new consumer group reads the topic from its start): counted,
    # not taken as standing facts nor verified.
    max_age_s: float = 60.0
    pending: OrderedDict[str, apb.Action] = field(default_factory=OrderedDict)
    # target key (decide.target_key of reprioritise_flow) -> the class the node put it in;
    # the oldest dropped beyond max_classes (flows end while promoted)
    classes: OrderedDict[str, FlowClassFact] = field(default_factory=OrderedDict)
    max_classes: int = 100_000
    stats: NodeFactStats = field(default_factory=NodeFactStats)

    def action(self, action: apb.Action) -> None:
        self.stats.node_actions += 1
        self.pending[action.id] = action
        while len(self.pending) > self.max_pending:
            self.pending.popitem(last=False)

    def result(self, result: apb.ActionResult, now_ns: int) -> apb.Action | None:
        """The node action this result completes, when it applied a flow class recently; None
        for a result of an action not seen, not applied, too old, or of another operation."""
        action = self.pending.pop(result.action_id, None)
        if action is None:
            return None
        if result.state != apb.ACTION_STATE_APPLIED or action.dry_run:
            self.stats.node_not_applied += 1  # failed, or a dry run: nothing changed
            return None
        if now_ns - result.applied_ns > self.max_age_s * NS:
            self.stats.node_stale += 1
            return None
        if action.operation != apb.ACTION_OPERATION_REPRIORITISE_FLOW:
            self.stats.node_other += 1
            return None
        self.stats.node_flow_classes += 1
        return action

    def applied(self, target_key: str, action: apb.Action) -> None:
        s = action.reprioritise_flow
        dscp = s.rewrite_dscp if s.HasField("rewrite_dscp") else None
        self.classes.pop(target_key, None)
        self.classes[target_key] = FlowClassFact(action.id, s.class_id, dscp)
        while len(self.classes) > self.max_classes:
            self.classes.popitem(last=False)

    def overridden(self, target_key: str) -> None:
        """The engine changed the flow itself: its decision wins over the node's."""
        self.classes.pop(target_key, None)

    def holds(self, target_key: str, spec: apb.ReprioritiseFlowAction) -> FlowClassFact | None:
        """The node's fact when it already put the flow where `spec` would."""
        fact = self.classes.get(target_key)
        dscp = spec.rewrite_dscp if spec.HasField("rewrite_dscp") else None
        if fact is not None and (fact.class_id, fact.rewrite_dscp) == (spec.class_id, dscp):
            return fact
        return None

    def expectation(
        self, action: apb.Action, protection: apb.ProtectFlowAction | None
    ) -> apb.ExpectedEffect | None:
        """What a node action must achieve: its own expected effect, else the SLO of the
        protection the engine ordered for the flow (the promotion is the guard keeping it)."""
        if action.HasField("expected_effect"):
            return action.expected_effect
        if protection is None:
            return None
        return apb.ExpectedEffect(
            metric="probe.p99_rtt_ns",
            comparator=apb.COMPARATOR_LESS_THAN,
            value=float(protection.latency_slo_ns),
            within_ns=int(self.verify_within_s * NS),
        )
