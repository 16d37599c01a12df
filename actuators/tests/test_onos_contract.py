"""The ONOS contract server refuses what ONOS's codecs refuse, independently of the driver.

A double that accepts what the real ONOS refuses makes every test run against it a lie; one that
shares the driver's own check proves nothing when the two agree. So: bodies ONOS's decoders
throw on (IpPrefix.valueOf, TpPort.tpPort, PortNumber.fromString, nullIsIllegal) are posted raw
and must get ONOS's 400, the driver must refuse the same bodies before sending anything, and the
server's code must not import the driver's models or schema check.
"""

from __future__ import annotations

import ast
import copy
from collections.abc import Iterator
from importlib import resources
from typing import Any

import httpx
import pytest
from cgloop.actuators.onos import FlowRule, OnosClient, OnosSettings
from cgloop.actuators.onos.codecs import CRITERION_MEMBERS, published_criterion_members
from cgloop.actuators.onos.contract import OnosContractServer
from pydantic import ValidationError

DEV = "of:0000000000000001"
AUTH = ("onos", "rocks")


def good_flow() -> dict[str, Any]:
    """A body as ONOS's own REST documentation would post it."""
    return {
        "priority": 40000,
        "timeout": 0,
        "isPermanent": True,
        "deviceId": DEV,
        "treatment": {"instructions": [{"type": "OUTPUT", "port": "2"}], "deferred": []},
        "selector": {
            "criteria": [
                {"type": "ETH_TYPE", "ethType": "0x0800"},
                {"type": "IP_PROTO", "protocol": 17},
                {"type": "IPV4_DST", "ip": "10.0.1.0/24"},
                {"type": "UDP_DST", "udpPort": 9000},
            ]
        },
    }


def _with(path: tuple[Any, ...], value: Any) -> dict[str, Any]:
    body = good_flow()
    node: Any = body
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return body


CRITERIA = ("selector", "criteria")
# Each: a body ONOS's codecs refuse, and the words of the refusal.
BAD_FLOWS = {
    # IpPrefix.valueOf needs "address/length".
    "ipv4 without prefix length": (_with((*CRITERIA, 2, "ip"), "10.0.1.1"), "prefix"),
    "ipv4 prefix length 33": (_with((*CRITERIA, 2, "ip"), "10.0.1.0/33"), "prefix length"),
    # TpPort.tpPort: a transport port is 16 bits.
    "udp port 70000": (_with((*CRITERIA, 3, "udpPort"), 70000), "out of range"),
    "udp port -1": (_with((*CRITERIA, 3, "udpPort"), -1), "out of range"),
    # PortNumber.fromString: a number, "[name](number)" or a Logical name, case-sensitive.
    "output port eth0": (
        _with(("treatment", "instructions", 0, "port"), "eth0"),
        "PortNumber.Logical.eth0",
    ),
    "output port lower-case controller": (
        _with(("treatment", "instructions", 0, "port"), "controller"),
        "Logical.controller",
    ),
    "output without port": (
        _with(("treatment", "instructions", 0), {"type": "OUTPUT"}),
        "port member is required",
    ),
    "unknown criterion": (_with((*CRITERIA, 0), {"type": "ETH_TIPE", "ethType": 1}), "unknown"),
    "ethType not a number": (_with((*CRITERIA, 0, "ethType"), "ipv4"), "not a number"),
    "priority past FlowRule.MAX_PRIORITY": (_with(("priority",), 70000), "Priority"),
    "temporary flow without timeout": (
        {k: v for k, v in _with(("isPermanent",), False).items() if k != "timeout"},
        "timeout member is required",
    ),
}


@pytest.fixture
def onos() -> Iterator[OnosContractServer]:
    with OnosContractServer() as server:
        server.add_device(DEV)
        yield server


def post_flow(onos: OnosContractServer, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{onos.url}/onos/v1/flows/{DEV}", json=body, auth=AUTH, timeout=5)


def test_a_valid_body_is_installed(onos: OnosContractServer) -> None:
    resp = post_flow(onos, good_flow())
    assert resp.status_code == 201, resp.text
    (flow,) = onos.state.flows.values()
    assert {"type": "IPV4_DST", "ip": "10.0.1.0/24"} in flow["selector"]["criteria"]
    # ONOS's decoders are lenient where the value stays meaningful: host bits are masked,
    # logical ports and "UNKNOWN(n)" / "[name](n)" forms are read.
    for ip, port in (("10.0.1.7/24", "CONTROLLER"), ("10.0.2.0/24", "[eth1](3)")):
        body = _with((*CRITERIA, 2, "ip"), ip)
        body["treatment"]["instructions"][0]["port"] = port
        assert post_flow(onos, body).status_code == 201


@pytest.mark.parametrize("case", sorted(BAD_FLOWS))
def test_bodies_onos_refuses_get_400(onos: OnosContractServer, case: str) -> None:
    body, words = BAD_FLOWS[case]
    resp = post_flow(onos, copy.deepcopy(body))
    assert resp.status_code == 400, f"{case}: {resp.status_code} {resp.text}"
    error = resp.json()
    assert error["code"] == 400 and words in error["message"], error
    assert not onos.state.flows, "a refused flow was installed"
    batch = httpx.post(
        f"{onos.url}/onos/v1/flows", json={"flows": [good_flow(), body]}, auth=AUTH, timeout=5
    )
    assert batch.status_code == 400, f"{case} in a batch: {batch.status_code}"


@pytest.mark.parametrize("case", ["udp port 70000", "output port eth0", "udp port -1"])
def test_the_driver_refuses_them_before_sending(onos: OnosContractServer, case: str) -> None:
    body, _ = BAD_FLOWS[case]
    settings = OnosSettings(url=onos.url, attempts=1, timeout_s=5)
    with OnosClient(settings) as client, pytest.raises(ValidationError):
        client.install_flow(FlowRule.model_validate(copy.deepcopy(body)))
    assert onos.count("POST", "/flows") == 0


def test_the_driver_never_sends_an_address_without_its_prefix(onos: OnosContractServer) -> None:
    """A bare address is made a /32 by the driver's model: what ONOS gets has its length, so the
    server (which refuses the bare form) installs it."""
    body, _ = BAD_FLOWS["ipv4 without prefix length"]
    settings = OnosSettings(url=onos.url, attempts=1, timeout_s=5)
    with OnosClient(settings) as client:
        client.install_flow(FlowRule.model_validate(copy.deepcopy(body)))
    (flow,) = onos.state.flows.values()
    assert {"type": "IPV4_DST", "ip": "10.0.1.1/32"} in flow["selector"]["criteria"]
    with pytest.raises(ValidationError, match="host bits set"):
        FlowRule.model_validate(_with((*CRITERIA, 2, "ip"), "10.0.1.1/24"))


def test_intent_selectors_are_decoded_alike(onos: OnosContractServer) -> None:
    httpx.post(f"{onos.url}/onos/v1/applications/app/register", auth=AUTH, timeout=5)
    intent = {
        "type": "PointToPointIntent",
        "appId": "app",
        "ingressPoint": {"device": DEV, "port": "1"},
        "egressPoint": {"device": DEV, "port": "2"},
        "selector": {"criteria": [{"type": "IPV4_SRC", "ip": "10.0.0.1"}]},
    }
    resp = httpx.post(f"{onos.url}/onos/v1/intents", json=intent, auth=AUTH, timeout=5)
    assert resp.status_code == 400 and "prefix" in resp.json()["message"]
    intent["selector"]["criteria"][0]["ip"] = "10.0.0.1/32"
    resp = httpx.post(f"{onos.url}/onos/v1/intents", json=intent, auth=AUTH, timeout=5)
    assert resp.status_code == 201, resp.text


def test_criterion_members_are_onos_published_ones() -> None:
    """The members the server decodes are those ONOS's definitions declare, and the 16-bit
    transport ports are declared uint16 there (the range the server enforces)."""
    published = published_criterion_members()
    assert set(CRITERION_MEMBERS.values()) <= published.keys()
    assert published["udpPort"] == published["tcpPort"] == "uint16"


def test_the_server_shares_nothing_with_the_drivers_check() -> None:
    package = resources.files("cgloop.actuators.onos")
    for module in ("contract.py", "codecs.py"):
        tree = ast.parse(package.joinpath(module).read_text())
        imported = {n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)} | {
            a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names
        }
        assert (
            not {
                "cgloop.actuators.onos.models",
                "cgloop.actuators.onos.validation",
                "jsonschema",
            }
            & imported
        ), f"{module} imports the driver's own check: {imported}"
