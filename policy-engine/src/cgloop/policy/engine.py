"""The policy engine: detections in, guarded and verified actions out.

Three parts: deciding (cgloop.policy.decide: match policies, apply hysteresis, resolve the
target and the typed parameters, derive a deterministic action id from policy, triggering
detection and target), executing (this module: guards, the journal, the actuators, approval,
restart) and verifying (cgloop.policy.verify: the verdict on the expected effect, which the
engine acts on by keeping or rolling back). Life cycle: PROPOSED -> REFUSED | APPLIED ->
VERIFIED | ROLLED_BACK, or FAILED / EXPIRED; approval mode parks the action as PROPOSED until
an operator approves it. Every state change is journaled before it is announced, and announced
as an ActionEvent (cgloop.actions.v1).

Loop timing: the detection's window end (telemetry time) and header timestamp (detection
time), the action's header timestamp (decision), the result's applied_ns and verified_ns are
all on the records; `detection_to_apply_ns` is the loop latency up to the network change.
"""

from __future__ import annotations

import dataclasses
import heapq
import logging
import time
import uuid
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field

from cgloop.contracts import SCHEMA_VERSION
from cgloop.policy import capacity, decide, parameters, planning, verify
from cgloop.policy import facts as node_facts
from cgloop.policy.actuators import Actuator, ActuatorError, Applied, power_policies
from cgloop.policy.decide import ID_NAMESPACE, OPERATION, OPERATION_NAME
from cgloop.policy.guards import NS, Budget, GuardBook, Proposal, Refusal
from cgloop.policy.journal import FINAL, Entry, Journal
from cgloop.policy.leases import Leases, Standing
from cgloop.policy.model import CounterMetric, Mode, Operation, Policy
from cgloop.policy.nodes import NodeBook
from cgloop.policy.telemetry import TelemetryReader
from cgloop.v1 import action_pb2 as apb
from cgloop.v1 import detection_pb2 as dpb
from cgloop.v1 import node_pb2 as npb
from cgloop.v1.common_pb2 import RecordHeader

log = logging.getLogger(__name__)

# Kept importable from here (service, tests).
__all__ = ["ID_NAMESPACE", "OPERATION", "OPERATION_NAME", "Engine", "events_by_key"]


@dataclass
class EngineStats(decide.DecideStats):
    refused: int = 0
    applied: int = 0
    verified: int = 0
    rolled_back: int = 0
    failed: int = 0
    expired: int = 0
    skipped_known: int = 0
    # protect_flow decisions not sent: the same protection is fresh on the node (leases)
    renewals_skipped: int = 0
    renewals: int = 0
    # protect_flow decisions not sent: the last attempt failed less than retry_after_s ago
    protect_backoff: int = 0
    # placements not made: the session's node has its chain already (planning.Skip)
    plan_skipped: int = 0
    # set_chain actions the overload guard re-planned (more instances, other cores)
    replanned: int = 0
    # decisions held back while another action was in flight on their target, then decided
    parked: int = 0


@dataclass
class Engine:
    policies: list[Policy]
    actuator: Actuator
    telemetry: TelemetryReader | None = None
    journal: Journal = field(default_factory=lambda: Journal(None))
    clock: Callable[[], int] = time.time_ns
    budget: Budget = field(default_factory=Budget)
    source_id: str = "policy-engine"
    # Operators have this long to approve an action in approval mode before it expires.
    approval_timeout_s: float = 600.0
    # Telemetry arrives late (export intervals, Kafka): with no samples after the action yet,
    # verification waits this much longer before concluding "not checked".
    verify_grace_s: float = 3.0
    remember_detections: int = 100_000
    # Actions decided in one detection batch go to their actuators concurrently (their targets
    # differ: one action in flight per target), so slow gRPC calls do not queue detections.
    apply_workers: int = 8
    # Applies off the decision thread: `handle` submits the batch's actions to the worker pool
    # and returns; their results are taken in by the next handle/tick/finish_applies. At most
    # `max_in_flight` applies wait in the pool (back-pressure beyond that). Guards still allow
    # one action in flight per target.
    apply_async: bool = False
    max_in_flight: int = 256
    # A protect_flow is renewed once this fraction of its time to live has passed.
    renew_after: float = 0.5
    # Node-level actions (cgloop.policy.facts): how long after a node's flow-class change its
    # effect is read, and the verdicts that roll it back.
    node_verify_within_s: float = 1.0
    node_rollback_on: frozenset[int] = frozenset({apb.VERDICT_WORSE})
    # The nodes' samples (cgloop.nodes.v1, fed by the telemetry feed or `observe_nodes`): the
    # overload guard and the planners read them (cgloop.policy.capacity, .planning).
    nodes: NodeBook = field(default_factory=NodeBook)
    # Offered load stays under this share of R_max (the overload guard and `expect.also`'s
    # function.busy_ratio bound); at most this many instances of a function (the agent's bound).
    overload_margin: float = capacity.DEFAULT_MARGIN
    max_instances: int = capacity.DEFAULT_MAX_INSTANCES
    # A decision that only the in-flight guard refuses (another action on its target is
    # still being applied or verified) waits up to this long for it to end and is then
    # decided again, with the guards and planners reading the state of then. Detectors alert
    # once per episode, so a refusal there would lose the lever for the whole episode (the
    # lab: a hog's node overload starts X-MAN on the node, and the function overload the same
    # hog causes arrives while it is being verified). In memory only: a restart forgets them
    # (their detection, redelivered or not, is then decided anew or not at all).
    park_s: float = 5.0

    def __post_init__(self) -> None:
        self.guards = GuardBook(budget=self.budget)
        self.by_id = {p.id: p for p in self.policies}
        self.stats = EngineStats()
        self.decider = decide.Decider(self.policies, self.remember_detections, self.stats)
        # (journal sequence of the event's row, event): announced once that row is durable.
        self._outbox: list[tuple[int, apb.ActionEvent]] = []
        self._inflight: list[tuple[Entry, int, Future[Applied]]] = []
        self._due: list[tuple[int, str]] = []  # (verify at ns, action id)
        self._sequence = 0
        self._to_apply: list[tuple[Entry, int]] = []
        self._pool: ThreadPoolExecutor | None = None
        self.leases = Leases(self.renew_after)
        self.facts = node_facts.NodeFacts(verify_within_s=self.node_verify_within_s)
        self.planner = planning.Planner(self.nodes, self.overload_margin, self.max_instances)
        self.overload = capacity.OverloadGuard(self.nodes, self.overload_margin, self.max_instances)
        # action id -> what the planner or the overload guard did (leads its APPLIED result)
        self._notes: dict[str, str] = {}
        self._planned: dict[str, planning.Planned] = {}
        # action id -> (policy, detection, subject key, target key, first parked at ns)
        self._parked: dict[str, tuple[Policy, dpb.Detection, str, str, int]] = {}
        self._resume()

    # --- records --------------------------------------------------------------------------

    def _header(self, now: int) -> RecordHeader:
        self._sequence += 1
        return RecordHeader(
            schema_version=SCHEMA_VERSION,
            source_id=self.source_id,
            sequence=self._sequence,
            timestamp_ns=now,
        )

    def _emit_action(self, action: apb.Action) -> None:
        self._outbox.append((self.journal.seq, apb.ActionEvent(action=action)))

    def _result(
        self, entry: Entry, state: int, message: str = "", **fields: object
    ) -> apb.ActionResult:
        now = self.clock()
        prev = entry.result
        result = apb.ActionResult(
            header=self._header(now),
            action_id=entry.action.id,
            state=state,
            message=message,
            applied_ns=prev.applied_ns if prev else 0,
            apply_latency_ns=prev.apply_latency_ns if prev else 0,
            detection_to_apply_ns=prev.detection_to_apply_ns if prev else 0,
        )
        if prev is not None:
            # The rollback state rides on every later result (an action applied before typed
            # results existed keeps its old map, still read by a rollback after a restart).
            if prev.HasField("previous"):
                result.previous.CopyFrom(prev.previous)
            result.previous_parameters.update(prev.previous_parameters)
        for k, v in fields.items():
            if k in ("previous", "verification"):
                getattr(result, k).CopyFrom(v)
            else:
                setattr(result, k, v)
        entry.result = result
        entry.awaiting_approval = False
        self.journal.record(entry)
        self._outbox.append((self.journal.seq, apb.ActionEvent(result=result)))
        if state in FINAL:
            self.guards.finished(entry.target_key, entry.action.id, now)
        return result

    def drain(self, wait: bool = True) -> list[apb.ActionEvent]:
        """The events decided since the last drain whose journal rows are durable.

        wait=True makes everything recorded so far durable first (blocks on the journal's
        commit); wait=False returns at once with the durable prefix and keeps the rest.
        """
        if wait:
            self.journal.sync()
            out = [ev for _, ev in self._outbox]
            self._outbox = []
            return out
        durable = self.journal.durable_seq
        n = 0
        while n < len(self._outbox) and self._outbox[n][0] <= durable:
            n += 1
        out = [ev for _, ev in self._outbox[:n]]
        del self._outbox[:n]
        return out

    def delivered(self, events: list[apb.ActionEvent]) -> None:
        """The publisher's word that these events are on the bus (acknowledged by Kafka):
        the journal stops counting them as owed to it after a restart."""
        self.journal.delivered(events)

    @property
    def undrained(self) -> int:
        """Events decided but not yet announced (their journal rows are not durable yet)."""
        return len(self._outbox)

    @property
    def busy(self) -> bool:
        """Events wait for the journal or applies are in flight: poll again soon. (Parked
        decisions wait for an action's verification, seconds away: the service's regular
        tick every poll interval takes them up, without a millisecond poll loop meanwhile.)"""
        return bool(self._outbox or self._inflight)

    # --- decision -------------------------------------------------------------------------

    def handle(self, batch: dpb.DetectionBatch, wait: bool = True) -> list[apb.ActionEvent]:
        self._collect_applies()
        for det in batch.records:
            self.on_detection(det)
        self._apply_decided()
        self.tick()
        return self.drain(wait)

    def observe(self, batch: apb.ActionBatch) -> None:
        """Take in what the nodes did on their own (cgloop.policy.facts): node-level actions
        and their results from cgloop.actions.v1; everything else on the topic (the engine's
        own events among them) is ignored. A node's flow-class change is journaled and
        verified like the engine's own actions; its verification is announced by `drain`."""
        for ev in batch.events:
            if ev.WhichOneof("event") == "action":
                a = ev.action
                if node_facts.is_node_record(a) and self.journal.get(a.id) is None:
                    self.facts.action(a)
                continue
            action = self.facts.result(ev.result, self.clock())
            if action is not None:
                self._node_applied(action, ev.result)

    def observe_nodes(self, batch: npb.NodeSampleBatch) -> None:
        """Take in node samples (cores, function counters) for the overload guard and planners."""
        self.nodes.ingest(batch)

    def _node_applied(self, node_action: apb.Action, result: apb.ActionResult) -> None:
        tkey = decide.target_key(Operation.REPRIORITISE_FLOW, node_action.target)
        self.facts.applied(tkey, node_action)
        action = apb.Action()
        action.CopyFrom(node_action)
        protect_key = decide.target_key(Operation.PROTECT_FLOW, node_action.target)
        expected = self.facts.expectation(action, self.leases.live(protect_key, self.clock()))
        if expected is not None:
            action.expected_effect.CopyFrom(expected)
        entry = Entry(action, None, tkey)
        entry.result = apb.ActionResult()
        entry.result.CopyFrom(result)
        self.journal.record(entry)
        self._schedule(entry)

    def _collect_applies(self, block: bool = False) -> None:
        """Take in the results of finished asynchronous applies (all of them with block)."""
        if not self._inflight:
            return
        if block:
            wait([f for _, _, f in self._inflight])
        still = []
        for entry, end, fut in self._inflight:
            if not fut.done():
                still.append((entry, end, fut))
                continue
            self._record_apply(entry, end, fut)
        self._inflight = still

    def _record_apply(self, entry: Entry, end: int, fut: Future[Applied]) -> None:
        """Record the outcome of a finished apply: applied, or failed with the agent's reason."""
        try:
            applied = fut.result()
        except ActuatorError as exc:
            self._failed(entry, exc)
            return
        self._applied(entry, applied, end)

    def _failed(self, entry: Entry, exc: ActuatorError) -> None:
        self.stats.failed += 1
        a = entry.action
        if a.operation == apb.ACTION_OPERATION_SET_CHAIN:
            self.planner.forget(a)
        planned = self._notes.pop(a.id, "")
        if a.operation == apb.ACTION_OPERATION_PROTECT_FLOW:
            self.leases.failed(entry.target_key, self.clock())
        # What the planner or the overload guard had decided leads the agent's reason.
        why = f"{planned}; {exc}" if planned else str(exc)
        self._result(entry, apb.ACTION_STATE_FAILED, why)

    def finish_applies(self) -> None:
        """Wait for every asynchronous apply and record its result."""
        self._collect_applies(block=True)

    def _apply_decided(self) -> None:
        todo, self._to_apply = self._to_apply, []
        if self.apply_async and todo:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self.apply_workers, thread_name_prefix="apply")
            for entry, end in todo:
                if self.clock() > entry.action.deadline_ns:
                    self._expire(entry)
                    continue
                while len(self._inflight) >= self.max_in_flight:
                    wait([self._inflight[0][2]])  # back-pressure: the pool is full
                    self._collect_applies()
                fut = self._pool.submit(self.actuator.apply, entry.action)
                self._inflight.append((entry, end, fut))
            return
        if len(todo) <= 1 or self.apply_workers <= 1:
            for entry, end in todo:
                self._apply(entry, end)
            return
        live = []
        for entry, end in todo:
            if self.clock() > entry.action.deadline_ns:
                self._expire(entry)
            else:
                live.append((entry, end))
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.apply_workers, thread_name_prefix="apply")
        futures = [self._pool.submit(self.actuator.apply, e.action) for e, _ in live]
        for (entry, end), fut in zip(live, futures, strict=True):
            self._record_apply(entry, end, fut)

    def on_detection(self, det: dpb.Detection) -> None:
        now = self.clock()
        for p, skey in self.decider.triggered(det, now):
            self._decide(p, det, skey, now)

    target_key = staticmethod(decide.target_key)

    def _decide(
        self, p: Policy, det: dpb.Detection, skey: str, now: int, parked_ns: int | None = None
    ) -> None:
        proposed = decide.Decider.propose(
            p, det, skey, now, self._header(now), self.approval_timeout_s
        )
        action, tkey, proposal, refusal = (
            proposed.action,
            proposed.target_key,
            proposed.proposal,
            proposed.refusal,
        )
        if self.journal.get(action.id) is not None:
            # Decided before a restart: never twice. Its events, if they had not reached the
            # bus, were republished when the engine started (Journal.undelivered_events).
            self.stats.skipped_known += 1
            return
        if refusal is None and p.action.operation is Operation.PROTECT_FLOW:
            standing = self.leases.standing(tkey, action.protect_flow, now)
            if tkey in self.guards.in_flight:
                # A protect_flow of the flow is on its way: it answers for this detection too
                # (new terms, if any, are sent on a detection after it).
                standing = Standing.FRESH
            if standing is Standing.FRESH:
                self.stats.renewals_skipped += 1
                return
            if standing is Standing.BACKOFF:
                self.stats.protect_backoff += 1
                return
            if standing is Standing.RENEWAL:
                self.stats.renewals += 1
                proposal = dataclasses.replace(proposal, renewal=True)
        if (
            refusal is None
            and p.action.operation is Operation.REPRIORITISE_FLOW
            and self.facts.holds(tkey, action.reprioritise_flow) is not None
        ):
            # The node's micro loop put the flow there already: nothing to order (the node's
            # action is on the bus, and its verification; a record per detection would only
            # repeat it).
            self.facts.stats.node_held += 1
            return
        if refusal is None and (
            p.action.plan is not None or p.action.operation is Operation.SET_CHAIN
        ):
            try:
                refusal, proposal = self._plan(p, det, action, proposal)
            except planning.Skip:
                self.stats.plan_skipped += 1
                return
            tkey = proposal.target_key
        if refusal is None:
            refusal = self.guards.check(proposal, now)
        if refusal is not None and refusal.guard == "in_flight":
            since = now if parked_ns is None else parked_ns
            if now - since < self.park_s * NS:
                # Decided again once the action in flight ends (`_unpark`), planned anew then.
                self._planned.pop(action.id, None)
                self._notes.pop(action.id, None)
                if action.id not in self._parked:
                    self.stats.parked += 1
                self._parked[action.id] = (p, det, skey, tkey, since)
                return
            refusal = Refusal(refusal.guard, f"{refusal.reason} (waited {self.park_s:g} s)")
        if refusal is not None:
            self.stats.refused += 1
            self._planned.pop(action.id, None)
            self._notes.pop(action.id, None)
            action.state = apb.ACTION_STATE_REFUSED
            entry = Entry(action, None, tkey)
            self.journal.record(entry)
            self._emit_action(action)
            self._result(entry, apb.ACTION_STATE_REFUSED, str(refusal))
            return
        self.guards.started(proposal, now)
        if p.action.plan is not None and action.id in self._planned:
            self.planner.committed(self._planned.pop(action.id), action)
        entry = Entry(action, None, tkey, awaiting_approval=p.mode is Mode.APPROVE)
        self.journal.record(entry)
        self._emit_action(action)
        if p.mode is Mode.APPROVE:
            return
        self._to_apply.append((entry, det.window_end_ns))

    def _plan(
        self, p: Policy, det: dpb.Detection, action: apb.Action, proposal
    ) -> tuple[Refusal | None, object]:
        """The policy's planner (its `plan`) and, for a set_chain, the overload guard, before
        the other guards: the action is filled in or re-planned in place, or refused with the
        reason. Returns the refusal (or None) and the proposal for the (possibly moved)
        target."""
        notes = []
        if p.action.plan is not None:
            try:
                planned = self.planner.plan(p.action.plan, det, action)
            except planning.PlanRefused as exc:
                return exc.refusal, proposal
            self._planned[action.id] = planned
            notes.append(planned.note)
        if p.action.operation is not Operation.SET_CHAIN:
            if notes:
                self._notes[action.id] = "; ".join(notes)
            return None, dataclasses.replace(proposal, parameters=decide.numbers(action))
        try:
            checked = self.overload.check(action.target.node_id, action.set_chain)
        except capacity.NoCapacity as exc:
            self._planned.pop(action.id, None)
            guard = "admission" if isinstance(exc, capacity.Inadmissible) else "overload"
            return Refusal(guard, str(exc)), proposal
        if checked.note.startswith("re-planned"):
            self.stats.replanned += 1
        if checked.note:
            notes.append(checked.note)
        action.set_chain.CopyFrom(checked.spec)
        if notes:
            self._notes[action.id] = "; ".join(notes)
        tkey = decide.target_key(Operation.SET_CHAIN, action.target)
        return None, dataclasses.replace(
            proposal,
            target_key=tkey,
            node_id=action.target.node_id,
            parameters=decide.numbers(action),
        )

    # --- execution ------------------------------------------------------------------------

    def _expire(self, entry: Entry) -> None:
        self.stats.expired += 1
        self._notes.pop(entry.action.id, None)
        self._result(entry, apb.ACTION_STATE_EXPIRED, "deadline passed before applying")

    def _apply(self, entry: Entry, detection_end_ns: int = 0) -> None:
        if self.clock() > entry.action.deadline_ns:
            self._expire(entry)
            return
        try:
            applied = self.actuator.apply(entry.action)
        except ActuatorError as exc:
            self._failed(entry, exc)
            return
        self._applied(entry, applied, detection_end_ns)

    def _applied(self, entry: Entry, applied: Applied, detection_end_ns: int) -> None:
        action = entry.action
        self.stats.applied += 1
        loop = applied.applied_ns - detection_end_ns if detection_end_ns else 0
        note = "replayed by the actuator (already applied)" if applied.replayed else applied.message
        planned = self._notes.pop(action.id, "")
        if planned:
            note = f"{planned}; {note}" if note else planned
        if action.dry_run:
            note = f"dry run: {note}"
        self._result(
            entry,
            apb.ACTION_STATE_APPLIED,
            note,
            applied_ns=applied.applied_ns,
            apply_latency_ns=applied.apply_latency_ns,
            detection_to_apply_ns=max(0, loop),
            previous=applied.previous,
        )
        if action.operation == apb.ACTION_OPERATION_PROTECT_FLOW:
            self.leases.applied(
                entry.target_key, action.id, action.protect_flow, self.clock(), action.dry_run
            )
        if action.operation == apb.ACTION_OPERATION_REPRIORITISE_FLOW and not action.dry_run:
            self.facts.overridden(entry.target_key)
        self._schedule(entry)

    def _schedule(self, entry: Entry) -> None:
        action = entry.action
        if (
            action.operation == apb.ACTION_OPERATION_SET_POWER_POLICY
            and not action.dry_run
            and not action.HasField("expected_effect")
            and hasattr(self.actuator, "power_state")
        ):
            # Without an expectation on telemetry, verified by reading the state back from the
            # agent, at once.
            self._verify_power(entry)
            return
        if action.dry_run or not action.HasField("expected_effect") or self.telemetry is None:
            why = (
                "dry run"
                if action.dry_run
                else "no expected effect"
                if not action.HasField("expected_effect")
                else "no telemetry reader"
            )
            self.stats.verified += 1
            self._result(
                entry,
                apb.ACTION_STATE_VERIFIED,
                f"not checked: {why}",
                verified_ns=self.clock(),
                verification=apb.Verification(verdict=apb.VERDICT_NOT_CHECKED, detail=why),
            )
            return
        assert entry.result is not None
        due = entry.result.applied_ns + action.expected_effect.within_ns
        heapq.heappush(self._due, (due, action.id))

    def _unpark(self, now: int) -> None:
        """Decide again the parked decisions whose target is free, or that waited park_s."""
        ready = [
            (action_id, item) for action_id, item in self._parked.items()
            if item[3] not in self.guards.in_flight or now - item[4] >= self.park_s * NS
        ]
        for action_id, (p, det, skey, _, since) in ready:
            del self._parked[action_id]
            self._decide(p, det, skey, now, parked_ns=since)
        if ready:
            self._apply_decided()

    def tick(self) -> list[apb.ActionEvent]:
        """Verify what is due, expire stale approvals, decide parked decisions whose target
        is free; returns nothing (events go to drain)."""
        self._collect_applies()
        now = self.clock()
        while self._due and self._due[0][0] <= now:
            _, action_id = heapq.heappop(self._due)
            entry = self.journal.get(action_id)
            if entry is not None and entry.state == apb.ACTION_STATE_APPLIED:
                self._verify(entry)
        for entry in self.journal.open_entries() if self._approvals_open() else ():
            if entry.awaiting_approval and now > entry.action.deadline_ns:
                self.stats.expired += 1
                self._result(entry, apb.ACTION_STATE_EXPIRED, "not approved before its deadline")
        if self._parked:
            self._unpark(now)
        return []

    def _verify(self, entry: Entry) -> None:
        assert self.telemetry is not None and entry.result is not None
        action = entry.action
        e = action.expected_effect
        policy = self.by_id.get(action.policy_id)
        expect = policy.action.expect if policy else None
        baseline_ns = int((expect.baseline_window if expect else 2.0) * NS)
        tolerance = expect.worse_tolerance if expect else 0.1
        rollback_on = (
            set(self.node_rollback_on)
            if node_facts.is_node_record(action)
            else verify.rollback_verdicts(policy)
        )
        applied = entry.result.applied_ns
        # The expectation's probes only (expect.probe_dscp), when it names them.
        only = {"dscp": expect.probe_dscp} if expect and expect.probe_dscp is not None else {}
        if node_facts.is_node_record(action):
            # The node's guard moves a flow as a queue builds, before the flow's SLO breaks:
            # the window before the move is the fault's onset or no fault at all, so the
            # baseline is the queue the flow left, over the same window (what staying would
            # have given), not the time before the fault.
            before = self.telemetry.read(
                e.metric, action, applied, applied + e.within_ns, phase="before"
            )
        else:
            before = self.telemetry.read(
                e.metric, action, applied - baseline_ns, applied, phase="before", **only
            )
        after = self.telemetry.read(e.metric, action, applied, applied + e.within_ns, **only)
        now = self.clock()
        if after is None and now < applied + e.within_ns + int(self.verify_grace_s * NS):
            heapq.heappush(self._due, (now + NS // 10, action.id))
            return
        v = verify.judge(e, before, after, tolerance)
        if expect is not None and expect.also:
            self._check_counters(action, expect.also, applied, applied + e.within_ns, v)
        if v.verdict in rollback_on:
            self._rollback(entry, v)
            return
        self.stats.verified += 1
        self._result(
            entry,
            apb.ACTION_STATE_VERIFIED,
            v.detail,
            verified_ns=self.clock(),
            verification=v,
        )

    def _check_counters(
        self,
        action: apb.Action,
        metrics: list[CounterMetric],
        start_ns: int,
        end_ns: int,
        v: apb.Verification,
    ) -> None:
        """`expect.also`: the chain's advanced functions' counters on the action's node over the
        verification window; one that does not hold turns `improved` into `no_effect`. When
        every one was read and holds, a `worse` from the probes alone becomes `no_effect`: the
        chain's functions keep up, so the path got slower for another reason (on a shared
        machine, the fault that overloaded the function also slows everything else), and
        rolling back would put the function back where it was overloaded."""
        names = [
            f.WhichOneof("function") or ""
            for f in action.set_chain.functions
            if capacity.is_advanced(f)
        ]
        notes = []
        failed = False
        for m in metrics:
            got = self.nodes.read(m.value, action.target.node_id, names, start_ns, end_ns)
            if got is None:
                notes.append(f"{m.value}: no samples")
                continue
            value, _ = got
            if m is CounterMetric.BUSY_RATIO:
                ok = value < self.overload_margin
                notes.append(f"{m.value} {value:.2f} (limit {self.overload_margin:g})")
            else:
                ok = value <= 0
                notes.append(f"{m.value} {value:g} (must not rise)")
            failed |= not ok
        read_all = bool(metrics) and not any(n.endswith(": no samples") for n in notes)
        if failed and v.verdict == apb.VERDICT_IMPROVED:
            v.verdict = apb.VERDICT_NO_EFFECT
        elif not failed and read_all and names and v.verdict == apb.VERDICT_WORSE:
            v.verdict = apb.VERDICT_NO_EFFECT
            notes.append("the functions keep up: the probes' worse is not the chain's, kept")
        v.detail += "; counters of " + ",".join(names or ["-"]) + ": " + ", ".join(notes)

    def _verify_power(self, entry: Entry) -> None:
        """A set_power_policy is verified by reading the cores' state back from its agent
        (GetPowerState): frequency limits, governor and C-states as the X-MAN plan set them."""
        assert entry.result is not None
        action = entry.action
        try:
            policies = power_policies(action.set_power_policy)  # the X-MAN plan it sent
            state = self.actuator.power_state(  # type: ignore[attr-defined]
                action.target.node_id, sorted({c for p in policies for c in p.cores})
            )
            v = verify.judge_power(policies, state)
        except ActuatorError as exc:
            v = apb.Verification(
                metric=verify.POWER_READBACK,
                verdict=apb.VERDICT_NOT_CHECKED,
                detail=f"read-back failed: {exc}",
            )
        self.stats.verified += 1
        self._result(
            entry, apb.ACTION_STATE_VERIFIED, v.detail, verified_ns=self.clock(), verification=v
        )

    def _rollback(self, entry: Entry, v: apb.Verification) -> None:
        assert entry.result is not None
        original = entry.action
        rb_id = str(uuid.uuid5(ID_NAMESPACE, f"{original.id}|rollback"))
        now = self.clock()
        try:
            previous = parameters.previous_of(entry.result, original.operation)
        except parameters.ParameterError as exc:
            self.stats.failed += 1
            self._result(
                entry,
                apb.ACTION_STATE_FAILED,
                f"cannot roll back: {exc}",
                verified_ns=now,
                verification=v,
            )
            return
        rb = apb.Action(
            header=self._header(now),
            id=rb_id,
            reason_detection_ids=list(original.reason_detection_ids),
            policy_id=original.policy_id,
            # The engine rolls back a node's own action: its decision, applied on the node.
            level=apb.ACTION_LEVEL_MICRO if node_facts.is_node_record(original) else original.level,
            target=original.target,
            operation=original.operation,
            deadline_ns=now + 5 * NS,
            state=apb.ACTION_STATE_PROPOSED,
            rollback_of_action_id=original.id,
        )
        rb.rollback.CopyFrom(previous)  # the state it restores, typed
        rb_entry = Entry(rb, None, entry.target_key)
        self.journal.record(rb_entry)
        self._emit_action(rb)
        why = apb.Verdict.Name(v.verdict).removeprefix("VERDICT_").lower()
        try:
            applied = self.actuator.rollback(original, rb_id, previous)
        except ActuatorError as exc:
            self.stats.failed += 1
            self._result(rb_entry, apb.ACTION_STATE_FAILED, str(exc))
            self._result(
                entry,
                apb.ACTION_STATE_FAILED,
                f"{why}, and the rollback failed: {exc}",
                verified_ns=now,
                verification=v,
            )
            return
        self._result(
            rb_entry,
            apb.ACTION_STATE_VERIFIED,
            f"rollback of {original.id}",
            applied_ns=applied.applied_ns,
            apply_latency_ns=applied.apply_latency_ns,
            verified_ns=now,
            verification=apb.Verification(verdict=apb.VERDICT_NOT_CHECKED, detail="rollback"),
        )
        self.stats.rolled_back += 1
        self.leases.ended(entry.target_key, original.id)
        if original.operation == apb.ACTION_OPERATION_SET_CHAIN:
            self.planner.forget(original)
        if original.operation == apb.ACTION_OPERATION_REPRIORITISE_FLOW:
            self.facts.overridden(entry.target_key)  # the flow is back where it was
        self._result(
            entry,
            apb.ACTION_STATE_ROLLED_BACK,
            f"rolled back ({why}): {v.detail}",
            verified_ns=now,
            verification=v,
        )

    # --- approval -------------------------------------------------------------------------

    def _approvals_open(self) -> bool:
        return any(p.mode is Mode.APPROVE for p in self.policies)

    def pending_approvals(self) -> list[apb.Action]:
        return [e.action for e in self.journal.open_entries() if e.awaiting_approval]

    def approve(self, action_id: str) -> None:
        entry = self.journal.get(action_id)
        if entry is None or not entry.awaiting_approval:
            raise KeyError(f"no action {action_id} awaiting approval")
        entry.awaiting_approval = False
        self._apply(entry)

    def reject(self, action_id: str, reason: str = "rejected by an operator") -> None:
        entry = self.journal.get(action_id)
        if entry is None or not entry.awaiting_approval:
            raise KeyError(f"no action {action_id} awaiting approval")
        self.stats.refused += 1
        self._result(entry, apb.ACTION_STATE_REFUSED, f"guard approval: {reason}")

    # --- restart --------------------------------------------------------------------------

    def _resume(self) -> None:
        """Rebuild guard state and finish what a previous run left open."""
        for action_id in self.journal.order:
            entry = self.journal.entries[action_id]
            # The engine's own headers count, and those of another engine of a standby group
            # whose actions this journal adopted (cgloop.policy.standby): this engine's events
            # continue above them, so a delivery mark on an action (one sequence for all its
            # events) never hides a later event of this engine. A node's records have their own
            # sequence and do not count.
            headers = [entry.action.header, *([entry.result.header] if entry.result else [])]
            node = node_facts.is_node_record(entry.action)
            self._sequence = max(
                [
                    self._sequence,
                    *(h.sequence for h in headers if h.source_id == self.source_id or not node),
                ]
            )
            p = self.by_id.get(entry.action.policy_id)
            self._resume_fact(entry)
            if entry.action.rollback_of_action_id or entry.action.state == apb.ACTION_STATE_REFUSED:
                continue
            op = OPERATION_NAME.get(entry.action.operation)
            if p is not None and op is not None:
                self.guards.started(
                    Proposal(action_id, p, op, entry.target_key, decide.numbers(entry.action)),
                    entry.action.header.timestamp_ns,
                )
            if entry.state in FINAL and entry.result is not None:
                self.guards.finished(entry.target_key, action_id, entry.result.header.timestamp_ns)
            a = entry.action
            if (
                a.operation == apb.ACTION_OPERATION_PROTECT_FLOW
                and entry.state in (apb.ACTION_STATE_APPLIED, apb.ACTION_STATE_VERIFIED)
                and entry.result is not None
            ):
                self.leases.applied(
                    entry.target_key, a.id, a.protect_flow, entry.result.applied_ns, a.dry_run
                )
        # Events journaled but never acknowledged by Kafka before the previous run ended (a
        # crash between the journal's commit and the producer's flush): announced first, in
        # their order, before anything this run adds to the same actions.
        self._outbox.extend((0, ev) for ev in self.journal.undelivered_events())
        for entry in list(self.journal.open_entries()):
            if entry.awaiting_approval:
                continue
            if entry.state == apb.ACTION_STATE_PROPOSED:
                # Crashed between deciding and applying: the actuator's idempotency key makes
                # a second apply a replay if the first one did reach it.
                self._apply(entry)
            elif entry.state == apb.ACTION_STATE_APPLIED:
                self._schedule(entry)

    def _resume_fact(self, entry: Entry) -> None:
        """Where the nodes put flows, replayed in decision order: a node's change, or the
        engine's own later change that overrode it."""
        a = entry.action
        if a.operation != apb.ACTION_OPERATION_REPRIORITISE_FLOW or a.dry_run:
            return
        if node_facts.is_node_record(a):
            self.facts.applied(entry.target_key, a)
        elif entry.state in (apb.ACTION_STATE_APPLIED, apb.ACTION_STATE_VERIFIED):
            self.facts.overridden(entry.target_key)


def events_by_key(events: Iterable[apb.ActionEvent]) -> dict[str, apb.ActionBatch]:
    """Group events into batches keyed by action id (one action's events stay in order)."""
    out: dict[str, apb.ActionBatch] = {}
    for ev in events:
        key = ev.action.id if ev.WhichOneof("event") == "action" else ev.result.action_id
        out.setdefault(key, apb.ActionBatch()).events.append(ev)
    return out
