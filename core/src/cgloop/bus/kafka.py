"""Producing and consuming cgloop batches with confluent-kafka (librdkafka).

Delivery is at least once: a consumer commits an offset only after its handler returned, or
after an undecodable message is safely on the dead-letter topic. Handlers therefore must be
idempotent (records carry source id + sequence for exactly that).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from cgloop.bus.codec import DecodeError, decode, encode, headers_for
from cgloop.bus.topics import DEADLETTER, TOPICS, Topic, topic
from cgloop.config import kafka_client_config
from cgloop.contracts import SCHEMA_VERSION
from cgloop.contracts.bus import BusProducer, producer_settings
from cgloop.metrics import KAFKA, DependencyHealth, PipelineMetrics, batch_size
from cgloop.v1.common_pb2 import RecordHeader
from cgloop.v1.deadletter_pb2 import DeadLetter
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka import Message as KafkaMessage
from confluent_kafka.admin import AdminClient, NewTopic
from google.protobuf.message import Message

log = logging.getLogger(__name__)
# librdkafka's own log lines go through Python logging (warnings and up reach stderr by default)
# instead of being printed raw by the C library.
librdkafka_log = logging.getLogger("cgloop.bus.librdkafka")


class _ConnectionChurn(logging.Filter):
    """Drops librdkafka's connection failures (facility FAIL: a line per broker per reconnect
    attempt, several a second while a broker is away) for clients that report them as
    cgloop_dependency_up and one log line per change instead (`health_callbacks`)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("FAIL ")


# The logger of clients given a DependencyHealth.
monitored_librdkafka_log = librdkafka_log.getChild("monitored")
monitored_librdkafka_log.addFilter(_ConnectionChurn())


# librdkafka errors meaning the client cannot reach Kafka (the rest are counted only).
UNREACHABLE = frozenset({
    KafkaError._TRANSPORT, KafkaError._ALL_BROKERS_DOWN, KafkaError._RESOLVE,
    KafkaError._AUTHENTICATION,
})  # fmt: skip
# How often a client given a DependencyHealth reports its brokers' states (an idle daemon
# learns that Kafka is back within this, not only with its next message).
STATS_INTERVAL_MS = 5000


def error_name(err: KafkaError) -> str:
    """`transport` for _TRANSPORT: a librdkafka error as a metric label."""
    return err.name().lstrip("_").lower()


def health_callbacks(health: DependencyHealth) -> dict:
    """librdkafka callbacks feeding `health`'s Kafka state: `error_cb` (unreachable: down; any
    other error: counted, and fatal ones logged) and `stats_cb` (a broker seen UP: up). They run
    in the thread that polls the client; librdkafka's own line per failed reconnect is left out of
its log (`_ConnectionChurn`). With an `error_cb` set, librdkafka hands these errors
    to it instead of returning them from a consumer's poll, where they would raise."""

    def on_error(err: KafkaError) -> None:
        if err.code() in UNREACHABLE:
            health.down(KAFKA, error_name(err), err.str())
        else:
            health.error(KAFKA, error_name(err))
            if err.fatal():
                log.error("kafka client failed for good: %s", err.str())

    def on_stats(text: str) -> None:
        try:
            brokers = json.loads(text).get("brokers", {}).values()
        except (ValueError, AttributeError):
            return
        if any(b.get("state") == "UP" and b.get("nodeid", -1) >= 0 for b in brokers):
            health.up(KAFKA)

    return {
        "logger": monitored_librdkafka_log,
        "error_cb": on_error,
        "stats_cb": on_stats,
        "statistics.interval.ms": STATS_INTERVAL_MS,
    }


def client_config(
    bootstrap: str, config: dict | None = None, health: DependencyHealth | None = None
) -> dict:
    """librdkafka properties for a cgloop client of `bootstrap`: its security settings
    (CGLOOP_KAFKA_SECURITY_PROTOCOL and friends, or the embedded broker's credentials) unless
    `config` gives them, then `config`. Every producer, consumer and admin client starts here.
    With `health`, the client reports whether it reaches Kafka (`health_callbacks`)."""
    callbacks = health_callbacks(health) if health is not None else {}
    return {
        "logger": librdkafka_log,
        **callbacks,
        **kafka_client_config(bootstrap),
        **(config or {}),
    }


def ensure_topics(
    bootstrap: str,
    topics: Iterable[Topic] = TOPICS.values(),
    timeout_s: float = 30,
    config: dict | None = None,
) -> list[str]:
    """Create the missing topics with their partitions and retention; return the created names."""
    admin = AdminClient(client_config(bootstrap, config))
    existing = set(admin.list_topics(timeout=timeout_s).topics)
    wanted = [t for t in topics if t.name not in existing]
    if not wanted:
        return []
    futures = admin.create_topics(
        [
            NewTopic(t.name, num_partitions=t.partitions, replication_factor=1, config=t.config())
            for t in wanted
        ],
        operation_timeout=timeout_s,
    )
    created = []
    for name, fut in futures.items():
        try:
            fut.result()
            created.append(name)
        except KafkaException as exc:
            if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                raise RuntimeError(f"cannot create topic {name}: {exc}") from exc
    return created


class GroupOffsets:
    """Read-only view of a consumer group's progress: the end offsets of topics and what the
    group has committed on them. Uses a consumer that carries the group's id but never
    subscribes, so it joins nothing and moves nothing. (AdminClient's
    list_consumer_group_offsets crashed the interpreter with SIGSEGV in CI while the group's
    coordinator was loading; OffsetFetch through a consumer returns an error instead.)"""

    def __init__(self, bootstrap: str, group: str, config: dict | None = None) -> None:
        self.group = group
        self._consumer = Consumer(client_config(bootstrap, {
            **(config or {}), "group.id": group, "enable.auto.commit": False,
        }))

    def partitions(self, topics: Iterable[str], timeout_s: float = 10) -> list[tuple[str, int]]:
        """Every partition of those `topics` that exist."""
        meta = self._consumer.list_topics(timeout=timeout_s).topics
        return [(t, p) for t in topics if t in meta for p in sorted(meta[t].partitions)]

    def ends(self, partitions: Iterable[tuple[str, int]], timeout_s: float = 10) -> dict:
        """The offset the next message of each partition will get."""
        from confluent_kafka import TopicPartition

        return {
            (t, p): self._consumer.get_watermark_offsets(TopicPartition(t, p), timeout_s)[1]
            for t, p in partitions
        }

    def committed(self, partitions: Iterable[tuple[str, int]], timeout_s: float = 10) -> dict:
        """The group's committed offset on each partition; -1 where it has committed nothing.
        Raises KafkaException while the coordinator cannot answer (callers retry)."""
        from confluent_kafka import TopicPartition

        got = self._consumer.committed([TopicPartition(t, p) for t, p in partitions], timeout_s)
        for tp in got:
            if tp.error is not None:
                raise KafkaException(tp.error)
        return {(tp.topic, tp.partition): (tp.offset if tp.offset >= 0 else -1) for tp in got}

    def close(self) -> None:
        self._consumer.close()


class BatchProducer:
    """Sends protobuf batches to cgloop topics; `flush()` before exit or after critical sends.

    Runs with the librdkafka settings declared for Python producers in bus.proto
    (BUS_PRODUCER_PYTHON: idempotent, acks=all, lz4, linger); `config` may add what is the
    caller's own (security, timeouts, size limits) but may not change a declared setting."""

    def __init__(
        self,
        bootstrap: str,
        client_id: str = "cgloop",
        metrics: PipelineMetrics | None = None,
        **config: str | int,
    ) -> None:
        # Kafka's state (cgloop_dependency_up) when given: errors, deliveries.
        self.health = metrics.dependencies if metrics is not None else None
        declared = producer_settings(BusProducer.BUS_PRODUCER_PYTHON)
        changed = sorted(k for k in config if k in declared)
        if changed:
            raise ValueError(
                f"producer settings {changed} are declared once for every producer "
                "(proto/cgloop/v1/bus.proto, BusProducer); name a difference there"
            )
        # What the producer was built with (tests compare it to the table).
        self.config: dict = client_config(
            bootstrap, {"client.id": client_id, **config, **declared}, self.health
        )
        self._producer = Producer(self.config)
        self.delivery_errors: list[str] = []

    def _on_delivery(self, err: KafkaError | None, msg: KafkaMessage) -> None:
        if err is not None:
            self.delivery_errors.append(f"{msg.topic()}: {err}")
            log.error("delivery to %s failed: %s", msg.topic(), err)
            if self.health is not None:
                self.health.error(KAFKA, error_name(err))
        elif self.health is not None:
            self.health.up(KAFKA)

    def send(self, topic_name: str, batch: Message, key: bytes | str | None = None) -> None:
        expected = topic(topic_name).full_type_name
        if batch.DESCRIPTOR.full_name != expected:
            raise TypeError(
                f"topic {topic_name} carries {expected}, not {batch.DESCRIPTOR.full_name}"
            )
        self.send_raw(topic_name, encode(batch), key, headers_for(batch))

    def send_raw(
        self,
        topic_name: str,
        value: bytes,
        key: bytes | str | None = None,
        headers: list[tuple[str, bytes]] | None = None,
    ) -> None:
        while True:
            try:
                self._producer.produce(
                    topic_name, value=value, key=key, headers=headers, on_delivery=self._on_delivery
                )
                break
            except BufferError:  # local queue full: wait for deliveries instead of growing memory
                self._producer.poll(0.1)
        self._producer.poll(0)

    def flush(self, timeout_s: float = 30) -> None:
        remaining = self._producer.flush(timeout_s)
        if remaining:
            raise RuntimeError(f"{remaining} messages still undelivered after {timeout_s}s")
        if self.delivery_errors:
            errors, self.delivery_errors = self.delivery_errors, []
            raise RuntimeError(f"{len(errors)} deliveries failed, first: {errors[0]}")


@dataclass
class ConsumerStats:
    decoded: int = 0
    dead_lettered: int = 0
    reasons: list[str] = field(default_factory=list)


class BatchConsumer:
    """Consumes cgloop topics in a group, decoding each message as its topic's batch type.

    Undecodable messages are published to the dead-letter topic (with topic, partition, offset,
    key, the original bytes and the reason) and skipped; the consumer carries on.
    """

    def __init__(
        self,
        bootstrap: str,
        group_id: str,
        topics: Iterable[str],
        source_id: str | None = None,
        metrics: PipelineMetrics | None = None,
        on_assign: Callable | None = None,
        on_revoke: Callable | None = None,
        **config: str | int,
    ) -> None:
        """`on_assign` / `on_revoke(consumer, partitions)`: confluent-kafka's rebalance
        callbacks (a group member taking or giving up partitions), passed to subscribe."""
        self.topics = [topic(name) for name in topics]
        # Records in, dead letters and lag per partition (cgloop.metrics), when given.
        self.metrics = metrics
        # ... and Kafka's state (cgloop_dependency_up{dependency="kafka"}).
        self.health = metrics.dependencies if metrics is not None else None
        self.group_id = group_id
        self.source_id = source_id or f"consumer/{group_id}"
        self._consumer = Consumer(
            client_config(
                bootstrap,
                {
                    "group.id": group_id,
                    "enable.auto.commit": False,
                    "auto.offset.reset": "earliest",
                    **config,
                },
                self.health,
            )
        )
        callbacks = {k: v for k, v in (("on_assign", on_assign), ("on_revoke", on_revoke)) if v}
        self._consumer.subscribe([t.name for t in self.topics], **callbacks)
        # The dead-letter producer authenticates as the consumer does.
        security = {k: v for k, v in config.items() if k.startswith(("security.", "sasl.", "ssl."))}
        # It is idle mostly; while Kafka is away the consumer reports it (its health), so its
        # reconnect attempts stay out of the log as the consumer's do.
        quiet = {"logger": monitored_librdkafka_log} if self.health is not None else {}
        self._deadletters = BatchProducer(
            bootstrap, client_id=f"{group_id}-deadletter", **security, **quiet
        )
        self._dl_sequence = 0
        self.stats = ConsumerStats()

    def _dead_letter(self, msg: KafkaMessage, reason: str) -> None:
        self._dl_sequence += 1
        key = msg.key()
        letter = DeadLetter(
            header=RecordHeader(
                schema_version=SCHEMA_VERSION,
                source_id=self.source_id,
                sequence=self._dl_sequence,
                timestamp_ns=time.time_ns(),
            ),
            topic=msg.topic() or "",
            partition=msg.partition() or 0,
            offset=msg.offset() or 0,
            key=key if isinstance(key, bytes) else (key or "").encode(),
            value=msg.value() or b"",
            reason=reason,
            consumer_group=self.group_id,
            original_timestamp_ms=msg.timestamp()[1],
        )
        self._deadletters.send(DEADLETTER.name, letter, key=msg.topic())
        self._deadletters.flush()  # on the dead-letter topic before the offset moves on
        self.stats.dead_lettered += 1
        self.stats.reasons.append(reason)
        if self.metrics is not None:
            self.metrics.dead_letters.labels(msg.topic() or "").inc()
        log.warning(
            "dead-lettered %s[%s]@%s: %s", msg.topic(), msg.partition(), msg.offset(), reason
        )

    def poll(self, timeout_s: float = 1.0) -> tuple[Topic, Message, KafkaMessage] | None:
        """Next decodable batch, or None on timeout. Dead-letters what does not decode."""
        deadline = time.monotonic() + timeout_s
        while (left := deadline - time.monotonic()) > 0:
            msg = self._consumer.poll(left)
            if msg is None:
                return None
            if msg.error():
                if msg.error().code() == KafkaError._PARTITION_EOF:
                    continue
                raise KafkaException(msg.error())
            if self.health is not None:
                self.health.up(KAFKA)
            t = TOPICS[msg.topic()]
            try:
                batch = decode(t, msg.value(), msg.headers())
            except DecodeError as exc:
                self._dead_letter(msg, str(exc))
                self._consumer.commit(message=msg, asynchronous=False)
                continue
            self.stats.decoded += 1
            if self.metrics is not None:
                self._observe(msg, batch)
            return t, batch, msg
        return None

    def _observe(self, msg: KafkaMessage, batch: Message) -> None:
        assert self.metrics is not None
        topic_name, partition = msg.topic() or "", msg.partition() or 0
        try:  # the end librdkafka last learnt (no broker round trip)
            _, high = self._consumer.get_watermark_offsets(
                TopicPartition(topic_name, partition), cached=True
            )
        except KafkaException:
            high = -1
        self.metrics.consumed(topic_name, partition, msg.offset() or 0, high, batch_size(batch))

    def commit(self, msg: KafkaMessage, asynchronous: bool = False) -> None:
        self._consumer.commit(message=msg, asynchronous=asynchronous)

    def run(
        self, handler: Callable[[Topic, Message], None], should_stop: Callable[[], bool]
    ) -> None:
        """Hand each batch to `handler`, committing after it returns, until `should_stop()`."""
        while not should_stop():
            item = self.poll(0.5)
            if item is None:
                continue
            t, batch, msg = item
            handler(t, batch)
            self.commit(msg)

    def close(self) -> None:
        self._consumer.close()
        self._deadletters.flush()
