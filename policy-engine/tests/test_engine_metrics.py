"""The engine's decision and apply latency histograms, timed from the records themselves: a
detection's timestamp to the action decided on it, the action's to its first applied result
(later results of the same action repeat applied_ns and are not counted again)."""

from __future__ import annotations

from cgloop.bus.topics import ACTIONS
from cgloop.policy.service import EngineMetrics
from cgloop.v1 import action_pb2 as apb
from cgloop.v1 import detection_pb2 as dpb

S = 1_000_000_000


def _sample(m: EngineMetrics, name: str, suffix: str) -> float:
    value = m.registry.get_sample_value(f"{name}_{suffix}")
    assert value is not None, name
    return value


def test_decision_and_apply_latency() -> None:
    m = EngineMetrics()
    det = dpb.Detection(id="d1")
    det.header.timestamp_ns = 100 * S
    m.detections(dpb.DetectionBatch(records=[det]))
    action = apb.Action(id="a1", reason_detection_ids=["d1", "unknown"])
    action.header.timestamp_ns = 100 * S + S // 50  # 20 ms later
    applied = apb.ActionResult(action_id="a1", applied_ns=100 * S + S // 20)  # 30 ms after
    verified = apb.ActionResult(action_id="a1", applied_ns=applied.applied_ns, verified_ns=1)
    refused = apb.ActionResult(action_id="other", applied_ns=5)  # no decision seen: not timed
    m.published([apb.ActionEvent(action=action), apb.ActionEvent(result=applied)])
    m.published([apb.ActionEvent(result=verified), apb.ActionEvent(result=refused)])

    decision = "cgloop_policy_decision_latency_seconds"
    apply = "cgloop_policy_apply_latency_seconds"
    assert _sample(m, decision, "count") == 1
    assert abs(_sample(m, decision, "sum") - 0.020) < 1e-9
    assert _sample(m, apply, "count") == 1
    assert abs(_sample(m, apply, "sum") - 0.030) < 1e-9
    assert (
        m.registry.get_sample_value("cgloop_records_out_total", {"topic": ACTIONS.name}) == 4
    )
