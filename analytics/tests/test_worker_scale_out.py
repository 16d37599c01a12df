"""Two analytics workers in one consumer group on the real broker (conftest `stack_settings`):
a worker joins mid-stream and leaves again, and every detection a single engine makes of the
same stream is emitted exactly once (none twice, none lost), including episodes whose records
straddle a rebalance: the partition's new owner rebuilds the detectors' state by replaying
what the old one had handled, with that replay's output dropped (worker.py, "Scale-out")."""

from __future__ import annotations

import collections
import threading
import time
import uuid

import pytest
from cgloop.analytics.detectors import Suppressor
from cgloop.analytics.engine import AnalyticsEngine
from cgloop.analytics.worker import Worker
from cgloop.bus.kafka import BatchConsumer, BatchProducer, GroupOffsets, ensure_topics
from cgloop.bus.topics import DETECTIONS, FLOWS, NODES
from cgloop.v1.common_pb2 import FiveTuple, RecordHeader
from cgloop.v1.detection_pb2 import DetectionKind as K
from cgloop.v1.flow_pb2 import FlowRecord, FlowRecordBatch
from cgloop.v1.node_pb2 import CoreSample, NodeSample, NodeSampleBatch
from confluent_kafka import KafkaException

pytestmark = pytest.mark.kafka

NS = 1_000_000_000
STEP = NS // 10  # one node sample, one flow record every 100 ms of event time
N = 60  # of them per subject: 6 s
PHASES = (0, 20, 40, N)  # the stream in three parts: A alone, A and B, A alone again


def node_stream(run: str, t0: int) -> dict[str, list]:
    """9 nodes; node i's busiest core at 0.95 from sample 5 + 5 i for 1.5 s: the overload
    fires 1 s later, so onsets and firings fall on every side of the phase boundaries."""
    out = {}
    for i in range(9):
        node = f"so{run}n{i}"
        onset = 5 + 5 * i
        out[node] = [NodeSampleBatch(records=[NodeSample(
            header=RecordHeader(schema_version=1, source_id=f"{node}/node-agent",
                                sequence=k + 1, timestamp_ns=t0 + k * STEP),
            node_id=node,
            cores=[CoreSample(core=1, utilization=0.95 if onset <= k < onset + 15 else 0.2)],
        )]) for k in range(N)]
    return out


def flow_stream(run: str, t0: int) -> dict[str, list]:
    """6 flows ignoring CE in the L4S queue: each fires once its 5 s window is complete
    (record 50, in the third part), from bins the first part began."""
    out = {}
    tag = int(run[:2], 16)
    for i in range(6):
        ft = FiveTuple(src_addr=bytes([10, 99, tag, i]), dst_addr=bytes([10, 98, tag, i]),
                       src_port=5000 + i, dst_port=443, ip_protocol=17)
        out[f"flow-{run}-{i}"] = [FlowRecordBatch(records=[FlowRecord(
            header=RecordHeader(schema_version=1, source_id=f"edge{i % 2 + 1}/flow-probe",
                                sequence=k + 1, timestamp_ns=t0 + (k + 1) * STEP),
            five_tuple=ft, interface_name="cpe1", interval_start_ns=t0 + k * STEP,
            interval_end_ns=t0 + (k + 1) * STEP, packets=50, bytes=50_000,
            ecn_ect1_packets=35, ecn_ce_packets=15,
        )]) for k in range(N)]
    return out


def expected(streams: dict[str, list]) -> list[str]:
    """What one engine and one suppressor make of the stream (the worker's own steps)."""
    eng, sup, out = AnalyticsEngine(None), Suppressor(), []
    for k in range(N):
        for batches in streams.values():
            b = batches[k]
            recs = list(b.records)
            dets = eng.on_nodes(recs) if isinstance(b, NodeSampleBatch) else eng.on_flows(recs)
            out += [d.id for d in dets if sup.allow(d)]
    return out


class Running:
    """A worker stepping in a thread of its own until stopped."""

    def __init__(self, worker: Worker) -> None:
        self.worker = worker
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.is_set():
            self.worker.step(0.2)
        self.worker.close()

    def close(self) -> None:
        self.stop.set()
        self.thread.join(30)


def wait_caught_up(bootstrap: str, group: str, timeout_s: float = 90) -> None:
    offsets = GroupOffsets(bootstrap, group)
    try:
        parts = offsets.partitions([FLOWS.name, NODES.name])
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                ends = offsets.ends(parts)
                done = offsets.committed(parts)
            except KafkaException:  # the coordinator is busy with the group: ask again
                time.sleep(0.5)
                continue
            if all(done.get(p, -1) >= e for p, e in ends.items() if e > 0):
                return
            time.sleep(0.5)
        raise AssertionError(f"group {group} did not catch up in {timeout_s} s")
    finally:
        offsets.close()


def test_a_worker_joining_and_leaving_loses_and_repeats_no_detection(stack_settings, tmp_path):
    bootstrap = stack_settings.bootstrap_servers
    ensure_topics(bootstrap)
    run = uuid.uuid4().hex[:8]
    t0 = time.time_ns() - 3600 * NS  # event time of its own, an hour back
    nodes, flows = node_stream(run, t0), flow_stream(run, t0)
    want = expected({**nodes, **flows})
    assert sorted(collections.Counter(want).values()) == [1] * 15, "9 overloads, 6 abusers"
    prod = BatchProducer(bootstrap)

    def produce(lo: int, hi: int) -> None:
        for k in range(lo, hi):
            for node, batches in nodes.items():
                prod.send(NODES.name, batches[k], key=node)
            for key, batches in flows.items():
                prod.send(FLOWS.name, batches[k], key=key)
        prod.flush()

    group = f"scale-out-{run}"

    def worker(name: str) -> Worker:
        return Worker(AnalyticsEngine(None), bootstrap, tmp_path / f"{name}.json", group,
                      rebuild_s=300)

    produce(*PHASES[0:2])
    a = Running(worker("a"))
    b = None
    try:
        wait_caught_up(bootstrap, group)
        b = Running(worker("b"))  # joins: the partitions are split between A and B
        deadline = time.monotonic() + 60
        while not (a.worker.assigned and b.worker.assigned) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert a.worker.assigned and b.worker.assigned, "B never got partitions"
        assert not a.worker.assigned & b.worker.assigned
        produce(*PHASES[1:3])
        wait_caught_up(bootstrap, group)
        b.close()  # leaves: A takes everything back
        produce(*PHASES[2:4])
        wait_caught_up(bootstrap, group)
        time.sleep(1)
    finally:
        a.close()
        if b is not None:
            b.close()

    both = (a.worker.stats, b.worker.stats)
    assert a.worker.stats.rebalances >= 2 and b.worker.stats.rebalances >= 1, both
    assert a.worker.stats.rebuilt > 0 or b.worker.stats.rebuilt > 0, both
    # every detection of this run on the topic, as the policy engine would read them
    cons = BatchConsumer(bootstrap, f"reader-{run}", [DETECTIONS.name])
    got, quiet = [], 0
    while quiet < 3:
        item = cons.poll(1.0)
        if item is None:
            quiet += 1
            continue
        quiet = 0
        got += [d for d in item[1].records
                if run in d.node_id or d.labels.get("node_id", "").startswith(f"so{run}")
                or (d.WhichOneof("subject") == "flow"
                    and d.flow.src_addr[:3] == bytes([10, 99, int(run[:2], 16)]))]
    cons.close()
    ids = collections.Counter(d.id for d in got)
    assert [i for i, n in ids.items() if n > 1] == [], "emitted twice"
    assert set(ids) == set(want), (
        f"lost: {len(set(want) - set(ids))}, unexpected: {len(set(ids) - set(want))}")
    kinds = collections.Counter(d.kind for d in got)
    assert kinds == {K.DETECTION_KIND_NODE_OVERLOAD: 9, K.DETECTION_KIND_L4S_UNRESPONSIVE_ECN: 6}
