"""The engine: classification → SLO watch, bounded state, telemetry gaps, odd records."""

from __future__ import annotations

from cgloop.analytics.engine import AnalyticsEngine, EngineConfig
from cgloop.analytics.records import NS, records_from_pcap, sweeps
from cgloop.analytics.synthetic import Degradation, gaming_records
from cgloop.v1.common_pb2 import FiveTuple, RecordHeader
from cgloop.v1.detection_pb2 import DetectionKind as K
from cgloop.v1.flow_pb2 import FlowRecord
from cgloop.v1.probe_pb2 import ProbeRecord


def test_gaming_flow_classified_fast_then_slo_watched(small_model):
    model, card = small_model
    eng = AnalyticsEngine(model, card.version)
    recs = gaming_records("gfn", 25, seed=11, degradations=(Degradation(12, 20, loss=0.2),))
    t0 = recs[0].interval_start_ns
    # one call a sweep, as the worker gets the probe's batches
    out = [(b[0].interval_end_ns, d) for b in sweeps(recs) for d in eng.on_flows(b)]
    cls = [(t, d) for t, d in out if d.kind == K.DETECTION_KIND_GAMING_FLOW_CLASSIFIED]
    assert len(cls) == 1
    t, d = cls[0]
    assert (t - t0) / NS <= 1.5  # decided within ~1 s of flow start
    assert d.labels["class"] == "cloud_gaming" and d.labels["platform"] == "gfn"
    assert d.model_version == card.version
    loss = [d for _, d in out if d.kind == K.DETECTION_KIND_SLO_LOSS]
    assert len(loss) == 1 and 12 <= (loss[0].window_start_ns - t0) / NS <= 14


def _rec(i: int, t_ns: int, seq: int) -> FlowRecord:
    return FlowRecord(
        header=RecordHeader(schema_version=1, source_id="probe-x", sequence=seq),
        five_tuple=FiveTuple(src_addr=bytes([10, 0, i >> 8 & 255, i & 255]),
                             dst_addr=b"\x0a\x09\x09\x09", src_port=1000 + i, dst_port=443,
                             ip_protocol=6),
        interval_start_ns=t_ns, interval_end_ns=t_ns + NS // 10, packets=3, bytes=300,
    )


def test_state_is_bounded_and_idle_flows_are_evicted(small_model):
    model, _ = small_model
    eng = AnalyticsEngine(model, config=EngineConfig(max_flows=50, idle_s=5))
    for i in range(500):
        eng.on_flows([_rec(i, 100 * NS + i * NS // 100, i + 1)])
    assert len(eng.convs) == 50
    assert eng.state_size()["records"] <= 50 * 60
    eng.on_flows([_rec(9999, 200 * NS, 501)])  # event time moves 100 s on
    eng.evict()
    assert len(eng.convs) == 1
    assert len(eng.l4s.flows) == 1


def test_sequence_gap_is_a_telemetry_gap_detection():
    eng = AnalyticsEngine(None)
    assert eng.on_flows([_rec(1, NS, 1), _rec(1, 2 * NS, 2)]) == []
    # out of order across partitions: 4 and 5 arrive late, 3 never (6 is late too)
    assert eng.on_flows([_rec(1, 3 * NS, 7), _rec(1, 3 * NS, 5), _rec(1, 3 * NS, 4)]) == []
    out = eng.on_flows([_rec(1, 9 * NS, 8)])  # 6 s later: 3 and 6 are lost
    assert [d.kind for d in out] == [K.DETECTION_KIND_TELEMETRY_GAP] * 2
    assert [d.evidence[0].value for d in out] == [1, 1] and out[0].node_id == "probe-x"
    assert eng.on_flows([_rec(1, 10 * NS, 9)]) == []


def test_pcap_records_out_of_order_are_not_gaps():

    from .conftest import need_data

    eng = AnalyticsEngine(None)
    recs = records_from_pcap(need_data("l4s-tests", "skype_bi_dualpi2_l.pcap.gz"))
    out = [d for r in recs for d in eng.on_flows([r])]
    assert [d.kind for d in out] == [K.DETECTION_KIND_L4S_UNRESPONSIVE_ECN]


def test_odd_records_do_not_crash(small_model):
    model, _ = small_model
    eng = AnalyticsEngine(model)
    odd = [FlowRecord(), FlowRecord(interval_start_ns=5, interval_end_ns=5),
           FlowRecord(five_tuple=FiveTuple(src_addr=b"\x01"), packets=0, bytes=10**12,
                      interval_end_ns=NS)]
    for _ in range(20):
        eng.on_flows(odd)


def _probe(target: bytes, seq: int, sent_ns: int, rtt_ns: int, overdue: bool) -> ProbeRecord:
    return ProbeRecord(
        header=RecordHeader(schema_version=1, source_id="agent/probe/p", sequence=seq,
                            timestamp_ns=sent_ns),
        probe_id="p", target_addr=target, probe_sequence=seq, sent_ns=sent_ns,
        received_ns=0 if overdue else sent_ns + rtt_ns, rtt_ns=rtt_ns, overdue=overdue,
    )


def _classified_session(small_model) -> tuple[AnalyticsEngine, list[FlowRecord]]:
    """An engine with the loop's latency settings that has classified a 3 s GFN session."""
    model, card = small_model
    eng = AnalyticsEngine(model, card.version, EngineConfig(
        slo_profile="lab", slo_min_duration_s=1.0, latency_min_duration_s=0.05))
    recs = gaming_records("gfn", 3, seed=5)
    for batch in sweeps(recs):
        eng.on_flows(batch)
    return eng, recs


def _slo_latency_at(small_model, notices: bool) -> int | None:
    """When (in the probes' arrival order) a 60 ms queue fires the SLO latency detection of a
    classified gaming flow, probed every 10 ms; None if it never does."""
    eng, recs = _classified_session(small_model)
    target = recs[0].five_tuple.dst_addr
    assert eng.servers.get(target), "the gaming flow is classified and its client known"
    t0 = recs[-1].interval_end_ns
    arrivals = []  # (arrival ns, record) as the agent sends them
    for i in range(40):
        sent = t0 + i * 10_000_000
        rtt = 1_000_000 if i < 10 else 60_000_000  # the queue builds up at 100 ms
        if notices and rtt > 20_000_000:
            arrivals.append((sent + 20_000_000, _probe(target, 2 * i, sent, 20_000_000, True)))
        arrivals.append((sent + rtt, _probe(target, 2 * i + 1, sent, rtt, False)))
    arrivals.sort(key=lambda a: (a[0], a[1].header.sequence))
    for at, rec in arrivals:
        if any(d.kind == K.DETECTION_KIND_SLO_LATENCY for d in eng.on_probes([rec])):
            return at - (t0 + 100_000_000)
    return None


def test_overdue_notices_detect_a_latency_breach_before_the_replies_do(small_model):
    early = _slo_latency_at(small_model, notices=True)
    late = _slo_latency_at(small_model, notices=False)
    assert early is not None and late is not None
    # min duration 50 ms + the 20 ms notice, against 50 ms + the 60 ms RTT of the last probe
    assert early <= 75_000_000 < 105_000_000 <= late


def _reprioritised(
    eng: AnalyticsEngine, flow: FiveTuple, action_id: str, applied_ns: int
) -> None:
    """The loop moved `flow` (one direction) to DSCP 46: its action and result as published."""
    from cgloop.v1 import action_pb2 as apb

    action = apb.Action(
        id=action_id,
        operation=apb.ACTION_OPERATION_REPRIORITISE_FLOW,
        reprioritise_flow=apb.ReprioritiseFlowAction(class_id=0x10020, rewrite_dscp=46),
        target=apb.ActionTarget(flow=flow),
    )
    result = apb.ActionResult(
        action_id=action_id, state=apb.ACTION_STATE_APPLIED, applied_ns=applied_ns
    )
    eng.on_actions([apb.ActionEvent(action=action), apb.ActionEvent(result=result)])


def _detects_on_best_effort_probes(small_model, moved: str, stale: bool = False) -> bool:
    """A classified gaming flow, one direction of which the loop moved to EF (or, `stale`, an
    action on the same five-tuple from before the conversation began: a replay or an earlier
    run); do best-effort (DSCP 0) probes at 60 ms still count as its downstream latency?"""
    from cgloop.analytics.features import split_directions

    eng, recs = _classified_session(small_model)
    down, up = split_directions(recs)
    assert down and up, "the synthetic session has both directions"
    t0 = recs[-1].interval_end_ns
    applied = recs[0].interval_start_ns - 60 * NS if stale else t0
    _reprioritised(eng, (down if moved == "down" else up)[0].five_tuple, f"a-{moved}", applied)
    target = down[0].five_tuple.dst_addr
    for i in range(30):
        sent = t0 + i * 10_000_000
        out = eng.on_probes([_probe(target, i, sent, 60_000_000, False)])
        if any(d.kind == K.DETECTION_KIND_SLO_LATENCY for d in out):
            return True
    return False


def test_probes_follow_the_direction_the_loop_moved_not_its_reverse(small_model):
    # The client's input stream (upstream) was moved to EF: the downstream video is still in
    # best effort, so best-effort probes are its latency and a 60 ms queue is detected.
    assert _detects_on_best_effort_probes(small_model, moved="up")
    # The downstream itself was moved: best-effort probes no longer measure its queue.
    assert not _detects_on_best_effort_probes(small_model, moved="down")
    # ... but not by an action older than the conversation: the agent that applied it may be
    # gone (each lab run starts a fresh one) and the five-tuple reused.
    assert _detects_on_best_effort_probes(small_model, moved="down", stale=True)
