"""The loop's plan without root: where services attach, the queues, the policies it renders,
how a scenario becomes trials, and how recovery is read from the ground truth."""

from __future__ import annotations

import tomllib
from pathlib import Path

import numpy as np
import pytest
from cgloop.errors import CgloopError
from cgloop.lab.scenario import load_scenario
from cgloop.lab.topology import load_topology
from cgloop.lab.traffic.stats import Packets
from cgloop.loop.closed_loop import LoopOptions, default_scenario, split_trials, write_policies
from cgloop.loop.edge import (
    DEFAULT_CLASS,
    EF_DSCP,
    GAMING_CLASS,
    L4S_CLASS,
    LINK_CLASS,
    EdgePlan,
    agent_toml,
)
from cgloop.loop.report import recovery
from cgloop.policy.model import load_policies
from cgloop.slo import LAB
from cgloop.slo import table as slo_table


@pytest.fixture
def plan() -> EdgePlan:
    return EdgePlan.from_lab(load_topology(), load_scenario(default_scenario()))


def test_plan_from_the_default_lab(plan: EdgePlan) -> None:
    assert (plan.node, plan.bottleneck) == ("edge", "cpe")
    assert plan.interfaces == ["apps", "bulk", "cpe", "gs1", "gs2"]
    assert [t.client for t in plan.targets] == ["cl1", "cl2"]
    assert str(plan.targets[0].address) == "10.77.11.2"


def test_queues_add_up_to_the_link(plan: EdgePlan) -> None:
    h = plan.hierarchy()
    link = next(c for c in h.classes if c.class_id == LINK_CLASS)
    children = [c for c in h.classes if c.parent_class_id == LINK_CLASS]
    assert link.rate_bps == 100_000_000
    # guaranteed rates add up to the link: the rate-cap fault scales them together
    assert sum(c.rate_bps for c in children) == link.rate_bps
    gaming = next(c for c in children if c.class_id == GAMING_CLASS)
    l4s = next(c for c in children if c.class_id == L4S_CLASS)
    best_effort = next(c for c in children if c.class_id == DEFAULT_CLASS)
    # borrowing order: gaming, then L4S (a flood there never takes gaming's share), then BE
    assert gaming.priority < l4s.priority < best_effort.priority
    assert h.default_class_id == DEFAULT_CLASS


def test_agent_config_turns_the_micro_loop_on_and_off(plan: EdgePlan) -> None:
    on = tomllib.loads(agent_toml(plan, "/j.pb", "127.0.0.1:9092"))
    assert (on["node_id"], on["bounds"]["interfaces"]) == ("edge", ["cpe"])
    assert on["queues"]["sample_interval_us"] == 1000
    qp = on["queue_protection"]
    assert qp["enabled"] and qp["interfaces"] == ["cpe"]
    # sanctioned packets leave the L4S class for best effort, where every flow starts
    assert (qp["ll_class_id"], qp["classic_class_id"]) == (L4S_CLASS, DEFAULT_CLASS)
    # RFC 9957's defaults
    assert (qp["critical_qdelay_us"], qp["critical_score_us"], qp["lg_aging"]) == (1000, 4000, 19)
    # the guard acts at half the SLO: above a GeForce Now frame's own ~5.5 ms burst
    assert on["guard"]["enabled"] and on["guard"]["guard_fraction"] == 0.5
    off = tomllib.loads(agent_toml(plan, "/j.pb", "", micro_loop=False))
    assert not off["queue_protection"]["enabled"] and not off["guard"]["enabled"]
    # the monitor still samples: the global loop and the dashboards read its queues
    assert off["queues"] == on["queues"]


def test_one_probe_per_client_and_queue(plan: EdgePlan) -> None:
    probes = plan.probes()
    assert sorted((p.probe_id, p.dscp) for p in probes) == [
        ("edge-cl1-be", 0), ("edge-cl1-ef", EF_DSCP), ("edge-cl2-be", 0), ("edge-cl2-ef", EF_DSCP),
    ]
    assert all(p.interval_jitter_ns and p.timeout_ns for p in probes)
    # a probe unanswered for the SLO is reported before its reply: latency is over the SLO
    assert {p.overdue_after_ns for p in probes} == {int(plan.latency_slo_ms * 1e6)}
    assert all(p.overdue_after_ns < p.timeout_ns for p in probes)


def test_rendered_policies_validate_and_target_the_edge(plan: EdgePlan, tmp_path: Path) -> None:
    policies = load_policies([write_policies(tmp_path, plan)])
    assert {p.id for p in policies} == {
        "lab-gaming-protect", "lab-gaming-latency-reprioritise", "lab-l4s-abuse-demote",
    }
    text = (tmp_path / "loop.yaml").read_text()
    assert "{edge_node}" not in text and "{edge_interface}" not in text
    assert "{latency_slo_ns}" not in text and "{latency_slo_ms}" not in text
    assert 'node_id: "edge"' in text and 'interface_name: "cpe"' in text
    gaming = next(p for p in policies if p.id == "lab-gaming-latency-reprioritise")
    assert gaming.action.operation.value == "reprioritise_flow"
    # the micro loop's protections: the gaming class and the lab's SLO, the SLO table's
    protect = next(p for p in policies if p.id == "lab-gaming-protect")
    assert protect.action.operation.value == "protect_flow"
    assert protect.action.parameters["class_id"] == GAMING_CLASS
    assert protect.action.parameters["latency_slo_ns"] == int(plan.latency_slo_ms * 1e6)
    assert protect.action.parameters["latency_slo_ns"] == slo_table().deployment(LAB).latency_ns


def test_the_loop_defends_the_slo_tables_lab_profile(plan: EdgePlan, tmp_path: Path) -> None:
    lab = slo_table().latency_ms(LAB)
    assert LoopOptions().slo_profile == LAB
    assert LoopOptions().latency_slo_ms == plan.latency_slo_ms == lab
    # another profile's objective reaches the rendered policies and the probes
    plan.latency_slo_ms = 35.0
    assert {p.overdue_after_ns for p in plan.probes()} == {35_000_000}
    text = (write_policies(tmp_path, plan) / "loop.yaml").read_text()
    assert "latency_slo_ns: 35000000" in text and "value: 35000000" in text
    assert "loop's 35 ms objective" in text and "under the 35 ms objective" in text
    with pytest.raises(CgloopError, match="no SLO deployment profile 'moon'"):
        _ = LoopOptions(slo_profile="moon").latency_slo_ms


def test_each_fault_is_a_trial_with_fresh_gaming_flows() -> None:
    sc = load_scenario(default_scenario())
    opts = LoopOptions(lead_s=5, tail_s=3)
    trials = split_trials(sc, opts)
    assert len(trials) == len(sc.faults)
    ports = [t.traffic[0].port for t in trials]
    assert len(set(ports)) == len(ports) and sc.traffic[0].port not in ports
    for t, f in zip(trials, sc.faults, strict=True):
        assert len(t.faults) == 1 and t.faults[0].kind == f.kind
        assert t.faults[0].at == 5 and t.duration == 5 + f.duration + 3


def _packets(delays_ms: list[float], every_ms: float = 10.0, t0: int = 0) -> Packets:
    n = len(delays_ms)
    send = t0 + (np.arange(n) * every_ms * 1e6).astype(np.int64)
    recv = send + (np.array(delays_ms) * 1e6).astype(np.int64)
    return Packets(np.arange(n), send, recv, np.full(n, 1200))


def test_recovery_from_ground_truth() -> None:
    ms = 1_000_000
    # 3 s fault: 700 ms bad, then good
    p = _packets([80.0] * 70 + [3.0] * 230)
    affected, rec = recovery([p], 0, 3000 * ms, slo_ms=20)
    assert affected and rec == 750 * ms  # end of the last bad 250 ms window
    # never bad: not affected
    assert recovery([_packets([3.0] * 300)], 0, 3000 * ms, 20) == (False, None)
    # bad until the end: affected, not recovered
    assert recovery([_packets([3.0] * 100 + [90.0] * 200)], 0, 3000 * ms, 20) == (True, None)


def test_a_late_generator_moves_the_onset_to_its_first_packet() -> None:
    from cgloop.lab.scenario import FaultEvent
    from cgloop.loop.report import effective_onset

    def event(detail: dict) -> FaultEvent:
        return FaultEvent(id="f", kind="ect1_abuse", spec={}, onset_ns=1_000, apply_ms=0,
                          detail=detail)

    # the abuser's sender started 2.8 s late on a loaded machine: the fault began then
    assert effective_onset(event({"up": {"first_send_ns": 2_800_001_000}})) == 2_800_001_000
    assert effective_onset(event({"first_packet_ns": 5_000})) == 5_000
    # on time, or nothing known (a tc fault): the scheduled onset
    assert effective_onset(event({"up": {"first_send_ns": 900}})) == 1_000
    assert effective_onset(event({"from_mbit": 100})) == 1_000
