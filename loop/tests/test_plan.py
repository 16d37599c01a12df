"""The loop's plan without root: where services attach, the queues, the policies it renders,
how a scenario becomes trials, and how recovery is read from the ground truth."""

from __future__ import annotations

import os
import tomllib
from pathlib import Path

import numpy as np
import pytest
from cgloop.errors import CgloopError
from cgloop.lab.scenario import load_scenario
from cgloop.lab.topology import load_topology
from cgloop.lab.traffic.stats import Packets
from cgloop.loop.closed_loop import (
    SESSION_JOIN,
    LoopOptions,
    default_scenario,
    split_trials,
    write_levers,
    write_policies,
)
from cgloop.loop.core import CorePlan, core_agent_toml
from cgloop.loop.edge import (
    DEFAULT_CLASS,
    DPI_RT_PRIORITY,
    EF_DSCP,
    GAMING_CLASS,
    L4S_CLASS,
    LINK_CLASS,
    EdgePlan,
    agent_toml,
    edge_plans,
)
from cgloop.loop.power import write_sysfs
from cgloop.loop.report import recovery
from cgloop.policy.model import load_policies
from cgloop.slo import LAB
from cgloop.slo import table as slo_table


@pytest.fixture
def plan() -> EdgePlan:
    return EdgePlan.from_lab(load_topology(), load_scenario(default_scenario()))


def test_plan_from_the_default_lab(plan: EdgePlan) -> None:
    assert (plan.node, plan.bottleneck) == ("edge1", "cpe1")
    assert plan.interfaces == ["core", "cpe1"]
    assert [t.client for t in plan.targets] == ["cl1"]
    assert str(plan.targets[0].address) == "10.77.11.2"


def test_one_plan_per_edge_and_the_core() -> None:
    topo, sc = load_topology(), load_scenario(default_scenario())
    plans = edge_plans(topo, sc)
    assert [(p.node, p.bottleneck, p.link_mbit) for p in plans] == [
        ("edge1", "cpe1", 100.0), ("edge2", "cpe2", 100.0),
    ]
    # each edge probes the gaming clients behind it, the late player's too (cl2)
    assert [[t.client for t in p.targets] for p in plans] == [["cl1"], ["cl2"]]
    core = CorePlan.from_lab(topo)
    assert core is not None and core.node == "core"
    assert core.edges == {"edge1": 200.0, "edge2": 200.0}
    shaped = {h.interface_name: h for h in core.hierarchies()}
    assert sorted(shaped) == ["edge1", "edge2"]
    for h in shaped.values():
        link = next(c for c in h.classes if c.class_id == LINK_CLASS)
        assert link.rate_bps == 200_000_000
        assert sum(c.rate_bps for c in h.classes if c.parent_class_id == LINK_CLASS) == 200_000_000
    # the INT source: switch id 1, postcards to the collector beside it, the core's queues
    toml = tomllib.loads(core_agent_toml(core, "/j.pb", "127.0.0.1:9092"))
    assert toml["int_export"] == {
        "collector": "127.0.0.1:32766", "node_id": 1, "interfaces": ["edge1", "edge2"],
        "sample_every": 32,
    }
    assert toml["bounds"]["interfaces"] == ["edge1", "edge2"]
    # the latency guard of the gaming flows the engine protects on the core (its policy:
    # lab-gaming-protect-core), off with the micro loop off; no L4S class there
    assert toml["guard"]["enabled"] is True and toml["queue_protection"]["enabled"] is False
    off = tomllib.loads(core_agent_toml(core, "/j.pb", "", micro_loop=False))
    assert off["guard"]["enabled"] is False
    # every lab node shares the VM's cores: each agent reads its node's cgroup, when it has one
    assert "cpu_accounting" not in toml
    core.cgroup = Path("/sys/fs/cgroup/cgloop-lab/core")
    toml = tomllib.loads(core_agent_toml(core, "/j.pb", "127.0.0.1:9092"))
    assert toml["cpu_accounting"] == {"cgroup": "/sys/fs/cgroup/cgloop-lab/core"}
    plans[0].cgroup = Path("/sys/fs/cgroup/cgloop-lab/edge1")
    edge = tomllib.loads(agent_toml(plans[0], "/j.pb", ""))
    assert edge["cpu_accounting"] == {"cgroup": "/sys/fs/cgroup/cgloop-lab/edge1"}
    plans[0].cgroup = None
    # the analytics name INT's switch 1 and its egress ports (ifindexes) as the lab does
    core.int_ports = {7: "edge1", 9: "edge2"}
    assert core.analytics_args() == [
        "--int-switch", "1=core", "--int-port", "1:7=edge1", "--int-port", "1:9=edge2",
    ]


def test_a_topology_without_an_edge_is_refused() -> None:
    topo = load_topology().model_copy(update={"links": [
        link.model_copy(update={"bottleneck": None}) for link in load_topology().links
    ]})
    with pytest.raises(ValueError, match="has no edge"):
        edge_plans(topo, load_scenario(default_scenario()))


def test_gaming_chain_is_basic_functions_then_dpi(plan: EdgePlan) -> None:
    chain = plan.chain()
    assert chain.traffic_class == "gaming"  # the hierarchy's name of 1:20
    assert any(c.name == chain.traffic_class and c.class_id == GAMING_CLASS
               for c in plan.hierarchy().classes)
    names = [f.WhichOneof("function") for f in chain.functions]
    # CALVIN: header functions in BPF first, the payload function (AF_XDP) last
    assert names == ["mark", "rate_limit", "dpi"]
    assert chain.functions[-1].instances == 1


def test_emulated_sysfs_is_laid_out_as_the_kernels(tmp_path: Path, plan: EdgePlan) -> None:
    tree = write_sysfs(tmp_path / "sysfs", cores=2)
    assert tree.read("cpufreq/policy1/related_cpus") == "1"
    assert tree.read("cpufreq/policy0/scaling_governor") == "schedutil"
    assert (tree.cpuidle_root / "cpu1" / "cpufreq").resolve() == tree.cpufreq_root / "policy1"
    assert tree.read("cpu0/cpuidle/state0/name") == "POLL"
    assert tree.read("cpu1/cpuidle/state1/disable") == "0"
    plan.cpufreq_root, plan.cpuidle_root = tree.cpufreq_root, tree.cpuidle_root
    plan.pin_dir = Path("/sys/fs/bpf/cgloop-cgl-edge1")
    power = tomllib.loads(agent_toml(plan, "/j.pb", ""))["power"]
    # X-MAN reads this edge's probe's per-function counters, not the default pins
    assert power == {"cpufreq_root": str(tree.cpufreq_root),
                     "cpuidle_root": str(tree.cpuidle_root),
                     "fn_stats_pin": "/sys/fs/bpf/cgloop-cgl-edge1/fn_stats",
                     "if_fn_pin": "/sys/fs/bpf/cgloop-cgl-edge1/if_fn"}
    # a fresh run starts from the kernel's defaults again
    (tree.cpufreq_root / "policy0" / "scaling_governor").write_text("performance\n")
    assert write_sysfs(tmp_path / "sysfs", cores=2).read(
        "cpufreq/policy0/scaling_governor") == "schedutil"


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
    assert (on["node_id"], on["bounds"]["interfaces"]) == ("edge1", ["cpe1"])
    assert "power" not in on  # the kernel's sysfs unless the loop gives an emulated tree
    assert on["queues"]["sample_interval_us"] == 1000
    qp = on["queue_protection"]
    assert qp["enabled"] and qp["interfaces"] == ["cpe1"]
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
        ("edge1-cl1-be", 0), ("edge1-cl1-ef", EF_DSCP),
    ]
    assert all(p.interval_jitter_ns and p.timeout_ns for p in probes)
    # a probe unanswered for the SLO is reported before its reply: latency is over the SLO
    assert {p.overdue_after_ns for p in probes} == {int(plan.latency_slo_ms * 1e6)}
    assert all(p.overdue_after_ns < p.timeout_ns for p in probes)


def test_rendered_policies_validate_and_target_the_edge(plan: EdgePlan, tmp_path: Path) -> None:
    edges = edge_plans(load_topology(), load_scenario(default_scenario()))
    for p in edges:
        write_policies(tmp_path, p)
    policies = load_policies([tmp_path])
    # rendered once per edge, each id suffixed with its node: they load side by side
    assert {p.id for p in policies} == {
        f"{base}-{e.node}" for e in edges
        for base in ("lab-gaming-protect", "lab-gaming-latency-reprioritise",
                     "lab-l4s-abuse-demote")
    }
    for e in edges:
        text = (tmp_path / f"loop-{e.node}.yaml").read_text()
        assert "{edge_node}" not in text and "{edge_interface}" not in text
        assert "{latency_slo_ns}" not in text and "{latency_slo_ms}" not in text
        mine = [p for p in policies if p.id.endswith(f"-{e.node}")]
        assert {p.action.target.node_id for p in mine} == {e.node}
        assert {p.action.target.interface_name for p in mine} == {e.bottleneck}
    gaming = next(p for p in policies if p.id == "lab-gaming-latency-reprioritise-edge1")
    assert gaming.action.operation.value == "reprioritise_flow"
    # the micro loop's protections: the gaming class and the lab's SLO, the SLO table's
    protect = next(p for p in policies if p.id == "lab-gaming-protect-edge1")
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
    text = (write_policies(tmp_path, plan) / "loop-edge1.yaml").read_text()
    assert "latency_slo_ns: 35000000" in text and "value: 35000000" in text
    assert "loop's 35 ms objective" in text and "under the 35 ms objective" in text
    core = CorePlan.from_lab(load_topology())
    assert core is not None
    levers = write_levers(tmp_path, core, 35.0)
    if levers is not None:  # the levers template, once it is packaged
        text = levers.read_text()
        assert "{core_node}" not in text and "{core_device_id}" not in text
        assert "{latency_slo_ns}" not in text and "{latency_slo_ms}" not in text
        # classified gaming flows are guarded on the core too, on its egress towards their edge
        protect = {p.id: p for p in load_policies([levers])}["lab-gaming-protect-core"]
        assert protect.action.operation.value == "protect_flow"
        assert protect.action.target.node_id == "core"
        assert protect.action.target.interface_name == "{label:node_id}"
    with pytest.raises(CgloopError, match="no SLO deployment profile 'moon'"):
        _ = LoopOptions(slo_profile="moon").latency_slo_ms


def test_each_fault_is_a_trial_with_fresh_gaming_flows() -> None:
    sc = load_scenario(default_scenario())
    opts = LoopOptions(lead_s=5, tail_s=3)
    trials = split_trials(sc, opts)
    late = [t for t in sc.traffic if getattr(t, "at", 0) > 0]
    assert late, "the default scenario has a session joining late"
    assert len(trials) == len(sc.faults) + len(late)
    ports = [t.traffic[0].port for t in trials]
    assert len(set(ports)) == len(ports) and sc.traffic[0].port not in ports
    for t, f in zip(trials, sc.faults, strict=False):
        assert len(t.faults) == 1 and t.faults[0].kind == f.kind
        assert t.faults[0].at == 5 and t.duration == 5 + f.duration + 3
        # late sessions join in their own trial only
        assert all(getattr(s, "at", 0) == 0 for s in t.traffic)
    join = trials[-1]
    assert not join.faults and SESSION_JOIN
    joining = [s for s in join.traffic if getattr(s, "at", 0) > 0]
    assert [(s.client, s.at) for s in joining] == [(late[0].client, 5)]
    # under 5 minutes of scenario
    assert sum(t.duration for t in trials) < 300


def test_the_scenario_has_a_fault_for_every_lever() -> None:
    sc = load_scenario(default_scenario())
    kinds = [f.kind for f in sc.faults]
    assert {"congestion", "ect1_abuse", "core_congestion"} <= set(kinds)
    hogs = {f.node: f for f in sc.faults if f.kind == "cpu_hog"}
    plans = {p.node: p for p in edge_plans(load_topology(), sc)}
    # function_overload: a SCHED_FIFO hog above edge1's dpi worker, on its core (it starves)
    f = hogs["edge1"]
    assert f.cores == [plans["edge1"].dpi_core] and f.realtime_priority > DPI_RT_PRIORITY
    # node_overload: edge2's core busy, below its worker (edge2's chain is still served), and
    # not the core of edge1's worker (each edge's fault stays its own)
    n = hogs["edge2"]
    assert 0 < n.realtime_priority < DPI_RT_PRIORITY
    assert plans["edge1"].dpi_core not in n.cores
    # each edge's worker on a core of its own (two or more cores)
    if (os.cpu_count() or 1) > 1:
        assert plans["edge1"].dpi_core != plans["edge2"].dpi_core


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
