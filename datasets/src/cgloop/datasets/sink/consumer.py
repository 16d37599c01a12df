"""The Kafka -> store sink: a consumer group that writes raw batches, at least once, exactly
counted.

How a batch travels:

1. Messages are gathered per (topic, partition) into a *chunk*, closed by size (bytes or
   messages) or age.
2. The chunk's offset range is written ahead to `cgloop_meta.sink_chunks` (its *plan*).
3. The chunk is inserted with the dedup token `group/topic/partition/first-last`; every
   table and roll-up keeps recent tokens and drops a block it has already seen.
4. Only then is the offset committed.

Steps 2-3, and encoding the chunk (the Arrow codec, which releases the GIL), run on the sink's
writer threads (`writers`, each with its own store connection; a partition always goes to the
same one, so its chunks are inserted in order), while the consumer thread goes on reading and
cutting the next chunks, and commits (4) what the writers have stored: Kafka fetches and the
other writers' encoding and inserts overlap a store insert. At most `inflight_chunks` chunks
wait for each writer; then the consumer thread waits too.

A crash between 3 and 4 replays the partition from the last commit; on assignment the sink
reads the plans past that commit and cuts the replayed messages at exactly the same offsets, so
the replayed chunk carries the same token and the store drops it: nothing lost, nothing
counted twice (the same holds in the roll-ups, which a key-based ReplacingMergeTree alone
cannot promise).

Bad input: the sink refuses exactly what every other consumer refuses, through the same strict
decoder (`cgloop.bus.codec`): each message's headers are checked on arrival (`check_headers`);
on the strict topics (all but flows and INT) every message is decoded and validated in Python
first (`decode_payload`). The Arrow codec (flows, INT) makes the same payload checks while it
encodes (a header with a readable version equal to the message's, a source id, records, no
unknown field) and names the payload it refuses: that message goes to the dead-letter topic
with the strict decoder's reason and the rest of the chunk is encoded again (after the first
refusal every message of the chunk is decoded in Python once, so a chunk of many bad messages
costs one more encode, not one a message). If ClickHouse cannot decode a chunk, its messages
are validated one by one; the undecodable go to the dead-letter topic with the reason, the rest
are inserted.
Back-pressure: the consumer thread stops polling while `inflight_chunks` chunks wait for the
writer, and librdkafka's prefetch queue is capped, so a slow store slows consumption instead of
growing memory.
"""

from __future__ import annotations

import itertools
import logging
import queue
import threading
import time
import zlib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from cgloop.bus.codec import DecodeError, check_headers, decode, decode_payload
from cgloop.bus.kafka import (
    BatchProducer,
    ensure_topics,
    health_callbacks,
    librdkafka_log,
    monitored_librdkafka_log,
)
from cgloop.bus.topics import DEADLETTER, FLOWS, INT, TOPICS
from cgloop.config import kafka_client_config
from cgloop.contracts import SCHEMA_VERSION
from cgloop.datasets.records import KINDS, RecordKind
from cgloop.datasets.sink.metrics import SinkMetrics
from cgloop.datasets.sink.writer import Encoded, StoreWriteError, StoreWriter, UndecodableBatch
from cgloop.datasets.store.cluster import check_cluster_name, cluster_wide_table
from cgloop.datasets.store.minutes import close_minutes
from cgloop.metrics import KAFKA, STORE
from cgloop.v1.common_pb2 import RecordHeader
from cgloop.v1.deadletter_pb2 import DeadLetter
from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition
from confluent_kafka import Message as KafkaMessage
from pydantic import BaseModel, Field, field_validator
from tenacity import RetryCallState, Retrying, retry_if_exception, wait_exponential

log = logging.getLogger(__name__)

PLANS_TABLE = "cgloop_meta.sink_chunks"
# High-volume topics are validated by ClickHouse's decoder (and by Python only when it fails).
FAST_TOPICS = frozenset({FLOWS.name, INT.name})


class SinkConfig(BaseModel):
    """How the sink batches and where it reads from."""

    group_id: str = "cgloop-sink"
    topics: list[str] = Field(default_factory=lambda: list(TOPICS))
    max_chunk_bytes: int = Field(default=32 << 20, ge=1)
    max_chunk_messages: int = Field(default=20_000, ge=1)
    max_chunk_age_s: float = Field(default=1.0, gt=0)
    # librdkafka's prefetch cap per partition: the bound on memory while the store is slow.
    fetch_queue_kbytes: int = Field(default=64 * 1024, ge=1024)
    strict_topics: list[str] = Field(
        default_factory=lambda: [t for t in TOPICS if t not in FAST_TOPICS]
    )
    # A crashed sink's partitions move to its successor after this long (the broker's minimum).
    session_timeout_ms: int = Field(default=6000, ge=1000)
    retry_backoff_s: float = Field(default=0.5, gt=0)
    retry_backoff_max_s: float = Field(default=10.0, gt=0)
    # How often flow minutes are closed (finalised into cgloop.flow_minutes_closed) while
    # flow/INT rows are being written; 0 disables it.
    close_minutes_every_s: float = Field(default=10.0, ge=0)
    # Cut chunks waiting for the writer thread (the one being inserted not counted); the
    # consumer thread stops polling beyond this. Each holds up to max_chunk_bytes.
    inflight_chunks: int = Field(default=1, ge=1)
    # Writer threads, each inserting its share of the partitions over its own connection (two
    # concurrent inserts use 2 cores better than one insert's parallel views: bench/datasets).
    # Callers make this many StoreWriters (store_writers); the Sink runs a thread per writer.
    writers: int = Field(default=2, ge=1)
    # The ClickHouse cluster the store is (CGLOOP_STORE_CLUSTER), None: one server or chDB.
    # Several sinks of one group may then write through different nodes: the chunk plans are
    # a table every node holds whole, written with a quorum and read after syncing, so the
    # sink that takes over a partition sees every plan of the one that had it.
    cluster: str | None = None

    @field_validator("cluster")
    @classmethod
    def _cluster_name(cls, value: str | None) -> str | None:
        return check_cluster_name(value) if value else None


@dataclass
class Chunk:
    topic: str
    partition: int
    first_offset: int
    last_offset: int = -1
    payloads: list[bytes] = field(default_factory=list)
    messages: list[KafkaMessage] = field(default_factory=list)
    # Each message's schema-version header (its records must carry that version).
    versions: list[int] = field(default_factory=list)
    size: int = 0
    seen: int = 0
    opened: float = field(default_factory=time.monotonic)
    # Set when replaying a planned chunk: close exactly at this offset.
    planned_last: int | None = None


_PLAN_COLUMNS = (
    "group_id String, topic String, partition Int32,"
    " first_offset Int64, last_offset Int64, planned_at DateTime DEFAULT now()"
)


def ensure_plans_table(client: object, cluster: str | None = None) -> None:
    if cluster:
        for statement in cluster_wide_table(
            cluster,
            PLANS_TABLE,
            _PLAN_COLUMNS,
            "(group_id, topic, partition, first_offset)",
            engine="MergeTree",
            tail=" TTL planned_at + INTERVAL 7 DAY",
        ):
            client.command(statement)  # type: ignore[attr-defined]
        return
    client.command("CREATE DATABASE IF NOT EXISTS cgloop_meta")  # type: ignore[attr-defined]
    client.command(  # type: ignore[attr-defined]
        f"CREATE TABLE IF NOT EXISTS {PLANS_TABLE} ("
        " group_id String, topic String, partition Int32,"
        " first_offset Int64, last_offset Int64, planned_at DateTime DEFAULT now()"
        ") ENGINE = MergeTree ORDER BY (group_id, topic, partition, first_offset)"
        " TTL planned_at + INTERVAL 7 DAY"
    )


class Sink:
    """Consumes cgloop topics into the store until `should_stop()` returns True."""

    def __init__(
        self,
        writer: StoreWriter | Sequence[StoreWriter],
        bootstrap: str,
        config: SinkConfig | None = None,
        metrics: SinkMetrics | None = None,
        after_insert: Callable[[Chunk], None] | None = None,
    ) -> None:
        # One writer per writer thread (own connection each); the first also serves the
        # consumer thread's reads (plans at assignment) and the minute closing.
        self.writers = [writer] if isinstance(writer, StoreWriter) else list(writer)
        if not self.writers:
            raise ValueError("the sink needs at least one StoreWriter")
        self.writer = self.writers[0]
        self.config = config or SinkConfig()
        self.metrics = metrics or SinkMetrics()
        self.bootstrap = bootstrap
        # Test hook: runs between the insert and the offset commit (crash-safety tests).
        self._after_insert = after_insert
        unknown = [t for t in self.config.topics if t not in KINDS]
        if unknown:
            raise ValueError(f"no table takes topics {unknown}; known: {', '.join(KINDS)}")
        ensure_plans_table(self.writer.client, self.config.cluster)
        ensure_topics(bootstrap, [TOPICS[t] for t in self.config.topics] + [DEADLETTER])
        self._consumer = Consumer(
            {
                **kafka_client_config(bootstrap),  # address and CGLOOP_KAFKA_* security
                "group.id": self.config.group_id,
                "enable.auto.commit": False,
                "auto.offset.reset": "earliest",
                "queued.max.messages.kbytes": self.config.fetch_queue_kbytes,
                "fetch.max.bytes": 64 << 20,
                # A flow batch is ~1 MB: 1 MiB a partition a fetch (the default) returns one
                # message a partition a round trip; 16 MiB: 0.9-1.6 -> 1.6-1.7 M records/s
                # consumed alone (bench/datasets stage, 6 partitions). Memory stays capped by
                # queued.max.messages.kbytes.
                "max.partition.fetch.bytes": 16 << 20,
                "session.timeout.ms": self.config.session_timeout_ms,
                "heartbeat.interval.ms": max(500, self.config.session_timeout_ms // 3),
                "logger": librdkafka_log,
                # Kafka's state on /metrics (cgloop_dependency_up); its errors go there (and
                # to the log once a change) instead of being raised from consume(). (Its own
                # logger too, without a line per reconnect attempt.)
                **health_callbacks(self.metrics.dependencies),
            }
        )
        # Its reconnect attempts stay out of the log as the consumer's do (which reports Kafka).
        self._deadletters = BatchProducer(
            bootstrap, client_id=f"{self.config.group_id}-dl", logger=monitored_librdkafka_log
        )
        # Strictly increasing across restarts of this sink; next() is atomic (both threads).
        self._dl_sequence = itertools.count(time.time_ns() + 1)
        # Consumer thread only: the chunks being filled.
        self._chunks: dict[tuple[str, int], Chunk] = {}
        # Consumer thread -> writer threads (one queue each): cut chunks, in order; None stops.
        self._cut = [
            queue.Queue[Chunk | None](maxsize=self.config.inflight_chunks) for _ in self.writers
        ]
        # Writer thread -> consumer thread: stored chunks whose offsets are to be committed.
        self._written: queue.SimpleQueue[Chunk] = queue.SimpleQueue()
        self._writer_failure: BaseException | None = None
        self._writer_threads: list[threading.Thread] = []
        # Minutes to close: set when flow/INT rows are written, cleared by a close pass.
        self._minutes_dirty = False
        self._minutes_closed_at = time.monotonic()
        # (topic, partition) -> planned (first, last) ranges to reproduce after a restart.
        self._replay: dict[tuple[str, int], list[tuple[int, int]]] = {}
        self._consumer.subscribe(
            self.config.topics, on_assign=self._on_assign, on_revoke=self._on_revoke
        )

    # -- partition life cycle ------------------------------------------------------------
    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        committed = consumer.committed(partitions, timeout=30)
        if self.config.cluster and committed:
            # the plans another sink wrote through another node, before reading them
            self.writer.client.command(f"SYSTEM SYNC REPLICA {PLANS_TABLE}")
        for tp in committed:
            start = tp.offset if tp.offset >= 0 else 0
            rows = self.writer.client.query(
                f"SELECT first_offset, last_offset FROM {PLANS_TABLE}"
                " WHERE group_id = {g:String} AND topic = {t:String} AND partition = {p:Int32}"
                " AND last_offset >= {o:Int64} ORDER BY first_offset",
                parameters={
                    "g": self.config.group_id,
                    "t": tp.topic,
                    "p": tp.partition,
                    "o": start,
                },
            ).result_rows
            self._replay[(tp.topic, tp.partition)] = [(int(a), int(b)) for a, b in rows]
            if rows:
                log.info(
                    "replaying %d planned chunk(s) of %s[%d]", len(rows), tp.topic, tp.partition
                )

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        # Finish what we hold for these partitions while we still own them: cut their chunks
        # and wait until the writer has inserted and committed everything cut so far.
        for tp in partitions:
            chunk = self._chunks.get((tp.topic, tp.partition))
            if chunk is None:
                continue
            if chunk.planned_last is not None:
                # Half-replayed: inserting it would carry a new token over rows the planned
                # insert already holds. Left uncommitted; the next owner replays it whole.
                self._chunks.pop((tp.topic, tp.partition))
                continue
            self._flush(chunk)
        self._drain()

    # -- main loop ---------------------------------------------------------------------
    def run(self, should_stop: Callable[[], bool]) -> None:
        self._writer_threads = [
            threading.Thread(
                target=self._write_loop,
                args=(i,),
                name=f"sink-writer-{i}-{self.config.group_id}",
                daemon=True,
            )
            for i in range(len(self.writers))
        ]
        for thread in self._writer_threads:
            thread.start()
        try:
            while not should_stop():
                self._check_writer()
                # consume() returns at num_messages or the timeout: 100 flow batches (~500 k
                # records) keep the writer fed without waiting out the timeout at high rates.
                for msg in self._consumer.consume(num_messages=100, timeout=0.2):
                    self._accept(msg)
                self._flush_due()
                self._commit_written(wait=False)
            self._flush_all()
            self._drain()
            self._stop_writer()
            self._close_minutes_due(final=True)
        finally:
            self._stop_writer()
            self.close()

    # -- the writer thread -------------------------------------------------------------
    def _write_loop(self, index: int) -> None:
        """Writer thread `index`: insert its cut chunks in order; the first writer also closes
        minutes when due. A failure ends the thread and is raised on the consumer thread
        (`_check_writer`)."""
        cut, writer = self._cut[index], self.writers[index]
        closes = index == 0
        try:
            while True:
                try:
                    chunk = cut.get(timeout=0.2)
                except queue.Empty:
                    if closes:
                        self._close_minutes_due()
                    continue
                try:
                    if chunk is None:
                        return
                    self._write(chunk, writer)
                    if closes:
                        self._close_minutes_due()
                finally:
                    cut.task_done()
        except BaseException as exc:  # handed to the consumer thread, which raises it
            self._writer_failure = exc

    def _check_writer(self) -> None:
        if self._writer_failure is not None:
            raise RuntimeError("the sink's writer thread failed") from self._writer_failure

    def _drain(self) -> None:
        """Wait until every cut chunk is inserted (or the writer failed), then commit their
        offsets synchronously."""
        while any(cut.unfinished_tasks for cut in self._cut):
            self._check_writer()
            if not all(thread.is_alive() for thread in self._writer_threads):
                raise RuntimeError("a writer thread of the sink stopped with chunks left")
            time.sleep(0.002)
        self._commit_written(wait=True)

    def _stop_writer(self) -> None:
        threads, self._writer_threads = self._writer_threads, []
        if not threads:
            return
        for thread, cut in zip(threads, self._cut, strict=True):
            if thread.is_alive():
                cut.put(None)
        for thread in threads:
            thread.join()

    def _accept(self, msg: KafkaMessage) -> None:
        if msg.error():
            if msg.error().code() == KafkaError._PARTITION_EOF:
                return
            raise KafkaException(msg.error())
        self.metrics.dependencies.up(KAFKA)
        topic, partition, offset = msg.topic(), msg.partition(), msg.offset()
        self.metrics.messages.labels(topic).inc()
        key = (topic, partition)
        chunk = self._chunks.get(key)
        if chunk is None:
            chunk = self._open_chunk(topic, partition, offset)
        reason, version = self._precheck(msg)
        chunk.last_offset = offset
        if reason:
            self._dead_letter(msg, reason)
        else:
            chunk.messages.append(msg)
            chunk.payloads.append(msg.value())
            chunk.versions.append(version)
            chunk.size += len(msg.value())
        chunk.seen += 1
        if chunk.planned_last is not None:
            if offset >= chunk.planned_last:
                self._flush(chunk)
        elif (
            chunk.size >= self.config.max_chunk_bytes
            or chunk.seen >= self.config.max_chunk_messages
        ):
            self._flush(chunk)

    def _open_chunk(self, topic: str, partition: int, offset: int) -> Chunk:
        chunk = Chunk(topic, partition, offset)
        plans = self._replay.get((topic, partition))
        while plans and plans[0][1] < offset:
            plans.pop(0)  # a plan wholly before this message (already committed)
        if plans and plans[0][0] <= offset:
            chunk.first_offset, chunk.planned_last = plans.pop(0)
        self._chunks[(topic, partition)] = chunk
        return chunk

    def _precheck(self, msg: KafkaMessage) -> tuple[str | None, int]:
        """(why this message cannot be stored, or None; its schema-version header). The
        strict decoder's header checks for every message; its payload checks too on the strict
        topics and wherever the writer's encoder does not make them (the Arrow codec makes
        them while it encodes, `_encode`)."""
        topic = TOPICS[msg.topic()]
        value = msg.value()
        try:
            version = check_headers(topic, msg.headers())
            if (
                not value
                or msg.topic() in self.config.strict_topics
                or not self.writer.encodes_strictly(KINDS[msg.topic()])
            ):
                decode_payload(topic, value, version)
        except DecodeError as exc:
            return str(exc), 0
        return None, version

    def _flush_due(self) -> None:
        now = time.monotonic()
        for chunk in list(self._chunks.values()):
            if chunk.planned_last is None and now - chunk.opened >= self.config.max_chunk_age_s:
                self._flush(chunk)

    def _close_minutes_due(self, final: bool = False) -> None:
        """Finalise closed flow minutes every `close_minutes_every_s` while roll-up rows are
        being written (and once more on a clean stop). A failure is logged and counted, never
        fatal: the roll-up states are stored, and the next pass redoes the minutes."""
        every = self.config.close_minutes_every_s
        if not every or not self._minutes_dirty:
            return
        if not final and time.monotonic() - self._minutes_closed_at < every:
            return
        self._minutes_closed_at = time.monotonic()
        self._minutes_dirty = False
        try:
            closed = close_minutes(self.writer.client)
        except Exception as exc:  # the store's reason, whatever the backend raised
            self._minutes_dirty = True
            self.metrics.store_errors.inc()
            self.metrics.dependencies.down(STORE, "close_minutes", exc)
            log.warning("closing flow minutes failed (retried in %.0f s): %s", every, exc)
            return
        self.metrics.dependencies.up(STORE)
        if closed:
            log.debug("finalised %d flow minutes", closed)

    def _flush_all(self) -> None:
        for chunk in list(self._chunks.values()):
            if chunk.planned_last is None:
                self._flush(chunk)
        # A half-replayed planned chunk is left uncommitted: the next run replays it whole.

    # -- writing -----------------------------------------------------------------------
    def _flush(self, chunk: Chunk) -> None:
        """Cut `chunk` (consumer thread) and hand it to its writer, waiting while the writer's
        queue is full."""
        self._chunks.pop((chunk.topic, chunk.partition), None)
        if not self._writer_threads:  # not running (closing): write it here
            self._write(chunk, self.writer)
            self._commit_written(wait=True)
            return
        # A partition always goes to the same writer: its chunks are inserted in cut order.
        cut = self._cut[(zlib.crc32(chunk.topic.encode()) + chunk.partition) % len(self._cut)]
        while True:
            self._check_writer()
            try:
                cut.put(chunk, timeout=0.2)
                return
            except queue.Full:
                continue

    def _write(self, chunk: Chunk, writer: StoreWriter) -> None:
        """Plan and insert one chunk through `writer` (a writer thread); the consumer thread
        commits its offset afterwards."""
        kind = KINDS[chunk.topic]
        token = (
            f"{self.config.group_id}/{chunk.topic}/{chunk.partition}/"
            f"{chunk.first_offset}-{chunk.last_offset}"
        )
        start = time.perf_counter()
        if chunk.planned_last is None:
            self._retrying(
                lambda: writer.client.insert(
                    PLANS_TABLE,
                    [
                        [
                            self.config.group_id,
                            chunk.topic,
                            chunk.partition,
                            chunk.first_offset,
                            chunk.last_offset,
                        ]
                    ],
                    column_names=["group_id", "topic", "partition", "first_offset", "last_offset"],
                    # on a cluster: stored on a majority of the nodes before the chunk goes in
                    settings={"insert_quorum": "auto"} if self.config.cluster else None,
                ),
                "plan",
            )
        rows = self._insert(kind, chunk, token, writer) if chunk.payloads else 0
        if rows and chunk.topic in FAST_TOPICS:  # the topics that feed the flow roll-ups
            self._minutes_dirty = True
        self.metrics.batch_seconds.labels(chunk.topic).observe(time.perf_counter() - start)
        self.metrics.rows.labels(kind.ingest_table).inc(rows)
        if self._after_insert:
            self._after_insert(chunk)
        # Only its offsets are needed from here on.
        chunk.payloads, chunk.messages, chunk.versions = [], [], []
        self._written.put(chunk)  # committed by the consumer thread (_commit_written)

    def _commit_written(self, wait: bool) -> None:
        """Commit the offsets of the chunks the writer has stored (consumer thread: librdkafka
        serves a commit from a thread that is not polling only after long delays). `wait`:
        synchronously, as on a revoke or a stop; otherwise asynchronously."""
        latest: dict[tuple[str, int], Chunk] = {}
        while True:
            try:
                chunk = self._written.get_nowait()
            except queue.Empty:
                break
            latest[(chunk.topic, chunk.partition)] = chunk  # in offset order per partition
        if not latest:
            return
        self._consumer.commit(
            offsets=[
                TopicPartition(c.topic, c.partition, c.last_offset + 1) for c in latest.values()
            ],
            asynchronous=not wait,
        )
        for chunk in latest.values():
            self._update_lag(chunk)

    def _insert(self, kind: RecordKind, chunk: Chunk, token: str, writer: StoreWriter) -> int:
        # Encoded here, on the writer thread (the Arrow codec releases the GIL): the consumer
        # thread only polls and cuts, and with two writers two chunks encode at once
        # (1.07-1.31x the sink rate of encoding on the consumer thread: docs/datasets.md).
        reason: Exception | None = None
        try:
            encoded = self._encode(kind, chunk, writer)
        except UndecodableBatch as exc:
            reason = exc
        if reason is None:
            if not chunk.payloads:  # every message was refused (and dead-lettered)
                return 0
            try:
                return self._retrying(
                    lambda: writer.insert(kind, chunk.payloads, token, encoded),
                    "insert",
                    decode_ok=False,
                )
            except _Undecodable as exc:
                reason = exc
        log.warning(
            "%s[%d]: chunk could not be decoded (%s); checking each message",
            chunk.topic,
            chunk.partition,
            reason,
        )
        # Isolate the poison: strict Python decode, then ClickHouse message by message. The
        # token keeps the salvage idempotent too (it is derived from the same offsets).
        good: list[bytes] = []
        for msg in chunk.messages:
            try:
                decode(TOPICS[chunk.topic], msg.value(), msg.headers())
            except DecodeError as exc:
                self._dead_letter(msg, str(exc))
                continue
            try:
                writer.insert(kind, [msg.value()], f"{token}/probe/{msg.offset()}")
            except StoreWriteError as exc:
                if not _is_decode_error(exc):
                    raise
                self._dead_letter(msg, f"store cannot decode it: {exc}")
                continue
            good.append(msg.value())
        return len(good)

    def _encode(self, kind: RecordKind, chunk: Chunk, writer: StoreWriter) -> Encoded:
        """Encode `chunk` for its insert. A message the encoder refuses by index is
        dead-lettered with the strict decoder's reason and left out of the chunk, and the rest
        is encoded again: bad input costs no good message. The first refusal has every other
        message of the chunk decoded strictly in Python (one more encode for any number of bad
        messages, not one each). The chunk's token still covers the same offsets, and a replay
        of them refuses the same messages, so the insert stays idempotent. Raises
        UndecodableBatch when the encoder refuses the chunk as a whole (no message named)."""
        topic = TOPICS[chunk.topic]
        swept = False
        while True:
            try:
                return writer.encode(kind, chunk.payloads, chunk.versions)
            except UndecodableBatch as exc:
                index = exc.index
                if index is None or not 0 <= index < len(chunk.messages):
                    raise
                msg, version = chunk.messages[index], chunk.versions[index]
                try:
                    decode_payload(topic, msg.value(), version)
                except DecodeError as strict:
                    reason = str(strict)
                else:  # refused by the codec only (e.g. an enum value with no name to store)
                    reason = f"the store cannot take it: {exc}"
                self._set_aside(chunk, index, reason)
            if not swept:
                swept = True
                for i in reversed(range(len(chunk.messages))):
                    try:
                        decode_payload(topic, chunk.messages[i].value(), chunk.versions[i])
                    except DecodeError as strict:
                        self._set_aside(chunk, i, str(strict))

    def _set_aside(self, chunk: Chunk, index: int, reason: str) -> None:
        """Dead-letter message `index` of `chunk` and drop it from the chunk's inserts."""
        self._dead_letter(chunk.messages[index], reason)
        del chunk.messages[index], chunk.payloads[index], chunk.versions[index]

    def _retrying(self, action: Callable[[], object], what: str, decode_ok: bool = True) -> int:
        """Run `action` until it succeeds: the store being slow or away is not data loss.
        Between attempts the wait doubles from `retry_backoff_s` up to `retry_backoff_max_s`;
        with `decode_ok=False` a batch the store cannot decode is raised, not retried."""

        def attempt() -> object:
            try:
                return action()
            except StoreWriteError as exc:
                if not decode_ok and _is_decode_error(exc):
                    raise _Undecodable(str(exc)) from exc
                raise

        def before_sleep(state: RetryCallState) -> None:
            self.metrics.store_errors.inc()
            error = state.outcome.exception() if state.outcome else None
            self.metrics.dependencies.down(STORE, what, error)
            wait = state.next_action.sleep if state.next_action else 0.0
            log.warning("store %s failed, retrying in %.1fs: %s", what, wait, error)

        retrying = Retrying(
            wait=wait_exponential(
                multiplier=self.config.retry_backoff_s, max=self.config.retry_backoff_max_s
            ),
            # any error of the store client (it raises per backend), never KeyboardInterrupt
            retry=retry_if_exception(
                lambda e: isinstance(e, Exception) and not isinstance(e, _Undecodable)
            ),
            before_sleep=before_sleep,
            sleep=time.sleep,
        )
        result = retrying(attempt)
        self.metrics.dependencies.up(STORE)
        return int(result) if isinstance(result, int) else 0

    def _dead_letter(self, msg: KafkaMessage, reason: str) -> None:
        self.metrics.dead_letters.labels(msg.topic()).inc()
        if msg.topic() == DEADLETTER.name:
            # Never dead-letter a dead letter (that would loop); it stays in Kafka.
            log.error(
                "unreadable dead letter %s@%s skipped: %s", msg.partition(), msg.offset(), reason
            )
            return
        key = msg.key()
        letter = DeadLetter(
            header=RecordHeader(
                schema_version=SCHEMA_VERSION,
                source_id=f"sink/{self.config.group_id}",
                sequence=next(self._dl_sequence),
                timestamp_ns=time.time_ns(),
            ),
            topic=msg.topic() or "",
            partition=msg.partition() or 0,
            offset=msg.offset() or 0,
            key=key if isinstance(key, bytes) else (key or "").encode(),
            value=msg.value() or b"",
            reason=reason,
            consumer_group=self.config.group_id,
            original_timestamp_ms=msg.timestamp()[1],
        )
        self._deadletters.send(DEADLETTER.name, letter, key=msg.topic())
        self._deadletters.flush()  # on the dead-letter topic before the offset moves on
        log.warning(
            "dead-lettered %s[%s]@%s: %s", msg.topic(), msg.partition(), msg.offset(), reason
        )

    def _update_lag(self, chunk: Chunk) -> None:
        try:
            _, high = self._consumer.get_watermark_offsets(
                TopicPartition(chunk.topic, chunk.partition), cached=True
            )
        except KafkaException:
            return
        if high >= 0:
            self.metrics.lag.labels(chunk.topic, str(chunk.partition)).set(
                max(0, high - chunk.last_offset - 1)
            )

    def close(self) -> None:
        self._consumer.close()
        self._deadletters.flush()


class _Undecodable(Exception):
    pass


# ClickHouse error codes meaning "the bytes are not what the schema says".
_DECODE_CODES = ("Code: 27.", "Code: 32.", "Code: 33.", "Code: 444.", "Code: 117.", "Code: 6.")


def _is_decode_error(exc: Exception) -> bool:
    if isinstance(exc, UndecodableBatch):
        return True
    text = str(exc)
    return any(code in text for code in _DECODE_CODES) or "Protobuf" in text


def topics_of(kinds: Iterable[str]) -> list[str]:
    """Topic names for kind names or topic names (`flow` or `cgloop.flows.v1`)."""
    by_name = {k.name: k.topic for k in KINDS.values()}
    out = []
    for item in kinds:
        if item in KINDS:
            out.append(item)
        elif item in by_name:
            out.append(by_name[item])
        else:
            raise ValueError(f"unknown record kind or topic {item!r}; kinds: {', '.join(by_name)}")
    return out
