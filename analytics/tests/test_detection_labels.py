"""Flow detections say where the flow was observed: `node_id` (the probe's node, from the
record header's source id `<node>/flow-probe`) and `interface` (the probe's interface), so a
per-edge policy can match `labels: {node_id: edge1}` and fill its target from them."""

from __future__ import annotations

from cgloop.analytics.detectors import L4sAbuseDetector, SloDetector
from cgloop.analytics.engine import AnalyticsEngine
from cgloop.analytics.records import node_of, observation_labels, sweeps
from cgloop.analytics.synthetic import Degradation, gaming_records
from cgloop.v1.common_pb2 import FiveTuple, RecordHeader
from cgloop.v1.detection_pb2 import DetectionKind as K
from cgloop.v1.flow_pb2 import FlowRecord

NS = 1_000_000_000
T0 = 1_000 * NS


def test_the_node_is_the_source_ids_first_part() -> None:
    assert node_of("edge1/flow-probe") == "edge1"
    assert node_of("edge2/node-agent") == "edge2"
    assert node_of("flow-probe") == "", "no node part: no label rather than a wrong one"
    r = FlowRecord(header=RecordHeader(source_id="edge1/flow-probe"), interface_name="cpe1")
    assert observation_labels(r) == {"node_id": "edge1", "interface": "cpe1"}
    assert observation_labels(FlowRecord()) == {}, "empty values are left out"


def _observed(records: list[FlowRecord], node: str, interface: str) -> list[FlowRecord]:
    for r in records:
        r.header.source_id = f"{node}/flow-probe"
        r.interface_name = interface
    return records


def test_classified_and_slo_detections_carry_the_observing_node(small_model) -> None:
    model, card = small_model
    eng = AnalyticsEngine(model, card.version)
    recs = _observed(gaming_records("gfn", 25, seed=11,
                                    degradations=(Degradation(12, 20, loss=0.2),)),
                     "edge2", "cpe2")
    out = [d for b in sweeps(recs) for d in eng.on_flows(b)]
    kinds = {d.kind: d for d in out}
    for kind in (K.DETECTION_KIND_GAMING_FLOW_CLASSIFIED, K.DETECTION_KIND_SLO_LOSS):
        d = kinds[kind]
        assert (d.labels["node_id"], d.labels["interface"]) == ("edge2", "cpe2"), kind
    assert kinds[K.DETECTION_KIND_SLO_LOSS].labels["platform"] == "gfn"


def test_latency_from_probes_is_labelled_with_where_the_flow_was_seen() -> None:
    det = SloDetector()
    ft = FiveTuple(src_addr=b"\x0a\x00\x00\x01", dst_addr=b"\x0a\x00\x00\x02", src_port=1,
                   dst_port=2, ip_protocol=17)
    det.watch(ft, "gfn", t_ns=T0, where={"node_id": "edge1", "interface": "cpe1"})
    out = []
    for i in range(40):  # 10 ms of latency, then 300 ms held for 2 s
        out += det.on_latency(ft, T0 + i * NS // 10, (10 if i < 10 else 300) * 1_000_000)
    (d,) = out
    assert d.kind == K.DETECTION_KIND_SLO_LATENCY
    assert dict(d.labels) == {"node_id": "edge1", "interface": "cpe1", "platform": "gfn",
                              "metric": "latency"}


def test_l4s_abuse_is_labelled_with_the_observing_node() -> None:
    det = L4sAbuseDetector()
    ft = FiveTuple(src_addr=b"\x0a\x00\x00\x01", dst_addr=b"\x0a\x00\x00\x02", src_port=5000,
                   dst_port=443, ip_protocol=17)
    out = []
    for i in range(13):
        start = T0 + i * NS // 2
        out += det.on_flow(FlowRecord(
            header=RecordHeader(source_id="edge1/flow-probe"), interface_name="cpe1",
            five_tuple=ft, interval_start_ns=start, interval_end_ns=start + NS // 4,
            packets=100, bytes=100_000, ecn_ect1_packets=70, ecn_ce_packets=30,
        ))
    (d,) = out
    assert d.kind == K.DETECTION_KIND_L4S_UNRESPONSIVE_ECN
    assert dict(d.labels) == {"node_id": "edge1", "interface": "cpe1"}
