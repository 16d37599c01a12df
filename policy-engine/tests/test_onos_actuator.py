"""ONOS flow rules from actions, built and checked by the ONOS driver of the actuators component.

No ONOS runs here: the driver validates each body against ONOS's published REST definitions,
and an httpx transport on our side answers like ONOS's FlowsWebResource (201 + Location).
"""

from __future__ import annotations

import json

import httpx
import pytest
from cgloop.policy.actuators import ActuatorError, OnosActuator
from cgloop.policy.testing import flow
from cgloop.v1 import action_pb2 as apb

onos = pytest.importorskip("cgloop.actuators.onos")


def action(**params: object) -> apb.Action:
    a = apb.Action(id="a1", operation=apb.ACTION_OPERATION_ONOS_FLOW_RULE)
    a.target.device_id = "of:0000000000000001"
    a.target.flow.CopyFrom(flow())
    a.onos_flow_rule.CopyFrom(apb.OnosFlowRuleAction(priority=40000, **params))
    return a


def old_action(**params: str) -> apb.Action:
    """As engines wrote it before typed actions: a map of text parameters."""
    a = action()
    a.ClearField("onos_flow_rule")
    a.parameters.update({"priority": "40000", **params})
    return a


def test_flow_rule_round_trip_through_the_driver() -> None:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        if request.method == "POST":
            return httpx.Response(
                201, headers={"Location": "http://onos/onos/v1/flows/of:0000000000000001/77"}
            )
        return httpx.Response(204)

    client = onos.OnosClient(transport=httpx.MockTransport(handler))
    act = OnosActuator(client)
    applied = act.apply(action(queue_id=1, output_port="2"))
    assert applied.previous.onos_flow_rule == apb.InstalledFlowRule(
        device_id="of:0000000000000001", flow_id="77"
    )
    body = json.loads(seen[0].content)
    types = [c["type"] for c in body["selector"]["criteria"]]
    assert types == ["ETH_TYPE", "IPV4_SRC", "IPV4_DST", "IP_PROTO", "UDP_SRC", "UDP_DST"]
    assert body["treatment"]["instructions"][0]["type"] == "QUEUE"
    act.rollback(action(), "rb", applied.previous)
    assert seen[-1].method == "DELETE" and seen[-1].url.path.endswith("/77")
    # An old action (parameter map) still makes the same rule.
    act.apply(old_action(queue_id="1", output_port="2"))
    assert json.loads(seen[-1].content) == body


def test_bad_requests_fail_with_reasons() -> None:
    act = OnosActuator(
        onos.OnosClient(
            transport=httpx.MockTransport(lambda r: httpx.Response(500)), sleep=lambda s: None
        )
    )
    with pytest.raises(ActuatorError, match=r"needs target\.device_id"):
        a = action()
        a.target.device_id = ""
        act.apply(a)
    with pytest.raises(ActuatorError, match="no queue-configuration call"):
        act.apply(apb.Action(operation=apb.ACTION_OPERATION_ONOS_QUEUE))
    with pytest.raises(ActuatorError, match="ONOS install_flow"):
        act.apply(action(output_port="2"))


def test_meters_and_intents_round_trip_through_the_driver() -> None:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        path = request.url.path
        if request.method == "GET":
            key = "meters" if "/meters" in path else "intents"
            return httpx.Response(200, json={key: []})
        if request.method == "POST" and "/meters/" in path:
            return httpx.Response(201, headers={"Location": f"http://onos{path}/5"})
        if request.method == "POST":
            return httpx.Response(
                201, headers={"Location": "http://onos/onos/v1/intents/org.cgloop/0x12"}
            )
        return httpx.Response(204)

    act = OnosActuator(onos.OnosClient(transport=httpx.MockTransport(handler)))
    meter = action()
    meter.operation = apb.ACTION_OPERATION_ONOS_METER
    meter.onos_meter.CopyFrom(
        apb.OnosMeterAction(
            unit=apb.METER_UNIT_KB_PER_SEC,
            bands=[apb.MeterBand(type=apb.METER_BAND_TYPE_DROP, rate=10_000)],
        )
    )
    applied = act.apply(meter)
    assert applied.previous.onos_meter == apb.InstalledMeter(
        device_id="of:0000000000000001", meter_id="5"
    )
    body = json.loads(seen[-1].content)
    assert body["unit"] == "KB_PER_SEC" and body["bands"][0]["type"] == "DROP"
    act.rollback(meter, "rb", applied.previous)
    assert seen[-1].method == "DELETE" and seen[-1].url.path.endswith(
        "/meters/of:0000000000000001/5"
    )

    intent = action()
    intent.operation = apb.ACTION_OPERATION_ONOS_INTENT
    intent.onos_intent.CopyFrom(
        apb.OnosIntentAction(
            app_id="org.cgloop",
            priority=200,
            ingress=apb.OnosConnectPoint(device_id="of:0000000000000001", port=1),
            egress=apb.OnosConnectPoint(device_id="of:0000000000000002", port=2),
        )
    )
    applied = act.apply(intent)
    assert applied.previous.onos_intent == apb.InstalledIntent(app_id="org.cgloop", key="0x12")
    body = json.loads(seen[-1].content)
    assert body["ingressPoint"] == {"device": "of:0000000000000001", "port": "1"}
    assert [c["type"] for c in body["selector"]["criteria"]][:2] == ["ETH_TYPE", "IPV4_SRC"]
    act.rollback(intent, "rb", applied.previous)
    assert seen[-1].method == "DELETE" and seen[-1].url.path.endswith("/org.cgloop/0x12")
