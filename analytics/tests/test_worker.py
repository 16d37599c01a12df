"""The streaming worker on the real Kafka broker (conftest `stack_settings`)."""

from __future__ import annotations

import time
import uuid

import pytest
from cgloop.analytics.engine import AnalyticsEngine
from cgloop.analytics.records import conversation_key
from cgloop.analytics.synthetic import Degradation, gaming_records
from cgloop.analytics.worker import Worker
from cgloop.bus.kafka import BatchConsumer, BatchProducer, ensure_topics
from cgloop.bus.topics import DETECTIONS, FLOWS, PROBES
from cgloop.v1.common_pb2 import RecordHeader
from cgloop.v1.detection_pb2 import DetectionKind as K
from cgloop.v1.flow_pb2 import FlowRecordBatch
from cgloop.v1.probe_pb2 import ProbeRecord, ProbeRecordBatch

pytestmark = pytest.mark.kafka


def _drain(bootstrap: str, group: str, want: int = 0, timeout_s: float = 20) -> list:
    cons = BatchConsumer(bootstrap, group, [DETECTIONS.name])
    out, deadline, quiet = [], time.monotonic() + timeout_s, 0
    while time.monotonic() < deadline:
        item = cons.poll(1.0)
        if item is None:
            quiet += 1
            if quiet >= 3 and len(out) >= want:
                break
            continue
        quiet = 0
        out += list(item[1].records)
        cons.commit(item[2])
    cons.close()
    return out


def _run_until_idle(worker: Worker, idle_s: float = 4.0, limit_s: float = 60) -> None:
    start, idle_since = time.monotonic(), time.monotonic()
    while time.monotonic() - start < limit_s:
        if worker.step(0.5):
            idle_since = time.monotonic()
        elif time.monotonic() - idle_since > idle_s and worker.stats.messages:
            break
    worker.close()


def test_worker_detects_and_never_realerts_after_restart(stack_settings, small_model, tmp_path):
    bootstrap = stack_settings.bootstrap_servers
    ensure_topics(bootstrap)
    model, card = small_model
    run = uuid.uuid4().hex[:8]
    # one session with a planted jitter episode, unique addresses for this run
    recs = gaming_records("gfn", 25, seed=21, degradations=(Degradation(12, 20, jitter_ms=15),),
                          client=bytes([10, 77, int(run[:2], 16), int(run[2:4], 16)]))
    prod = BatchProducer(bootstrap)
    key = repr(conversation_key(recs[0].five_tuple)).encode()
    for i in range(0, len(recs), 10):
        prod.send(FLOWS.name, FlowRecordBatch(records=recs[i:i + 10]), key=key)
    prod.send_raw(FLOWS.name, b"\x0a\x40garbage", key=key)  # must be dead-lettered
    for k in range(8):  # other topics and partitions: their progress must be committed too
        probe = ProbeRecord(
            header=RecordHeader(schema_version=1, source_id=f"test/{run}-{k}", sequence=1),
            probe_id=f"{run}-{k}", target_addr=bytes([192, 0, 2, k]), rtt_ns=1_000_000,
        )
        prod.send(PROBES.name, ProbeRecordBatch(records=[probe]), key=f"{run}-{k}")
    prod.flush()

    state = tmp_path / "worker.json"
    group = f"analytics-test-{run}"
    w = Worker(AnalyticsEngine(model, card.version), bootstrap, state, group)
    _run_until_idle(w)
    assert w.consumer.stats.dead_lettered >= 1
    mine = [d for d in _drain(bootstrap, f"reader-{run}", want=2)
            if d.labels.get("flow", "").find(f"10.77.{int(run[:2], 16)}.") >= 0
            or d.flow.dst_addr == bytes([10, 77, int(run[:2], 16), int(run[2:4], 16)])]
    kinds = sorted(d.kind for d in mine)
    assert K.DETECTION_KIND_GAMING_FLOW_CLASSIFIED in kinds
    assert kinds.count(K.DETECTION_KIND_SLO_JITTER) == 1
    first_total = w.stats.detections
    assert first_total >= 2 and state.exists()
    assert w.stats.latencies_s and max(w.stats.latencies_s) < 5
    # the same on the worker's /metrics registry
    sample = w.metrics.registry.get_sample_value
    assert sample("cgloop_analytics_detection_latency_seconds_count", {"kind": "slo_jitter"}) == 1
    assert sample("cgloop_records_out_total", {"topic": DETECTIONS.name}) == first_total
    assert sample("cgloop_dead_letters_total", {"topic": FLOWS.name}) >= 1
    assert sample("cgloop_records_in_total", {"topic": FLOWS.name}) >= len(recs)

    # restart in the same group: committed offsets, nothing new to say
    w2 = Worker(AnalyticsEngine(model, card.version), bootstrap, state, group)
    _run_until_idle(w2, idle_s=3, limit_s=12)
    assert w2.stats.detections == 0
    assert w2.stats.messages == 0, "a partition's progress was not committed: re-read"

    # offsets lost (a new group re-reads everything) but the state file survives:
    # replays below the persisted offsets are skipped, the rest is suppressed
    w3 = Worker(AnalyticsEngine(model, card.version), bootstrap, state, f"{group}-again")
    _run_until_idle(w3)
    assert w3.stats.skipped_replays > 0
    assert w3.metrics.registry.get_sample_value(
        "cgloop_drops_total", {"reason": "replay"}
    ) == w3.stats.skipped_replays
    assert w3.stats.detections == 0, w3.stats
