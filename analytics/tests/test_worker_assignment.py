"""Which sources' sequence gaps a worker judges, from the partitions the group gave it: a
worker holding part of a topic sees part of a source's numbers and would call the rest lost."""

from __future__ import annotations

from cgloop.analytics.engine import AnalyticsEngine
from cgloop.analytics.worker import Worker
from cgloop.bus.topics import FLOWS, INT, NODES, PROBES
from cgloop.v1.common_pb2 import FiveTuple, RecordHeader
from cgloop.v1.detection_pb2 import DetectionKind as K
from cgloop.v1.flow_pb2 import FlowRecord

NS = 1_000_000_000


def checks(assigned: set[tuple[str, int]]) -> set[str]:
    w = Worker.__new__(Worker)  # the assignment logic alone, no Kafka
    w.engine, w.assigned = AnalyticsEngine(None), assigned
    w._sequence_checks()
    return w.engine.sequence_checks


def whole(t) -> set[tuple[str, int]]:
    return {(t.name, p) for p in range(t.partitions)}


def test_a_sole_worker_judges_every_input() -> None:
    everything = whole(FLOWS) | whole(INT) | whole(NODES) | whole(PROBES)
    assert checks(everything) == {"flows", "int", "probes", "nodes"}


def test_a_worker_with_part_of_the_topics_judges_what_it_sees_whole() -> None:
    # partitions 0-2 of flows and INT, and node partition 1: one node, one key, one partition
    part = {(FLOWS.name, p) for p in range(3)} | {(INT.name, p) for p in range(3)}
    assert checks(part | {(NODES.name, 1)}) == {"nodes", "probes"}, "flows 0: the probes' judge"
    other = {(FLOWS.name, p) for p in range(3, 6)} | whole(INT)
    assert checks(other) == {"nodes", "int"}


def test_an_engine_that_does_not_judge_flows_reports_no_gap_in_them() -> None:
    def rec(seq: int) -> FlowRecord:
        t = 1000 * NS + seq * NS
        return FlowRecord(header=RecordHeader(source_id="edge1/flow-probe", sequence=seq),
                          five_tuple=FiveTuple(src_addr=b"\x0a\x00\x00\x01",
                                               dst_addr=b"\x0a\x00\x00\x02", ip_protocol=17),
                          interval_start_ns=t, interval_end_ns=t + NS // 10)

    seen = [rec(s) for s in (1, 2, 9, 20)]  # 3-8 and 10-19 went to the other worker
    judging = AnalyticsEngine(None)
    assert [d.kind for d in judging.on_flows(seen)] == [K.DETECTION_KIND_TELEMETRY_GAP]
    part = AnalyticsEngine(None)
    part.sequence_checks = {"nodes"}
    assert part.on_flows(seen) == []
