"""Every action the loop's policies can take is verified against something that measures it.

A policy without `expect` is never checked (its actions end "verified (not_checked)"), and an
`expect` on probes the lab does not send reads nothing (the same verdict, later). The end-to-end
test requires "improved"; this checks, without root, that each policy can produce it."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from cgloop.lab.scenario import load_scenario
from cgloop.lab.topology import load_topology
from cgloop.loop.closed_loop import default_scenario, write_policies
from cgloop.loop.edge import EdgePlan
from cgloop.policy.model import load_policies
from cgloop.slo import LAB
from cgloop.slo import table as slo_table


@pytest.fixture
def plan() -> EdgePlan:
    return EdgePlan.from_lab(load_topology(), load_scenario(default_scenario()))


def test_every_loop_policy_expects_the_slo_of_a_probed_queue(
    plan: EdgePlan, tmp_path: Path
) -> None:
    folder = write_policies(tmp_path, plan)
    load_policies([folder])  # the engine accepts them
    probed = {p.dscp for p in plan.probes()}
    slo_ns = plan.latency_slo_ms * 1e6
    assert slo_ns == slo_table().deployment(LAB).latency_ns  # the SLO table's lab objective
    policies = [
        p for f in sorted(folder.glob("*.yaml")) for p in yaml.safe_load(f.read_text())["policies"]
    ]
    assert {p["id"] for p in policies} >= {f"lab-l4s-abuse-demote-{plan.node}"}  # per edge
    for p in policies:
        action = p["action"]
        if action["operation"] == "protect_flow":
            # Changes nothing itself: the node's moves it leads to are verified against its SLO
            # (cgloop.policy.facts), with the probes of the DSCP it marks.
            assert action["parameters"]["latency_slo_ns"] == slo_ns, p["id"]
            assert action["parameters"]["rewrite_dscp"] in probed, p["id"]
            continue
        expect = action.get("expect")
        assert expect, f"{p['id']}: no expect, its actions are never verified"
        assert expect["metric"].startswith("probe."), p["id"]
        assert expect["comparator"] == "less_than" and expect["value"] == slo_ns, p["id"]
        # Verification reads the probes of the DSCP the flow is re-marked with (after) against
        # the others (before): that DSCP must be one the lab probes.
        dscp = action["parameters"]["rewrite_dscp"]
        assert dscp in probed, f"{p['id']}: DSCP {dscp} is not probed ({sorted(probed)})"
