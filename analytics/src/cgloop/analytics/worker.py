"""`cgloop analytics run`: the streaming worker.

A consumer group over the flow, INT, probe and node topics (scale out by starting more workers:
Kafka spreads partitions over the group). Detections go to `cgloop.detections.v1`, keyed by
subject so one subject stays on one partition.

Restarts never re-alert on old data:
* offsets are committed only after the detections a message caused are flushed to Kafka;
* before that commit, the worker writes its state file (atomically): the highest offset it has
  processed per partition and the alert suppressor. A message at or below that offset (a replay
  after a crash between the state write and the commit) is skipped;
* the suppressor keeps an ongoing episode from alerting again after a restart, and detection ids
  are derived from (detector, subject, episode start), so any duplicate is recognisable.

Scale-out: workers started with the same group split the partitioned inputs (flows, INT,
nodes: keyed by flow, switch and node, so a subject's records meet on one worker) and each
reads the side inputs whole (probes, actions: a probe toward a server serves whichever worker
owns the flow; and the detections topic, whose alerts feed every worker's suppressor). The group
still commits the side topics' offsets, so its lag means what it always meant. On a rebalance:
* the member giving up partitions commits what it handled synchronously and forgets the state
  built from them (`AnalyticsEngine.reset_partitioned`);
* the member taking partitions rewinds each to `rebuild_s` of Kafka time before its committed
  offset and replays up to it (and up to its state file's offset) into the detectors with
  their output dropped: the detector state is rebuilt, what was already emitted is not
  emitted again. Detection ids are deterministic from the data (detector, subject, episode
  start), so an episode the rebuilt state fires is the same id the old owner would have sent;
  an episode older than `rebuild_s` that is still on is held back by the suppressor, which
  has read the old owner's alert from the detections topic.
Lost on a rebalance: anything older than `rebuild_s` (a conversation's classification is
redone from its last seconds; SLO baselines re-learnt from those samples). Sequence gaps
(telemetry_gap) are judged only where a worker sees a source whole: nodes always (one node,
one key), flows and INT when it holds every partition, probes by the member holding flows
partition 0.

Input is decoded by the bus's strict decoder (`BatchConsumer` -> `cgloop.bus.codec.decode`), the
same the sink uses: a message without the right type and schema-version headers, of another batch
type, or with a record the decoder refuses (no source id, unreadable schema version) goes to the
dead-letter topic with the reason and never reaches a detector.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import signal
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from cgloop.analytics.detectors.base import Suppressor, subject_key
from cgloop.analytics.engine import AnalyticsEngine
from cgloop.bus.codec import DecodeError, decode
from cgloop.bus.kafka import BatchConsumer, BatchProducer, client_config, ensure_topics
from cgloop.bus.topics import (
    ACTIONS,
    ANALYTICS_INPUTS,
    DETECTIONS,
    FLOWS,
    INT,
    NODES,
    PROBES,
    TOPICS,
)
from cgloop.contracts.ops import Daemon
from cgloop.errors import CgloopError
from cgloop.metrics import PipelineMetrics, histogram
from cgloop.v1.detection_pb2 import Detection, DetectionBatch, DetectionKind
from confluent_kafka import Consumer, KafkaException, TopicPartition

log = logging.getLogger(__name__)

INPUT_TOPICS = ANALYTICS_INPUTS  # the loop's own actions among them (see AnalyticsEngine)
# Read whole by every worker of a group (the group only commits them); the rest is split.
SIDE_TOPICS = (PROBES.name, ACTIONS.name)
OUTPUT_TOPIC = DETECTIONS.name
STATE_VERSION = 1


@dataclass
class WorkerStats:
    messages: int = 0
    records: int = 0
    skipped_replays: int = 0  # messages at or below the state file's offsets (replayed mute)
    rebuilt: int = 0  # messages replayed into the detectors with their output dropped
    rebalances: int = 0
    side_messages: int = 0
    detections: int = 0
    suppressed: int = 0
    # seconds from a message's arrival at the worker to its detections acknowledged by Kafka
    latencies_s: list[float] = field(default_factory=list)
    # seconds from arrival to detections handed to the producer (before the broker's ack)
    handled_s: list[float] = field(default_factory=list)
    # seconds from the record's Kafka timestamp (producer send) to its detections being sent
    end_to_end_s: list[float] = field(default_factory=list)


class StateFile:
    """The worker's persisted state: per-partition processed offsets and the suppressor. One
    worker's: a second worker given the same file is refused (each worker of a group needs its
    own, e.g. `--state`), it would overwrite the first's offsets."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = open(path.with_name(path.name + ".lock"), "w")  # noqa: SIM115 (held)
        try:
            fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._lock.close()
            raise CgloopError(
                f"worker state file {path} is in use by another analytics worker: give each "
                "worker of a group its own (--state)"
            ) from None
        self.offsets: dict[str, int] = {}
        self.suppressor = Suppressor()
        if path.exists():
            try:
                data = json.loads(path.read_text())
                if data.get("version") != STATE_VERSION:
                    raise ValueError(f"state version {data.get('version')}")
                self.offsets = {str(k): int(v) for k, v in data["offsets"].items()}
                self.suppressor.load({str(k): int(v) for k, v in data["suppressor"].items()})
            except (ValueError, KeyError, TypeError) as exc:
                # A damaged state file must not stop the worker: Kafka's committed offsets still
                # hold, only duplicate protection after a crash is weaker. Keep it for inspection.
                bad = path.with_suffix(".damaged")
                path.replace(bad)
                log.error("state file %s unreadable (%s); moved to %s", path, exc, bad)

    def save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps({
            "version": STATE_VERSION, "offsets": self.offsets,
            "suppressor": self.suppressor.state(),
        }))
        os.replace(tmp, self.path)

    def release(self) -> None:
        self._lock.close()  # the lock goes with the descriptor


def _key(det: Detection) -> bytes:
    return subject_key(det).encode()


class SideInputs:
    """The topics every worker of a group reads whole (no group: assigned partitions, no
    commits), from `rewind_s` of Kafka time back. Undecodable messages are skipped here: the
    group's consumer, which reads the same topics, dead-letters them once."""

    def __init__(self, bootstrap: str, group_id: str, topics: tuple[str, ...],
                 rewind_s: float) -> None:
        self.topics = topics
        self._c = Consumer(client_config(bootstrap, {
            "group.id": f"{group_id}-side-{uuid.uuid4().hex[:12]}",
            "enable.auto.commit": False, "auto.offset.reset": "latest",
        }))
        meta = self._c.list_topics(timeout=10)
        since_ms = int((time.time() - rewind_s) * 1000)
        parts = [TopicPartition(t, p, since_ms) for t in topics for p in meta.topics[t].partitions]
        # the first offset at or after that time; -1 (the end) where nothing is that recent
        self.parts = self._c.offsets_for_times(parts, timeout=10)
        self._c.assign(self.parts)

    def poll(self, timeout_s: float = 0.0, limit: int = 500) -> list[tuple[str, object]]:
        out = []
        for msg in self._c.consume(limit, timeout_s):
            if msg.error():
                continue
            try:
                out.append((msg.topic(), decode(TOPICS[msg.topic()], msg.value(),
                                                msg.headers())))
            except DecodeError:
                continue
        return out

    def close(self) -> None:
        self._c.close()


class WorkerMetrics(PipelineMetrics):
    """The worker's /metrics: the pipeline series and how long a record waited for its
    detection."""

    def __init__(self) -> None:
        super().__init__(Daemon.DAEMON_ANALYTICS)
        self.detection_latency = histogram(
            self.registry,
            "cgloop_analytics_detection_latency_seconds",
            "from the end of a detection's data window (record time) to the detection "
            "acknowledged by Kafka",
            ("kind",),
        )


class Worker:
    def __init__(
        self,
        engine: AnalyticsEngine,
        bootstrap: str,
        state_path: Path,
        group_id: str = "cgloop-analytics",
        topics: tuple[str, ...] = INPUT_TOPICS,
        evict_every_s: float = 5.0,
        keep_latencies: int = 200_000,
        commit_every_s: float = 0.5,
        metrics: WorkerMetrics | None = None,
        rebuild_s: float = 30.0,
        side_rewind_s: float = 60.0,
    ) -> None:
        self.engine = engine
        self.metrics = metrics or WorkerMetrics()
        self.bootstrap = bootstrap
        self.rebuild_s = rebuild_s
        ensure_topics(bootstrap)
        self.state = StateFile(state_path)
        self.stats = WorkerStats()
        # per partition: replay into the detectors, output dropped, up to this offset
        self._replay_upto: dict[str, int] = {}
        self._committed: dict[str, int] = {}
        self.assigned: set[tuple[str, int]] = set()
        self.side_topics = tuple(t for t in SIDE_TOPICS if t in topics)
        # the side inputs, and the detections every worker of the group sent (the suppressor's)
        self.side = SideInputs(bootstrap, group_id, (*self.side_topics, OUTPUT_TOPIC),
                               side_rewind_s)
        self.consumer = BatchConsumer(bootstrap, group_id, topics,
                                      source_id=f"analytics/{group_id}", metrics=self.metrics,
                                      on_assign=self._on_assign, on_revoke=self._on_revoke)
        # detections are latency-critical: each step flushes them, and a flush sends at once
        # whatever linger.ms (the bus table's) says
        self.producer = BatchProducer(
            bootstrap, client_id=f"{group_id}-detections", metrics=self.metrics
        )
        self.commit_every_s = commit_every_s
        # Last handled message per topic-partition not yet committed: a commit covers one
        # partition, so every partition's progress is kept (a restart would otherwise replay
        # the partitions that were not the last one handled, e.g. hours of old actions).
        self._pending: dict[tuple[str, int], object] = {}
        self._last_commit = time.monotonic()
        self.evict_every_s = evict_every_s
        self.keep_latencies = keep_latencies
        self._stop = False
        self._last_evict = time.monotonic()

    def stop(self, *_args) -> None:
        self._stop = True

    # ------------------------------------------------------------------ rebalances

    def _on_revoke(self, consumer, partitions) -> None:
        """Partitions leave this worker: commit what it handled, forget what it built."""
        self.stats.rebalances += 1
        self._commit(asynchronous=False)
        self.state.save()
        self.engine.reset_partitioned()
        self._replay_upto.clear()
        self._committed.clear()
        self.assigned = set()
        log.info("rebalance: gave up %d partitions", len(partitions))

    def _on_assign(self, consumer, partitions) -> None:
        """Partitions come to this worker (also at start): rewind each to `rebuild_s` before
        its committed offset, replay up to it with the output dropped (rebuilds the detector
        state), then go on. Side topics start at their committed offset (they are only
        committed here)."""
        since_ms = int((time.time() - self.rebuild_s) * 1000)
        own = [p for p in partitions if p.topic not in self.side_topics]
        try:
            committed = {(p.topic, p.partition): p.offset
                         for p in consumer.committed(partitions, timeout=10)}
            times = {(p.topic, p.partition): p.offset for p in consumer.offsets_for_times(
                [TopicPartition(p.topic, p.partition, since_ms) for p in own], timeout=10)} \
                if own else {}
        except KafkaException as exc:
            # The coordinator is busy (the group is still settling): go on from the committed
            # offsets without a rebuild rather than stop; the suppressor still knows the
            # group's recent alerts.
            log.warning("rebalance: no committed offsets or times (%s): no state rebuild", exc)
            committed, times = {}, {}
        for p in partitions:
            c = committed.get((p.topic, p.partition), -1001)
            tp = f"{p.topic}:{p.partition}"
            self._committed[tp] = c
            saved = self.state.offsets.get(tp, -1)
            if p.topic in self.side_topics or c < 0:
                p.offset = c  # the side's progress, or a new group from its reset policy
                self._replay_upto[tp] = saved
                continue
            back = times.get((p.topic, p.partition), -1)
            p.offset = min(c, back) if back >= 0 else c
            self._replay_upto[tp] = max(c - 1, saved)
        consumer.assign(partitions)
        self.assigned = {(p.topic, p.partition) for p in partitions}
        self._sequence_checks()
        self._drain_side(quiet_s=0.3, limit_s=5.0)  # know the group's recent alerts first
        log.info("rebalance: took %d partitions (rebuilding %.0f s)", len(partitions),
                 self.rebuild_s)

    def _sequence_checks(self) -> None:
        """Which inputs' sequence gaps this worker can judge (see the module's docstring)."""
        counts: dict[str, int] = {}
        for t, _ in self.assigned:
            counts[t] = counts.get(t, 0) + 1
        whole = {t.name for t in (FLOWS, INT) if counts.get(t.name) == t.partitions}
        checks = {"nodes"} | {("flows" if t == FLOWS.name else "int") for t in whole}
        if (FLOWS.name, 0) in self.assigned:
            checks.add("probes")
        self.engine.sequence_checks = checks

    # ------------------------------------------------------------------ messages

    def _dispatch(self, topic: str, batch) -> list[Detection]:
        if topic == ACTIONS.name:
            return self.engine.on_actions(list(batch.events))
        if topic == OUTPUT_TOPIC:
            for d in batch.records:
                self.state.suppressor.observe(d)
            return []
        records = list(batch.records)
        self.stats.records += len(records)
        if topic == FLOWS.name:
            return self.engine.on_flows(records)
        if topic == INT.name:
            return self.engine.on_int(records)
        if topic == PROBES.name:
            return self.engine.on_probes(records)
        if topic == NODES.name:
            return self.engine.on_nodes(records)
        return []

    def _handle(self, name: str, batch, where: str) -> list[Detection]:
        try:
            return self._dispatch(name, batch)
        except Exception:  # a record the engine chokes on must not stop the loop
            log.exception("analytics failed on %s; message skipped", where)
            self.metrics.drops.labels("analytics-error").inc()
            return []

    def _drain_side(self, quiet_s: float = 0.0, limit_s: float = 0.0) -> bool:
        """Handle what the side inputs hold; with `quiet_s`, until they stay quiet that long
        (at most `limit_s`)."""
        deadline, got = time.monotonic() + limit_s, False
        while True:
            items = self.side.poll(quiet_s)
            for name, batch in items:
                self.stats.side_messages += 1
                self._emit(self._handle(name, batch, name))
            got = got or bool(items)
            if not items or not quiet_s or time.monotonic() >= deadline:
                return got

    def _emit(self, dets: list[Detection]) -> list[Detection]:
        """Suppress repeats, send, wait for the broker's ack; the detections sent."""
        fresh = [d for d in dets if self.state.suppressor.allow(d)]
        self.stats.suppressed += len(dets) - len(fresh)
        if not fresh:
            return fresh
        by_key: dict[bytes, list[Detection]] = {}
        for d in fresh:
            by_key.setdefault(_key(d), []).append(d)
        for k, ds in by_key.items():
            self.producer.send(OUTPUT_TOPIC, DetectionBatch(records=ds), key=k)
        self.producer.flush()
        self.stats.detections += len(fresh)
        self.metrics.records_out.labels(OUTPUT_TOPIC).inc(len(fresh))
        now_ns = time.time_ns()
        for d in fresh:
            if d.window_end_ns:
                kind = DetectionKind.Name(d.kind).removeprefix("DETECTION_KIND_").lower()
                self.metrics.detection_latency.labels(kind).observe(
                    max(0, now_ns - d.window_end_ns) / 1e9
                )
        return fresh

    def step(self, timeout_s: float = 0.2) -> bool:
        """Handle the side inputs waiting and at most one partitioned message; False when none
        arrived within the timeout."""
        side = self._drain_side()
        item = self.consumer.poll(timeout_s if not side else 0.0)
        now = time.monotonic()
        if now - self._last_evict >= self.evict_every_s:
            self.engine.evict()
            self._last_evict = now
        if item is None:
            if self._pending:
                self._commit()  # idle: nothing is worth leaving uncommitted
            return side
        t, batch, msg = item
        arrived = time.perf_counter()
        tp = f"{msg.topic()}:{msg.partition()}"
        if t.name in self.side_topics:  # handled by the side reader: progress only
            self._pending[(msg.topic(), msg.partition())] = msg
            if time.monotonic() - self._last_commit >= self.commit_every_s:
                self._commit()
            return True
        if msg.offset() <= self._replay_upto.get(tp, -1):
            # handled before (by this worker or the partition's previous owner): rebuild the
            # detectors' state from it, say nothing again
            self._handle(t.name, batch, f"{tp}@{msg.offset()}")
            self.stats.rebuilt += 1
            if msg.offset() <= self.state.offsets.get(tp, -1):
                self.stats.skipped_replays += 1
                self.metrics.drops.labels("replay").inc()
            if msg.offset() >= self._committed.get(tp, -1):
                self._pending[(msg.topic(), msg.partition())] = msg
            return True
        self.stats.messages += 1
        dets = self._handle(t.name, batch, f"{tp}@{msg.offset()}")
        queued = time.perf_counter()
        fresh = self._emit(dets)
        sent = time.perf_counter()  # acknowledged by the broker
        if fresh:
            self.state.offsets[tp] = msg.offset()
            self.state.save()  # before the commit: a replay of this message is recognised
        else:
            sent = queued
        if len(self.stats.latencies_s) < self.keep_latencies:
            self.stats.latencies_s.append(sent - arrived)
            self.stats.handled_s.append(queued - arrived)
            ts_type, ts_ms = msg.timestamp()
            if ts_type and ts_ms > 0:
                self.stats.end_to_end_s.append(max(0.0, time.time() - ts_ms / 1000))
        # Commit at once after detections, otherwise at most every commit_every_s. A crash
        # replays at most that much input, which the state file's offsets and the suppressor
        # keep from re-alerting.
        self._pending[(msg.topic(), msg.partition())] = msg
        if fresh or time.monotonic() - self._last_commit >= self.commit_every_s:
            self._commit()
        return True

    def _commit(self, asynchronous: bool = True) -> None:
        # Asynchronous while running (no broker round trip per partition on the detection
        # path; a crash replays what the state file's offsets and the suppressor recognise);
        # synchronous when stopping.
        for msg in self._pending.values():
            self.consumer.commit(msg, asynchronous=asynchronous)  # type: ignore[arg-type]
        self._pending = {}
        self._last_commit = time.monotonic()

    def run(self, max_idle_s: float | None = None, install_signals: bool = True) -> WorkerStats:
        if install_signals:
            signal.signal(signal.SIGTERM, self.stop)
            signal.signal(signal.SIGINT, self.stop)
        idle_since = time.monotonic()
        while not self._stop:
            if self.step():
                idle_since = time.monotonic()
            elif max_idle_s is not None and time.monotonic() - idle_since > max_idle_s:
                break
        self.close()
        return self.stats

    def close(self) -> None:
        self._commit(asynchronous=False)
        self.state.save()
        self.consumer.close()  # leaves the group: the others take its partitions
        self.side.close()
        self.producer.flush()
        self.state.release()
