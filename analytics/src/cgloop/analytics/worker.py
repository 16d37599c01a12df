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

Input is decoded by the bus's strict decoder (`BatchConsumer` -> `cgloop.bus.codec.decode`), the
same the sink uses: a message without the right type and schema-version headers, of another batch
type, or with a record the decoder refuses (no source id, unreadable schema version) goes to the
dead-letter topic with the reason and never reaches a detector.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

from cgloop.analytics.detectors.base import Suppressor, subject_text
from cgloop.analytics.engine import AnalyticsEngine
from cgloop.bus.kafka import BatchConsumer, BatchProducer, ensure_topics
from cgloop.bus.topics import ACTIONS, ANALYTICS_INPUTS, DETECTIONS, FLOWS, INT, NODES, PROBES
from cgloop.contracts.ops import Daemon
from cgloop.metrics import PipelineMetrics, histogram
from cgloop.v1.detection_pb2 import Detection, DetectionBatch, DetectionKind

log = logging.getLogger(__name__)

INPUT_TOPICS = ANALYTICS_INPUTS  # the loop's own actions among them (see AnalyticsEngine)
OUTPUT_TOPIC = DETECTIONS.name
STATE_VERSION = 1


@dataclass
class WorkerStats:
    messages: int = 0
    records: int = 0
    skipped_replays: int = 0
    detections: int = 0
    suppressed: int = 0
    # seconds from a message's arrival at the worker to its detections acknowledged by Kafka
    latencies_s: list[float] = field(default_factory=list)
    # seconds from arrival to detections handed to the producer (before the broker's ack)
    handled_s: list[float] = field(default_factory=list)
    # seconds from the record's Kafka timestamp (producer send) to its detections being sent
    end_to_end_s: list[float] = field(default_factory=list)


class StateFile:
    """The worker's persisted state: per-partition processed offsets and the suppressor."""

    def __init__(self, path: Path) -> None:
        self.path = path
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


def _key(det: Detection) -> bytes:
    which = det.WhichOneof("subject")
    return subject_text(getattr(det, which) if which else "").encode()


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
    ) -> None:
        self.engine = engine
        self.metrics = metrics or WorkerMetrics()
        self.bootstrap = bootstrap
        ensure_topics(bootstrap)
        self.consumer = BatchConsumer(bootstrap, group_id, topics,
                                      source_id=f"analytics/{group_id}", metrics=self.metrics)
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
        self.state = StateFile(state_path)
        self.stats = WorkerStats()
        self.evict_every_s = evict_every_s
        self.keep_latencies = keep_latencies
        self._stop = False
        self._last_evict = time.monotonic()

    def stop(self, *_args) -> None:
        self._stop = True

    def _dispatch(self, topic: str, batch) -> list[Detection]:
        if topic == ACTIONS.name:
            return self.engine.on_actions(list(batch.events))
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

    def step(self, timeout_s: float = 0.2) -> bool:
        """Handle at most one message; False when none arrived within the timeout."""
        item = self.consumer.poll(timeout_s)
        now = time.monotonic()
        if now - self._last_evict >= self.evict_every_s:
            self.engine.evict()
            self._last_evict = now
        if item is None:
            if self._pending:
                self._commit()  # idle: nothing is worth leaving uncommitted
            return False
        t, batch, msg = item
        arrived = time.perf_counter()
        tp = f"{msg.topic()}:{msg.partition()}"
        if msg.offset() <= self.state.offsets.get(tp, -1):
            self.stats.skipped_replays += 1
            self.metrics.drops.labels("replay").inc()
            self.consumer.commit(msg)
            return True
        self.stats.messages += 1
        try:
            dets = self._dispatch(t.name, batch)
        except Exception:  # a record the engine chokes on must not stop the loop
            log.exception("analytics failed on %s@%s; message skipped", tp, msg.offset())
            self.metrics.drops.labels("analytics-error").inc()
            dets = []
        fresh = [d for d in dets if self.state.suppressor.allow(d)]
        self.stats.suppressed += len(dets) - len(fresh)
        if fresh:
            by_key: dict[bytes, list[Detection]] = {}
            for d in fresh:
                by_key.setdefault(_key(d), []).append(d)
            for k, ds in by_key.items():
                self.producer.send(OUTPUT_TOPIC, DetectionBatch(records=ds), key=k)
            queued = time.perf_counter()
            self.producer.flush()
            sent = time.perf_counter()  # acknowledged by the broker
            self.stats.detections += len(fresh)
            self.metrics.records_out.labels(OUTPUT_TOPIC).inc(len(fresh))
            now_ns = time.time_ns()
            for d in fresh:
                if d.window_end_ns:
                    kind = DetectionKind.Name(d.kind).removeprefix("DETECTION_KIND_").lower()
                    self.metrics.detection_latency.labels(kind).observe(
                        max(0, now_ns - d.window_end_ns) / 1e9
                    )
            self.state.offsets[tp] = msg.offset()
            self.state.save()  # before the commit: a replay of this message is recognised
        else:
            sent = queued = time.perf_counter()
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
        self.consumer.close()
        self.producer.flush()
