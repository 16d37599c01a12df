"""`cgloop actuators onos …` against the contract server, and the opt-in run against a live ONOS
(set ONOS_URL, and CGLOOP_ONOS_USERNAME/PASSWORD if not ONOS's defaults)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from cgloop.actuators.onos import (
    EthTypeCriterion,
    FlowRule,
    IpDscpCriterion,
    OnosClient,
    OnosSettings,
    OutputInstruction,
    Selector,
    Treatment,
)
from cgloop.actuators.onos.contract import OnosContractServer

DEV = "of:0000000000000001"


def cgloop(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["cgloop", "actuators", "onos", *args],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_cli_installs_flows_from_a_file_and_refuses_bad_ones(tmp_path: Path) -> None:
    flow = {
        "priority": 40000,
        "deviceId": DEV,
        "selector": {
            "criteria": [
                {"type": "ETH_TYPE", "ethType": "0x0800"},
                {"type": "IP_DSCP", "ipDscp": 46},
            ]
        },
        "treatment": {"instructions": [{"type": "OUTPUT", "port": "2"}]},
    }
    good, bad = tmp_path / "good.json", tmp_path / "bad.json"
    good.write_text(json.dumps([flow]))
    bad.write_text(
        json.dumps({**flow, "selector": {"criteria": [{"type": "IP_DSCP", "ipDscp": 99}]}})
    )
    with OnosContractServer(password="pw") as onos:
        onos.add_device(DEV)
        env = {"CGLOOP_ONOS_URL": onos.url, "CGLOOP_ONOS_PASSWORD": "pw"}
        done = cgloop("install-flows", str(good), env=env)
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout)[0]["device_id"] == DEV
        assert len(onos.state.flows) == 1
        refused = cgloop("install-flows", str(bad), env=env)
        assert refused.returncode != 0
        assert "ipDscp" in refused.stderr or "ip_dscp" in refused.stderr
        assert len(onos.state.flows) == 1
        listed = cgloop("devices", env=env)
        assert json.loads(listed.stdout)[0]["id"] == DEV


@pytest.mark.skipif("ONOS_URL" not in os.environ, reason="set ONOS_URL to run against a live ONOS")
def test_live_onos_round_trip() -> None:
    settings = OnosSettings(url=os.environ["ONOS_URL"], app_name="org.cgloop.actuators.test")
    with OnosClient(settings) as client:
        app = client.register_app()
        assert app.name == settings.app_name
        devices = client.devices()
        client.hosts()
        client.links()
        if not devices:
            pytest.skip("ONOS has no devices to install a flow on")
        rule = FlowRule(
            priority=1234,
            device_id=devices[0].id,
            selector=Selector(
                criteria=[EthTypeCriterion(eth_type=0x800), IpDscpCriterion(ip_dscp=46)]
            ),
            treatment=Treatment(instructions=[OutputInstruction(port="CONTROLLER")]),
        )
        ref = client.install_flow(rule)
        try:
            assert client.install_flow(rule) == ref
            assert client.find_flow(rule) == ref
        finally:
            client.remove_flow(ref)
