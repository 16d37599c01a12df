"""Several policy engines, one deciding at a time: a lease through Kafka's group protocol.

**The lease.** Every engine of a deployment joins the consumer group `<group>.leader` on the
bus table's single-partition topic (`LEASE_TOPIC`, cgloop.deadletter.v1); the member the group
assigns its partition 0 leads. The lease consumer never reads (the partition is paused at
once): the group is used only for its membership, its liveness (heartbeats,
`session.timeout.ms`) and its assignment, which gives the partition to exactly one member of a
generation. The assignor is cooperative-sticky, so a standby joining or leaving never moves
the partition away from a live leader: leadership changes only when the leader leaves (a clean
stop hands it over at once) or dies (after the session timeout). The leader's consumer of the
shared group runs with the same session timeout, so its detection partitions move as fast.

**Fencing a paused leader.** A leader may not know it was deposed: a process paused longer
than the session timeout (SIGSTOP, a VM migration, a stalled disk) resumes with partition 0
still in its local assignment while another engine leads. So before each decision round the
leader proves its membership to the group coordinator at most `confirm_every_s` ago: a
synchronous offset commit on the lease partition, which the coordinator refuses from a member
of an older generation or an unknown member. A confirmation is trusted for `valid_s` (well
under the session timeout, measured on the monotonic clock, which counts the pause): a leader
that resumes after a long pause finds its confirmation stale and asks again before deciding,
and the coordinator's refusal makes it stop (`Lease.hold`). Its detection consumer is fenced
the same way (the group's generation refuses its offset commits). The limit: an apply already
sent to a node agent before the pause is not recalled, and the node agents check no
leader epoch; docs/scale.md says so.

**The standby.** A standby keeps its journal a mirror of the bus: it reads cgloop.actions.v1
(its own group, `<group>.mirror.<source id>`, committed after its journal is durable) and
adopts every action another engine decided under one of its policies, and each action's latest
result (`adopt`). On taking the lease it first reads the topic up to its current ends
(`Mirror.catch_up`), then starts a fresh Engine on its journal: the journal's resume rebuilds
the guards (hold times, budgets, in-flight targets, leases) from the adopted actions,
verifies (or rolls back) what the old leader applied but never verified, and re-applies what
it decided but never saw applied (the agents answer a known action id with its earlier result,
`replayed`). It then consumes detections in the shared group `<group>`, from the offsets the
old leader committed: a detection redelivered maps to an action id the journal knows (ids are
uuid5 of policy, detection and target) and is skipped; one the old leader decided but never
published is decided again under the same id, and its apply is a replay at the agent.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass

from cgloop.bus import topics
from cgloop.bus.codec import DecodeError, decode
from cgloop.bus.kafka import client_config
from cgloop.policy import decide
from cgloop.policy import facts as node_facts
from cgloop.policy.journal import FINAL, Entry, Journal
from cgloop.policy.model import Mode, Policy
from cgloop.v1 import action_pb2 as apb
from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

log = logging.getLogger(__name__)

# The lease rides on the table's one single-partition topic. The group is used for its
# membership only (the partition is paused, nothing is read); with one partition the
# cooperative-sticky assignor never moves it away from a live owner. (A topic of several
# partitions would do as well for safety, but the sticky assignor may hand partition 0 to a
# standby that joins, a needless failover; a topic of its own would carry nothing, and every
# consumer of all topics, the sink first, would have to learn to skip it.)
LEASE_TOPIC = topics.DEADLETTER.name
LEASE_PARTITION = 0
ACTIONS = topics.ACTIONS.name
# librdkafka's default; the broker's group.min.session.timeout.ms (6 s by default) bounds it
# from below.
DEFAULT_SESSION_TIMEOUT_S = 10.0


def boottime() -> float:
    """Seconds on CLOCK_BOOTTIME: monotonic, and counting a suspend of the machine (a paused
    VM) as CLOCK_MONOTONIC does not; CLOCK_MONOTONIC where there is no such clock."""
    clock = getattr(time, "CLOCK_BOOTTIME", None)
    return time.clock_gettime(clock) if clock is not None else time.monotonic()


def lease_group(group: str) -> str:
    return f"{group}.leader"


def mirror_group(group: str, source_id: str) -> str:
    return f"{group}.mirror.{source_id}"


class Lease:
    """This engine's membership of the lease group; `hold()` says whether it may decide now.

    `session_timeout_s`: how long the group waits for a silent member before giving its
    partition to another (the failover time after a crash). `valid_s` (default: a third of
    it) is how long a confirmation by the coordinator is trusted; `confirm_every_s` (default:
    half of `valid_s`) how often a leader asks again."""

    def __init__(
        self,
        bootstrap: str,
        group: str,
        source_id: str,
        session_timeout_s: float = DEFAULT_SESSION_TIMEOUT_S,
        valid_s: float | None = None,
        confirm_every_s: float | None = None,
        clock: Callable[[], float] = boottime,
        config: dict | None = None,
    ) -> None:
        if session_timeout_s <= 0:
            raise ValueError(f"lease session timeout {session_timeout_s} s: must be positive")
        self.group = lease_group(group)
        self.source_id = source_id
        self.session_timeout_s = session_timeout_s
        self.valid_s = valid_s if valid_s is not None else session_timeout_s / 3
        self.confirm_every_s = confirm_every_s if confirm_every_s is not None else self.valid_s / 2
        self.clock = clock
        self._held = False
        self._confirmed_at: float | None = None
        self.acquired_at: float | None = None  # when partition 0 was assigned (`clock`)
        self.terms = 0  # how many times this engine took the lease
        self._consumer = Consumer(
            client_config(
                bootstrap,
                {
                    "group.id": self.group,
                    "client.id": source_id,  # who leads, as `kafka-consumer-groups` shows it
                    "enable.auto.commit": False,
                    "auto.offset.reset": "latest",
                    "partition.assignment.strategy": "cooperative-sticky",
                    **self.group_config(),
                    **(config or {}),
                },
            )
        )
        self._consumer.subscribe(
            [LEASE_TOPIC], on_assign=self._on_assign, on_revoke=self._on_revoke,
            on_lost=self._on_revoke,
        )  # fmt: skip

    def group_config(self) -> dict[str, int]:
        """The liveness settings of the lease, for the leader's consumer of the shared group
        too: a dead leader's detection partitions move after the same timeout as its lease."""
        ms = int(self.session_timeout_s * 1000)
        return {"session.timeout.ms": ms, "heartbeat.interval.ms": max(100, ms // 5)}

    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        consumer.incremental_assign(partitions)
        if partitions:
            consumer.pause(partitions)  # membership only: nothing is fetched
        if any(p.partition == LEASE_PARTITION for p in partitions):
            self._held = True
            self._confirmed_at = None  # confirmed before the first decision
            self.acquired_at = self.clock()
            self.terms += 1
            log.info("%s: took the lease (%s, partition 0)", self.source_id, self.group)

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        if any(p.partition == LEASE_PARTITION for p in partitions):
            if self._held:
                log.warning("%s: lease revoked or lost (%s)", self.source_id, self.group)
            self._held = False
            self._confirmed_at = None
        try:
            consumer.incremental_unassign(partitions)
        except KafkaException as exc:  # a lost assignment may already be gone
            log.debug("unassign after revoke: %s", exc)

    @property
    def held(self) -> bool:
        """Partition 0 is in this member's assignment as far as it knows (not yet confirmed)."""
        return self._held

    def poll(self, timeout_s: float = 0.0) -> None:
        """Serve the group's callbacks (and keep the member within max.poll.interval.ms)."""
        self._consumer.poll(timeout_s)

    def confirm(self) -> bool:
        """Ask the coordinator: a synchronous offset commit on the lease partition, refused
        unless this member belongs to the group's current generation. True when accepted."""
        tp = TopicPartition(LEASE_TOPIC, LEASE_PARTITION)
        asked = self.clock()  # the coordinator's yes holds from no earlier than this
        try:
            _, high = self._consumer.get_watermark_offsets(tp, timeout=self.valid_s)
            tp.offset = max(high, 0)  # the end: the lease group shows no lag
            self._consumer.commit(offsets=[tp], asynchronous=False)
        except KafkaException as exc:
            err = exc.args[0] if exc.args else None
            code = err.code() if isinstance(err, KafkaError) else None
            log.warning("%s: the coordinator did not confirm the lease: %s", self.source_id, exc)
            if code in (
                KafkaError.UNKNOWN_MEMBER_ID,
                KafkaError.ILLEGAL_GENERATION,
                KafkaError.FENCED_INSTANCE_ID,
            ):
                self._held = False  # deposed; librdkafka rejoins the group by itself
            return False
        self._confirmed_at = asked
        return True

    def hold(self) -> bool:
        """May this engine decide now? Serves the callbacks; while it holds partition 0,
        confirms with the coordinator when the last confirmation is older than
        `confirm_every_s`. False without partition 0, or without a confirmation younger than
        `valid_s` (a refused or unanswered confirmation included)."""
        self.poll(0)
        if not self._held:
            return False
        now = self.clock()
        if self._confirmed_at is None or now - self._confirmed_at >= self.confirm_every_s:
            self.confirm()
        return (
            self._held
            and self._confirmed_at is not None
            and self.clock() - self._confirmed_at < self.valid_s
        )

    def close(self) -> None:
        """Leave the group: a standby takes the lease without waiting for a session timeout."""
        self._held = False
        self._consumer.close()


@dataclass
class Adopted:
    actions: int = 0  # actions another engine decided, new in this journal
    results: int = 0  # their results (the latest state another engine gave them)


def adopt(
    journal: Journal, batch: apb.ActionBatch, source_id: str, policies: Collection[Policy]
) -> Adopted:
    """Take into `journal` what another engine published in `batch` (cgloop.actions.v1).

    Adopted: the actions of `policies` (rollbacks included) decided by an engine other than
    `source_id`, and the results any other engine gave them. Skipped: this engine's own events
    (its journal has them), node-level actions (the leader reads them as facts from the
    shared group's offsets), actions of other policies (another deployment's), a result older
    than the one known from the same engine, and a non-final result for an action known final.
    Each adopted row is journaled (durable with the next group commit) with a delivery mark:
    it is on the bus already, so a restarted engine does not republish it.
    """
    by_id = {p.id: p for p in policies}
    out = Adopted()
    delivered: list[apb.ActionEvent] = []
    for ev in batch.events:
        if ev.WhichOneof("event") == "action":
            a = ev.action
            p = by_id.get(a.policy_id)
            if (
                a.header.source_id == source_id
                or node_facts.is_node_record(a)
                or p is None
                or journal.get(a.id) is not None
            ):
                continue
            op = decide.OPERATION_NAME.get(a.operation)
            tkey = decide.target_key(op, a.target) if op is not None else "global"
            awaiting = (
                p.mode is Mode.APPROVE
                and a.state == apb.ACTION_STATE_PROPOSED
                and not a.rollback_of_action_id
            )
            copy = apb.Action()
            copy.CopyFrom(a)
            journal.record(Entry(copy, None, tkey, awaiting_approval=awaiting))
            delivered.append(ev)
            out.actions += 1
            continue
        r = ev.result
        entry = journal.get(r.action_id)
        if entry is None or r.header.source_id == source_id:
            continue
        if node_facts.is_node_record(entry.action):
            continue
        prev = entry.result
        if (
            prev is not None
            and prev.header.source_id == r.header.source_id
            and r.header.sequence <= prev.header.sequence
        ):
            continue  # read again (a mirror's replay): older than what is known
        if entry.state in FINAL and r.state not in FINAL:
            continue
        result = apb.ActionResult()
        result.CopyFrom(r)
        journal.record(Entry(entry.action, result, entry.target_key, awaiting_approval=False))
        delivered.append(ev)
        out.results += 1
    journal.delivered(delivered)
    return out


class Mirror:
    """A standby's reader of cgloop.actions.v1: adopts what other engines published into its
    journal, committing its offsets only once the journal holds the rows durably."""

    def __init__(
        self,
        bootstrap: str,
        group: str,
        journal: Journal,
        source_id: str,
        policies: Collection[Policy],
        config: dict | None = None,
    ) -> None:
        self.journal = journal
        self.source_id = source_id
        self.policies = list(policies)
        self.adopted = Adopted()
        self._consumer = Consumer(
            client_config(
                bootstrap,
                {
                    "group.id": mirror_group(group, source_id),
                    "client.id": f"{source_id}-mirror",
                    "enable.auto.commit": False,
                    "auto.offset.reset": "earliest",
                    "enable.partition.eof": True,
                    **(config or {}),
                },
            )
        )
        self._consumer.subscribe([ACTIONS])
        self._topic = topics.ACTIONS
        self._next: dict[int, int] = {}  # partition -> the offset the mirror reads next

    def step(self, timeout_s: float = 0.1, max_messages: int = 500) -> int:
        """Adopt what is waiting (up to `max_messages`); returns the messages read."""
        msgs = self._consumer.consume(max_messages, timeout_s)
        last: dict[int, object] = {}
        for msg in msgs:
            err = msg.error()
            if err is not None:
                if err.code() == KafkaError._PARTITION_EOF:
                    self._next[msg.partition()] = msg.offset()  # type: ignore[index]
                else:
                    log.warning("mirror of %s: %s", ACTIONS, err)
                continue
            self._next[msg.partition()] = msg.offset() + 1  # type: ignore[index,operator]
            last[msg.partition()] = msg  # type: ignore[index]
            try:
                batch = decode(self._topic, msg.value(), msg.headers())
            except DecodeError:
                continue  # the leader's own reader dead-letters it
            got = adopt(self.journal, batch, self.source_id, self.policies)  # type: ignore[arg-type]
            self.adopted.actions += got.actions
            self.adopted.results += got.results
        if last:
            self.journal.sync()
            for msg in last.values():
                self._consumer.commit(message=msg, asynchronous=True)  # type: ignore[arg-type]
        return len(msgs)

    def catch_up(self, timeout_s: float = 60.0, keep: Callable[[], bool] = lambda: True) -> bool:
        """Adopt everything on the topic up to its ends as they are now (a new leader, before
        deciding anything). `keep()` is asked between reads (the lease still held): False
        ends the catch-up early, and it returns False. Raises TimeoutError when the ends are
        not reached in time."""
        deadline = time.monotonic() + timeout_s
        meta = self._consumer.list_topics(ACTIONS, timeout=timeout_s).topics[ACTIONS]
        ends = {
            p: self._consumer.get_watermark_offsets(TopicPartition(ACTIONS, p), timeout=timeout_s)[
                1
            ]
            for p in meta.partitions
        }
        while True:
            # Where the mirror stands: after its last message or at an end it was told of
            # (partition EOF); unknown until the partition's fetch started.
            behind = [p for p, end in ends.items() if end > 0 and self._next.get(p, -1) < end]
            if not behind:
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"the mirror of {ACTIONS} did not reach its ends: {behind}")
            if not keep():
                return False
            self.step(0.05)
        self.journal.sync()
        return True

    def close(self) -> None:
        self._consumer.close()


def run(
    make_engine: Callable[[], object],
    journal: Journal,
    policies: Collection[Policy],
    bootstrap: str,
    stop: threading.Event,
    group: str,
    source_id: str,
    session_timeout_s: float = DEFAULT_SESSION_TIMEOUT_S,
    on_lead: Callable[[object], None] | None = None,
    catch_up_timeout_s: float = 300.0,
    **service_kwargs: object,
) -> None:
    """One engine of a standby group until `stop`: mirror while another leads; on taking the
    lease catch up, start an engine (`make_engine()`, on `journal`) and run the service loop
    under the lease; when the lease is lost, drop that engine and mirror again.

    `on_lead(engine)` is called with each new leading engine (metrics, tests)."""
    from cgloop.policy import service

    lease = Lease(bootstrap, group, source_id, session_timeout_s)
    mirror: Mirror | None = None
    try:
        while not stop.is_set():
            if mirror is None:
                mirror = Mirror(bootstrap, group, journal, source_id, policies)
            lease.poll(0)
            if not lease.held:
                mirror.step(0.2)
                continue
            started = time.monotonic()
            try:
                caught_up = mirror.catch_up(
                    catch_up_timeout_s, functools.partial(keep, lease, stop)
                )
            except TimeoutError as exc:
                # Lead with a journal that may lack the old leader's last actions? No: give
                # the lease up (another engine may do better) and try again as a standby.
                log.error("%s: %s; giving the lease up", source_id, exc)
                lease.close()
                lease = Lease(bootstrap, group, source_id, session_timeout_s)
                continue
            if not caught_up:
                continue  # the lease went during the catch-up (or stop)
            mirror.close()
            mirror = None
            engine = make_engine()
            log.info(
                "%s leads (term %d): caught up on %s in %.2f s; its journal knows %d actions",
                source_id, lease.terms, ACTIONS, time.monotonic() - started, len(journal.order),
            )  # fmt: skip
            if on_lead is not None:
                on_lead(engine)
            metrics = service_kwargs.get("metrics")
            if metrics is not None:
                metrics.leader.set(1)  # type: ignore[attr-defined]
            try:
                stopped = service.run(
                    engine,
                    bootstrap,
                    stop,
                    group,
                    lease=lease,
                    **service_kwargs,  # type: ignore[arg-type]
                )
            finally:
                if metrics is not None:
                    metrics.leader.set(0)  # type: ignore[attr-defined]
                pool = getattr(engine, "_pool", None)
                if pool is not None:
                    pool.shutdown(wait=False, cancel_futures=True)
            if stopped:
                break
            log.warning("%s: lease lost; standing by", source_id)
    finally:
        if mirror is not None:
            mirror.close()
        lease.close()  # last: the detection consumer has committed and left


def keep(lease: Lease, stop: threading.Event) -> bool:
    """Between reads of a catch-up: serve the lease (within max.poll.interval.ms, however long
    the catch-up takes); go on while it is held and nobody asked to stop."""
    lease.poll(0)
    return lease.held and not stop.is_set()
