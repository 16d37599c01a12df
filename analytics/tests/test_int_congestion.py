"""Switch-queue congestion from INT fires in the report that crossed the threshold (issue 20:
within 100 ms of the crossing, event time). The INT collector emits an IntQueueRecord with
`congested` set in the report whose occupancy reached its congestion_on cells (or whose Q flag
was set), and one with it cleared when the queue is back below congestion_off; the detector
fires on the first without any window. Synthetic record streams, as the collector writes them,
checked in event time."""

from __future__ import annotations

import random

import pytest
from cgloop.analytics.detectors import QueueOverloadDetector, Suppressor
from cgloop.analytics.engine import AnalyticsEngine, EngineConfig
from cgloop.v1.common_pb2 import FiveTuple, RecordHeader
from cgloop.v1.detection_pb2 import DetectionKind as K
from cgloop.v1.detection_pb2 import QueueRef, Severity
from cgloop.v1.int_pb2 import IntFlowRecord, IntHop, IntQueueRecord, IntRecord

NS = 1_000_000_000
MS = 1_000_000
T0 = 1_000 * NS
TARGET_NS = 100 * MS  # issue 20's target: detection within 100 ms of the crossing


class Stream:
    """An INT collector's output: sequence-numbered records of one collector."""

    def __init__(self) -> None:
        self.seq = 0

    def header(self, t_ns: int) -> RecordHeader:
        self.seq += 1
        return RecordHeader(schema_version=1, source_id="core/int-collector", sequence=self.seq,
                            timestamp_ns=t_ns)

    def queue(self, t_ns: int, congested: bool, port: int = 3, queue_id: int = 0,
              cells: int = 0, latency_ns: int = 0) -> IntRecord:
        return IntRecord(queue=IntQueueRecord(
            header=self.header(t_ns), switch_id=1, egress_port=port, queue_id=queue_id,
            queue_occupancy_cells=cells, queue_latency_ns=latency_ns, congested=congested,
            egress_tx_utilization=0.4,
        ))

    def flow(self, t_ns: int, port: int, latency_ns: int, cells: int) -> IntRecord:
        ft = FiveTuple(src_addr=b"\x0a\x00\x00\x01", dst_addr=b"\x0a\x01\x00\x02",
                       src_port=port, dst_port=9000, ip_protocol=17)
        hop = IntHop(switch_id=1, egress_port=3, hop_latency_ns=latency_ns,
                     queue_occupancy_cells=cells)
        return IntRecord(flow=IntFlowRecord(header=self.header(t_ns), five_tuple=ft,
                                            path_switch_ids=[1], hops=[hop],
                                            end_to_end_latency_ns=latency_ns))


def engine() -> AnalyticsEngine:
    return AnalyticsEngine(None, config=EngineConfig(
        int_switch_nodes={1: "core"}, int_switch_ports={(1, 3): "edge1", (1, 4): "edge2"},
    ))


def scenario(seed: int) -> tuple[list[list[IntRecord]], int, int]:
    """A queue that fills: hop reports every 1-20 ms whose occupancy grows until it crosses the
    collector's threshold at a random time, batched as the collector's exporter sends them
    (a batch per 5 ms). The crossing record is the collector's, in the report that crossed.
    (batches, crossing time, its clearing time)."""
    rnd = random.Random(seed)
    s = Stream()
    crossing = T0 + rnd.randint(500, 3000) * MS
    clear = crossing + rnd.randint(200, 2000) * MS
    t, recs = T0, []
    while t < clear + NS:
        t += rnd.randint(1, 20) * MS
        filling = crossing - 300 * MS <= t < clear
        cells = rnd.randint(0, 20) + (int(2000 * min(1, (t - crossing + 300 * MS) / (300 * MS)))
                                      if filling else 0)
        recs.append((t, s.flow(t, 4000 + rnd.randint(0, 50), 20_000 + cells * 100, cells)))
        if recs and recs[-1][0] >= crossing and not any(
                r.WhichOneof("record") == "queue" for _, r in recs):
            recs.append((t, s.queue(t, True, cells=cells, latency_ns=20_000 + cells * 100)))
            crossing = t  # the collector's crossing report
        if t >= clear and sum(r.WhichOneof("record") == "queue" for _, r in recs) == 1:
            recs.append((t, s.queue(t, False, cells=cells)))
            clear = t
    batches: dict[int, list[IntRecord]] = {}
    for t, r in recs:
        batches.setdefault((t - T0) // (5 * MS), []).append(r)
    return [batches[k] for k in sorted(batches)], crossing, clear


@pytest.mark.parametrize("seed", range(20))
def test_congestion_fires_within_100_ms_of_the_crossing(seed: int) -> None:
    batches, crossing, _ = scenario(seed)
    eng = engine()
    out = [d for b in batches for d in eng.on_int(b)]
    (d,) = [d for d in out if d.kind == K.DETECTION_KIND_QUEUE_CONGESTION]
    assert 0 <= d.window_end_ns - crossing <= TARGET_NS
    assert d.window_end_ns == crossing, "no window: the crossing report itself"
    assert d.queue == QueueRef(node_id="1", interface_name="3", queue_id=0)
    assert dict(d.labels) == {"switch_id": "1", "egress_port": "3", "queue_id": "0",
                              "node_id": "core", "interface": "edge1", "trigger": "congested",
                              "episode": str(crossing)}
    assert d.severity in (Severity.SEVERITY_MAJOR, Severity.SEVERITY_CRITICAL)
    assert not [x for x in out if x.kind == K.DETECTION_KIND_TELEMETRY_GAP]


def test_the_windowed_load_alone_would_take_a_second() -> None:
    """Why the crossing record fires at once: without the flag the queue's rho (here 0.95,
    its delay over the 5 ms budget) must hold 0.9 for 1 s, ten times the target."""
    det = QueueOverloadDetector()
    s = Stream()
    hits = [t for t in range(0, 1500, 10)
            for _ in det.on_int_queue(s.queue(T0 + t * MS, False, latency_ns=4_750_000).queue)]
    assert hits == [1000]


def test_an_episode_fires_once_and_a_new_crossing_again() -> None:
    det = QueueOverloadDetector(switch_nodes={1: "core"})
    s = Stream()
    first = det.on_int_queue(s.queue(T0, True, cells=3000).queue)
    assert len(first) == 1
    # repeated flags (a second worker of the collector, a re-sent batch): the same episode
    assert det.on_int_queue(s.queue(T0 + 10 * MS, True, cells=3500).queue) == []
    assert det.on_int_queue(s.queue(T0 + 800 * MS, False, cells=10).queue) == []
    (again,) = det.on_int_queue(s.queue(T0 + 900 * MS, True, cells=2600).queue)
    assert again.id != first[0].id and again.window_end_ns == T0 + 900 * MS
    # the worker's suppressor (60 s re-alert) lets the new episode through, not the old again
    sup = Suppressor()
    assert sup.allow(first[0]) and sup.allow(again)
    assert not sup.allow(first[0]) and not sup.allow(again)


def test_queues_are_told_apart_and_unknown_names_are_left_out() -> None:
    eng = engine()
    s = Stream()
    out = eng.on_int([s.queue(T0, True, port=4, queue_id=1), s.queue(T0, True, port=9)])
    assert [(d.labels["egress_port"], d.labels.get("interface")) for d in out] == [
        ("4", "edge2"), ("9", None)]
    assert out[0].labels["queue_id"] == "1"


def test_int_latency_feeds_the_slo_only_when_int_spans_the_path() -> None:
    """Lab v2's one INT switch reports its own hop: not the flow's latency (the probes')."""
    ft_rec = Stream().flow(T0, 4000, 50 * MS, 10)
    for spans, watched in ((False, 0), (True, 1)):
        eng = AnalyticsEngine(None, config=EngineConfig(int_flow_latency=spans))
        eng.slo.watch(ft_rec.flow.five_tuple, "gfn", t_ns=T0)
        eng.on_int([ft_rec])
        assert len(eng.slo.paths) == watched
