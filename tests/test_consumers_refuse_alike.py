"""The sink, the analytics worker and the policy engine refuse the same messages, for the same
reason: one table of bad messages goes through the real broker to all three (the sink inside
a real `cgloop store serve --sink`), and each consumer group's dead letters are compared.

Before, a detection with `cgloop-schema-version: 99` was dead-lettered by the sink but acted
on by the engine, and a flow or INT batch with an empty source id was dead-lettered by the
worker but stored (flows) or silently dropped (INT) by the sink.
"""

from __future__ import annotations

import os
import subprocess
import threading
import time
import uuid
from pathlib import Path

import pytest
from cgloop.analytics.engine import AnalyticsEngine
from cgloop.analytics.worker import Worker
from cgloop.bus.codec import SCHEMA_HEADER, TYPE_HEADER, headers_for
from cgloop.bus.kafka import BatchConsumer, BatchProducer, ensure_topics
from cgloop.bus.topics import DEADLETTER
from cgloop.contracts.samples import SAMPLES
from cgloop.policy import service
from cgloop.policy.actuators import NodeAgentActuator, Router
from cgloop.policy.engine import Engine
from cgloop.testing import cgloop_cmd, free_port, wait_for_store

pytestmark = pytest.mark.kafka


def _varint(n: int) -> bytes:
    out = b""
    while n > 0x7F:
        out += bytes([n & 0x7F | 0x80])
        n >>= 7
    return out + bytes([n])


def _with_unknown_field(batch) -> bytes:
    """The batch with field 999 added to its first record: parses, but is not that type."""
    record = batch.records[0].SerializeToString() + _varint(999 << 3) + b"\x01"
    return b"\x0a" + _varint(len(record)) + record


def _inner(record):
    """The record itself, or the one an envelope (IntRecord) carries."""
    if "header" in record.DESCRIPTOR.fields_by_name:
        return record
    return getattr(record, record.WhichOneof(record.DESCRIPTOR.oneofs[0].name))


def _bad(topic: str, sample: str, source: str) -> list[tuple[str, bytes, list | None]]:
    """Bad messages for `topic`, built from a valid sample batch of its type."""
    batch = SAMPLES[sample]()
    for r in batch.records:
        _inner(r).header.source_id = source
    good = batch.SerializeToString()
    ok = headers_for(batch)
    name = batch.DESCRIPTOR.full_name.encode()
    no_source = type(batch)()
    no_source.CopyFrom(batch)
    _inner(no_source.records[0]).header.source_id = ""
    future_record = type(batch)()
    future_record.CopyFrom(batch)
    _inner(future_record.records[0]).header.schema_version = 99
    other = SAMPLES[
        "probe_record_batch" if sample != "probe_record_batch" else "node_sample_batch"
    ]()
    out = [
        (topic, good, [(TYPE_HEADER, name), (SCHEMA_HEADER, b"99")]),
        (topic, good, None),
        (topic, good, [(TYPE_HEADER, name)]),
        (topic, no_source.SerializeToString(), ok),
        (topic, future_record.SerializeToString(), ok),
        (topic, other.SerializeToString(), headers_for(other)),
        (topic, other.SerializeToString(), ok),  # lying type header
        (topic, b"\xff\xff\xff\xff garbage", ok),
        (topic, b"", ok),
    ]
    if sample != "int_record_batch":  # IntRecord's records are envelopes
        out.append((topic, _with_unknown_field(batch), ok))
    return out


def _letters(bootstrap: str, groups: set[str], want: int, timeout_s: float = 90) -> dict:
    """(group, topic, offset) -> reason of the dead letters of `groups`."""
    consumer = BatchConsumer(bootstrap, f"dl-reader-{uuid.uuid4().hex}", [DEADLETTER.name])
    out: dict[tuple[str, str, int], str] = {}
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline and len(out) < want:
            item = consumer.poll(1.0)
            if item is not None and item[1].consumer_group in groups:
                letter = item[1]
                out[(letter.consumer_group, letter.topic, letter.offset)] = letter.reason
    finally:
        consumer.close()
    return out


def test_the_sink_the_worker_and_the_engine_refuse_the_same_messages(
    stack_settings, tmp_path: Path
) -> None:
    bootstrap = stack_settings.bootstrap_servers
    ensure_topics(bootstrap)
    run = uuid.uuid4().hex
    source = f"alike-{run}"
    flows = _bad("cgloop.flows.v1", "flow_record_batch", source)
    ints = _bad("cgloop.int.v1", "int_record_batch", source)
    detections = _bad("cgloop.detections.v1", "detection_batch", source)
    producer = BatchProducer(bootstrap)
    for topic, value, headers in flows + ints + detections:
        producer.send_raw(topic, value, key=run, headers=headers)
    producer.flush()

    sink_group, worker_group, engine_group = (f"{x}-{run}" for x in ("sink", "worker", "engine"))
    port = free_port()
    log = (tmp_path / "store.log").open("w")
    serve = ["store", "serve", "--path", str(tmp_path / "store"), "--port", str(port)]
    serve += ["--sink", "--bootstrap", bootstrap, "--group", sink_group]
    store = subprocess.Popen(
        cgloop_cmd(*serve),
        stdout=log,
        stderr=subprocess.STDOUT,
        env={**os.environ, "CGLOOP_STATE_DIR": str(tmp_path / "state")},
    )
    stop = threading.Event()
    engine = Engine([], Router(NodeAgentActuator({})), source_id=f"policy-engine-{run}")
    engine_thread = threading.Thread(
        target=service.run, args=(engine, bootstrap, stop, engine_group), daemon=True
    )
    try:
        wait_for_store(
            f"http://127.0.0.1:{port}", store, lambda: (tmp_path / "store.log").read_text()
        )
        engine_thread.start()
        worker = Worker(
            AnalyticsEngine(None), bootstrap, tmp_path / "worker.json", worker_group,
            topics=("cgloop.flows.v1", "cgloop.int.v1"),
        )  # fmt: skip
        deadline = time.monotonic() + 60
        try:
            while time.monotonic() < deadline and worker.consumer.stats.dead_lettered < len(
                flows
            ) + len(ints):
                worker.step(0.5)
        finally:
            worker.close()
        want = 2 * (len(flows) + len(ints) + len(detections))
        letters = _letters(bootstrap, {sink_group, worker_group, engine_group}, want)
    finally:
        stop.set()
        engine_thread.join(30)
        store.terminate()
        try:
            store.wait(30)
        except subprocess.TimeoutExpired:
            store.kill()
            store.wait()
        log.close()

    def refused(group: str, topics: set[str]) -> dict[tuple[str, int], str]:
        return {(t, o): r for (g, t, o), r in letters.items() if g == group and t in topics}

    fast = {"cgloop.flows.v1", "cgloop.int.v1"}
    by_sink = refused(sink_group, fast | {"cgloop.detections.v1"})
    # Every bad message is refused, by each consumer that reads its topic, with the same words.
    assert refused(worker_group, fast) == {k: v for k, v in by_sink.items() if k[0] in fast}
    assert refused(engine_group, {"cgloop.detections.v1"}) == {
        k: v for k, v in by_sink.items() if k[0] == "cgloop.detections.v1"
    }
    assert len(by_sink) == len(flows) + len(ints) + len(detections), sorted(by_sink.items())
