"""Every body the ONOS driver builds validates against ONOS's published definitions, and the
rules of ONOS's JSON codecs (opennetworkinglab/onos core/common/src/main/java/org/onosproject/
codec/impl/) are enforced before anything is sent."""

from __future__ import annotations

import hashlib
import json
from importlib import resources

import jsonschema
import pytest
from cgloop.actuators.onos import (
    Band,
    ConnectPoint,
    EthTypeCriterion,
    FlowRule,
    GroupInstruction,
    InPortCriterion,
    IpDscpCriterion,
    IpEcnCriterion,
    IpProtoCriterion,
    Ipv4DstCriterion,
    Ipv4SrcCriterion,
    MeterInstruction,
    MeterRequest,
    OnosValidationError,
    OutputInstruction,
    PointToPointIntent,
    QueueInstruction,
    Selector,
    Treatment,
    UdpDstCriterion,
    validation,
)
from pydantic import ValidationError

DEV = "of:0000000000000001"
SCHEMAS = resources.files("cgloop.actuators.onos").joinpath("schemas")


def gaming_selector() -> Selector:
    return Selector(
        criteria=[
            EthTypeCriterion(eth_type=0x0800),
            IpProtoCriterion(protocol=17),
            Ipv4SrcCriterion(ip="10.0.0.1"),
            Ipv4DstCriterion(ip="10.0.1.0/24"),
            UdpDstCriterion(udp_port=9000),
            IpDscpCriterion(ip_dscp=46),
            IpEcnCriterion(ip_ecn=1),
            InPortCriterion(port=3),
        ]
    )


def flows() -> list[FlowRule]:
    treatments = [
        [OutputInstruction(port=2)],
        [QueueInstruction(queue_id=1, port=2), OutputInstruction(port=2)],
        [QueueInstruction(queue_id=7)],
        [MeterInstruction(meter_id=5), OutputInstruction(port="controller")],
        [GroupInstruction(group_id=0xFFFF_FFFF)],
    ]
    return [
        FlowRule(
            priority=40000 + n,
            device_id=DEV,
            selector=gaming_selector(),
            treatment=Treatment(instructions=t),
            app_id="org.cgloop.actuators",
        )
        for n, t in enumerate(treatments)
    ] + [FlowRule(priority=10, device_id=DEV, is_permanent=False, timeout=30)]


def test_flow_bodies_validate_against_onos_definitions() -> None:
    bodies = [f.to_json() for f in flows()]
    for body in bodies:
        validation.validate("FlowsPost", body)
        # FlowRuleCodec members, as ONOS names them.
        assert {"priority", "timeout", "isPermanent", "deviceId"} <= body.keys()
        assert body["treatment"]["deferred"] == []
    validation.validate("FlowsBatchPost", {"flows": bodies})
    criteria = bodies[0]["selector"]["criteria"]
    assert criteria[0] == {"type": "ETH_TYPE", "ethType": "0x0800"}  # Integer.decode-able
    assert {"type": "IP_DSCP", "ipDscp": 46} in criteria
    assert {"type": "IP_ECN", "ipEcn": 1} in criteria
    assert {"type": "IPV4_SRC", "ip": "10.0.0.1/32"} in criteria  # IpPrefix.valueOf needs /len
    assert bodies[3]["treatment"]["instructions"][1] == {"type": "OUTPUT", "port": "CONTROLLER"}
    assert bodies[2]["treatment"]["instructions"] == [{"type": "QUEUE", "queueId": 7}]


def test_meter_and_intent_bodies_validate() -> None:
    meter = MeterRequest(
        device_id=DEV,
        unit="KB_PER_SEC",
        burst=True,
        bands=[
            Band(type="DROP", rate=10_000, burst_size=1500),
            Band(type="REMARK", rate=5_000, burst_size=1500, prec=1),
        ],
    ).to_json()
    validation.validate("MeterPost", meter)
    assert all("prec" in b for b in meter["bands"])  # the definition requires it on every band
    intent = PointToPointIntent(
        app_id="org.cgloop.actuators",
        priority=200,
        ingress_point=ConnectPoint(device=DEV, port=1),
        egress_point=ConnectPoint(device="of:0000000000000002", port="4"),
        selector=gaming_selector(),
        treatment=Treatment(instructions=[QueueInstruction(queue_id=2)]),
    ).to_json()
    validation.validate_intent(intent)
    assert intent["type"] == "PointToPointIntent"
    assert intent["ingressPoint"] == {"device": DEV, "port": "1"}


def test_the_two_schema_corrections_are_needed_and_only_those() -> None:
    """Defect 2: the raw definition wants `port` on METER/GROUP/QUEUE instructions, which ONOS's
    DecodeInstructionCodecHelper never reads; defect 1: `int64` is not a JSON Schema type."""
    body = FlowRule(
        priority=1, device_id=DEV, treatment=Treatment(instructions=[MeterInstruction(meter_id=1)])
    ).to_json()
    raw = jsonschema.Draft4Validator(validation.raw_schema("FlowsPost"))
    assert any("'port' is a required property" in e.message for e in raw.iter_errors(body))
    with_eth = FlowRule(
        priority=1, device_id=DEV, selector=Selector(criteria=[EthTypeCriterion(eth_type=0x800)])
    ).to_json()
    with pytest.raises(jsonschema.exceptions.UnknownType):
        list(raw.iter_errors(with_eth))
    validation.validate("FlowsPost", body)
    validation.validate("FlowsPost", with_eth)
    # OUTPUT still needs its port: the models require it (the corrected schema no longer does).
    with pytest.raises(ValidationError, match="port"):
        OutputInstruction.model_validate({"type": "OUTPUT"})
    # Everything else in the corrected definition is the raw one.
    corrected, original = validation.schema("FlowsPost"), validation.raw_schema("FlowsPost")
    items = lambda s: s["properties"]["treatment"]["properties"]["instructions"]["items"]  # noqa: E731
    items(original)["required"].remove("port")
    assert corrected == original


def test_validation_names_the_offending_field() -> None:
    body = flows()[0].to_json()
    body["priority"] = "high"
    del body["deviceId"]
    with pytest.raises(OnosValidationError) as err:
        validation.validate("FlowsPost", body)
    assert "'deviceId' is a required property" in str(err.value)
    assert "priority: 'high' is not of type 'integer'" in str(err.value)
    bad_intent = {
        "type": "PointToPointIntent",
        "appId": "a",
        "priority": 1,
        "ingressPoint": {"device": DEV, "port": "1"},
        "egressPoint": {"device": DEV},
        "selector": {"criteria": "none"},
    }
    with pytest.raises(OnosValidationError, match="egressPoint: 'port' is a required"):
        validation.validate_intent(bad_intent)
    bad_intent["egressPoint"] = {"device": DEV, "port": "2"}
    with pytest.raises(OnosValidationError, match=r"selector .*criteria: 'none' is not of type"):
        validation.validate_intent(bad_intent)


@pytest.mark.parametrize(
    ("build", "message"),
    [
        # IpDscpDecoder casts to byte, IPDscpCriterion masks 0x3f: 64 would become 0.
        (lambda: IpDscpCriterion(ip_dscp=64), "less than or equal to 63"),
        (lambda: IpEcnCriterion(ip_ecn=4), "less than or equal to 3"),
        # GROUP: asLong().intValue() would truncate.
        (lambda: GroupInstruction(group_id=2**32), "less than or equal to 4294967295"),
        (lambda: MeterInstruction(meter_id=0), "greater than or equal to 1"),
        (lambda: OutputInstruction(port="eth0"), "neither a number nor"),
        (lambda: InPortCriterion.model_validate({"type": "IN_PORT", "port": "LOCAL"}), "port"),
        # DeviceId.deviceId parses a URI.
        (lambda: FlowRule(priority=1, device_id="switch1"), "is not a URI"),
        # FlowRuleCodec: timeout required for temporary flows (0 would never expire).
        (lambda: FlowRule(priority=1, device_id=DEV, is_permanent=False), "needs timeout > 0"),
        (lambda: FlowRule(priority=1, device_id=DEV, timeout=5), "permanent flow must"),
        (lambda: FlowRule(priority=70000, device_id=DEV), "less than or equal to 65535"),
        # OpenFlow prerequisites, checked by ONOS only at the switch.
        (lambda: Selector(criteria=[IpDscpCriterion(ip_dscp=46)]), "need an ETH_TYPE"),
        (
            lambda: Selector(
                criteria=[EthTypeCriterion(eth_type=0x800), UdpDstCriterion(udp_port=1)]
            ),
            "need IP_PROTO 17",
        ),
        (
            lambda: Selector(
                criteria=[EthTypeCriterion(eth_type=0x800), EthTypeCriterion(eth_type=0x86DD)]
            ),
            "appears twice",
        ),
        (lambda: Ipv4SrcCriterion(ip="10.0.0.1/8"), "host bits set"),
        (
            lambda: Treatment(
                instructions=[MeterInstruction(meter_id=1), MeterInstruction(meter_id=2)]
            ),
            "at most one METER",
        ),
        # MeterRequestCodec: unit and bands; MeterBandCodec: type list.
        (
            lambda: MeterRequest(device_id=DEV, unit="BITS", bands=[Band(type="DROP", rate=1)]),
            "KB_PER_SEC",
        ),
        (lambda: MeterRequest(device_id=DEV, unit="KB_PER_SEC", bands=[]), "at least 1"),
        (lambda: Band(type="POLICE", rate=1), "DROP"),
        (
            lambda: MeterRequest(
                device_id=DEV, unit="KB_PER_SEC", bands=[Band(type="DROP", rate=1, burst_size=9)]
            ),
            "only applied with burst",
        ),
        # IntentCodec/PointToPointIntentCodec.
        (
            lambda: PointToPointIntent(
                app_id="a",
                ingress_point=ConnectPoint(device=DEV, port=1),
                egress_point=ConnectPoint(device=DEV, port=1),
            ),
            "the same",
        ),
        (
            lambda: PointToPointIntent(
                app_id="a",
                priority=0,
                ingress_point=ConnectPoint(device=DEV, port=1),
                egress_point=ConnectPoint(device=DEV, port=2),
            ),
            "greater than or equal to 1",
        ),
        (lambda: ConnectPoint(device=DEV, port="CONTROLLER"), "must be a port number"),
    ],
)
def test_codec_rules_refuse_what_onos_would_refuse_or_alter(build, message) -> None:
    with pytest.raises(ValidationError, match=message):
        build()


def test_onos_encoded_criteria_parse_back() -> None:
    """ONOS encodes ETH_TYPE as "0x800" (EncodeCriterionCodecHelper); read-back must match."""
    assert (
        EthTypeCriterion.model_validate({"type": "ETH_TYPE", "ethType": "0x800"}).eth_type == 0x800
    )
    assert EthTypeCriterion.model_validate({"type": "ETH_TYPE", "ethType": 2048}).eth_type == 0x800
    rule = flows()[0]
    again = FlowRule.model_validate(json.loads(json.dumps(rule.to_json())))
    assert again.identity() == rule.identity()


def test_vendored_definitions_are_onos_unedited() -> None:
    """The vendored definitions are the files as ONOS publishes them (SHA256SUMS was written when
    they were copied, see schemas/README.md): corrections live in code, never in the copies."""
    sums = dict(
        reversed(line.split()) for line in SCHEMAS.joinpath("SHA256SUMS").read_text().splitlines()
    )
    assert {f"{n}.json" for n in validation.SCHEMAS} | {"FlowRules.json", "LICENSE.txt"} <= set(
        sums
    )
    for name, digest in sums.items():
        data = SCHEMAS.joinpath(name).read_bytes()
        assert hashlib.sha256(data).hexdigest() == digest, f"{name} differs from ONOS's"
    assert "Apache License" in SCHEMAS.joinpath("LICENSE.txt").read_text()
