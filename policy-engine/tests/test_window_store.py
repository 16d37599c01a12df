"""Verification reads the probes of the queue an action moved the flow to (WindowStore.read).

A flow moved and re-marked EF is judged by the DSCP 46 probes after the action, against the
other queues' probes before it. Disabling that split passed every other test (issue 18: the
test probe builders never set a DSCP); here the two queues differ by an order of magnitude,
so a store that mixes them reads the wrong value in both phases.
"""

from __future__ import annotations

import pytest
from cgloop.policy.telemetry import WindowStore, probe_dscp
from cgloop.v1 import action_pb2 as apb
from cgloop.v1.common_pb2 import FiveTuple
from cgloop.v1.probe_pb2 import ProbeRecord, ProbeRecordBatch

MS = 1_000_000
NS = 1_000_000_000
T0 = 1_000 * NS
CLIENT, SERVER = bytes([10, 77, 11, 2]), bytes([10, 77, 1, 2])
FLOW = FiveTuple(src_addr=SERVER, dst_addr=CLIENT, src_port=49004, dst_port=40000, ip_protocol=17)
EF = 46


def probes(dscp: int, rtt_ms: float, n: int = 20, target: bytes = CLIENT, **kw) -> ProbeRecordBatch:
    """n probes toward `target` with this DSCP, one every 50 ms from T0."""
    return ProbeRecordBatch(
        records=[
            ProbeRecord(
                probe_id=f"p-{dscp}",
                target_addr=target,
                dscp=dscp,
                probe_sequence=i,
                sent_ns=T0 + i * 50 * MS,
                rtt_ns=int(rtt_ms * MS),
                **kw,
            )
            for i in range(n)
        ]
    )


def moved(dscp: int | None) -> apb.Action:
    """The action that moved FLOW to another class, re-marked `dscp` (None: not re-marked)."""
    spec = apb.ReprioritiseFlowAction(class_id=0x00010020)
    if dscp is not None:
        spec.rewrite_dscp = dscp
    action = apb.Action(
        id="a1",
        operation=apb.ACTION_OPERATION_REPRIORITISE_FLOW,
        target=apb.ActionTarget(node_id="edge", interface_name="cpe", flow=FLOW),
        reprioritise_flow=spec,
    )
    if dscp is not None:  # the untyped form older actions carry: either must be read
        action.parameters["rewrite_dscp"] = str(dscp)
    return action


def store_with_two_queues() -> WindowStore:
    store = WindowStore()
    store.ingest_probes(probes(0, rtt_ms=30.0))  # best effort: congested
    store.ingest_probes(probes(EF, rtt_ms=2.0))  # the gaming queue: fast
    return store


def read(store: WindowStore, action: apb.Action, phase: str, metric: str = "probe.p99_rtt_ns"):
    return store.read(metric, action, T0, T0 + NS, phase=phase)


def test_after_reads_the_new_dscps_probes_and_before_the_others() -> None:
    store = store_with_two_queues()
    after = read(store, moved(EF), "after")
    before = read(store, moved(EF), "before")
    assert after is not None and before is not None
    assert (after.value, after.samples) == (2.0 * MS, 20)
    assert (before.value, before.samples) == (30.0 * MS, 20)
    assert after.latency is not None and after.latency.max_ns == 2 * MS


def test_the_probes_of_the_flows_other_end_count_too() -> None:
    store = WindowStore()
    store.ingest_probes(probes(EF, rtt_ms=3.0, target=SERVER))
    store.ingest_probes(probes(0, rtt_ms=40.0, target=SERVER))
    store.ingest_probes(probes(EF, rtt_ms=90.0, target=bytes([10, 9, 9, 9])))  # not this flow
    assert read(store, moved(EF), "after").value == 3.0 * MS
    assert read(store, moved(EF), "before").value == 40.0 * MS


def test_without_a_probed_dscp_every_probe_of_the_flow_counts() -> None:
    store = store_with_two_queues()
    for action in (moved(None), moved(10)):  # not re-marked / re-marked to an unprobed DSCP
        for phase in ("after", "before"):
            reading = read(store, action, phase, "probe.p50_rtt_ns")
            assert reading.samples == 40, (action.reprioritise_flow, phase)
    rate = apb.Action(
        operation=apb.ACTION_OPERATION_SET_CLASS_RATE,
        target=apb.ActionTarget(node_id="edge", interface_name="cpe", flow=FLOW),
    )
    assert read(store, rate, "after").samples == 40


def test_probe_dscp_of_an_action() -> None:
    assert probe_dscp(moved(EF)) == EF
    assert probe_dscp(moved(0)) == 0
    assert probe_dscp(moved(None)) is None
    assert probe_dscp(apb.Action(operation=apb.ACTION_OPERATION_SET_CLASS_RATE)) is None


def test_window_bounds_loss_and_overdue_notices() -> None:
    store = WindowStore()
    store.ingest_probes(probes(EF, rtt_ms=2.0, n=10))
    store.ingest_probes(
        ProbeRecordBatch(
            records=[
                ProbeRecord(target_addr=CLIENT, dscp=EF, sent_ns=T0 + 5 * MS, lost=True),
                ProbeRecord(
                    target_addr=CLIENT, dscp=EF, sent_ns=T0 + 6 * MS, overdue=True, rtt_ns=25 * MS
                ),
            ]
        )
    )
    loss = read(store, moved(EF), "after", "probe.loss_ratio")
    assert loss.samples == 11 and loss.value == pytest.approx(1 / 11)
    # [start, end): the probe sent at T0 + 450 ms is outside [T0, T0 + 450 ms)
    inside = store.read("probe.max_rtt_ns", moved(EF), T0, T0 + 450 * MS)
    assert inside.samples == 9 and inside.value == 2.0 * MS
    assert store.read("probe.p99_rtt_ns", moved(EF), T0 + NS, T0 + 2 * NS) is None
    lost = WindowStore()
    lost.ingest_probes(probes(EF, rtt_ms=1.0, n=3, lost=True))
    assert read(lost, moved(EF), "after").value == float("inf")
    with pytest.raises(ValueError, match="unknown metric"):
        read(store, moved(EF), "after", "probe.p42_rtt_ns")
