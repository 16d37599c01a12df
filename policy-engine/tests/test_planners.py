"""Planners reproduce the worked examples of their sources."""

from __future__ import annotations

import math

import pytest
from cgloop.policy.planners import calvin, natif, overload, power, sfc
from cgloop.policy.planners.natif import Branch, Category, Flow, NetworkFunction

MBIT = 1e6


def fig_6_2():
    """Hajji §6.2.2 Fig. 6.2: six flows a-f through X (I/O-bound) then Y (CPU-bound).

    The figure's numbers are not in the text; these are chosen so that 3 instances of each are
    needed and the flows are none negligible, as the text says.
    """
    functions = {
        "X": NetworkFunction("X", Category.IO_BOUND, capacity_pps=100, capacity_bps=1e12),
        "Y": NetworkFunction("Y", Category.CPU_BOUND, capacity_pps=1e12, capacity_bps=100 * MBIT),
    }
    pps = {"a": 30, "b": 30, "c": 50, "d": 20, "e": 90, "f": 50}
    mbps = {"a": 45, "b": 10, "c": 45, "d": 70, "e": 30, "f": 20}
    flows = {n: Flow(n, pps[n], mbps[n] * MBIT) for n in "abcdef"}
    return functions, [Branch("ch", ("X", "Y"), tuple("abcdef"))], flows


def test_natif_reproduces_fig_6_2_mapping_steps() -> None:
    functions, branches, flows = fig_6_2()
    plan = natif.natif(functions, branches, flows)
    assert plan.instances == {"X": 3, "Y": 3}
    loads = plan.distribution.loads
    # Steps 1-3 of the text: X1<-e; X2<-c,a,d; X3<-f,b (in that order).
    assert loads[("X", 0)].flows == ["e"]
    assert loads[("X", 1)].flows == ["c", "a", "d"]
    assert loads[("X", 2)].flows == ["f", "b"]
    # Steps 4-6: Y1<-d; Y2<-c,e; Y3<-a,f,b.
    assert loads[("Y", 0)].flows == ["d"]
    assert loads[("Y", 1)].flows == ["c", "e"]
    assert loads[("Y", 2)].flows == ["a", "f", "b"]
    assert plan.distribution.oversized == []
    assert plan.distribution.paths["a"] == [("X", 1), ("Y", 2)]
    assert all(u <= 1 for u in plan.distribution.utilisation(functions).values())


def test_instantiation_uses_the_corrected_formula_and_gain() -> None:
    # The printed formula ceil(c_pps / required) would give 1 instance for 250 pps on 100 pps
    # instances; the corrected one gives 3. A gain of 0.5 halves what the next function sees.
    functions = {
        "re": NetworkFunction("re", Category.CPU_BOUND, 1e9, 100, gain_bps=0.5, gain_pps=0.5),
        "nat": NetworkFunction("nat", Category.IO_BOUND, 100, 1e9),
    }
    flows = {"f": Flow("f", 250, 250)}
    got = natif.instantiate(functions, [Branch("c", ("re", "nat"), ("f",))], flows)
    assert got == {"re": 3, "nat": 2}


def test_shared_function_is_sized_for_all_its_branches() -> None:
    functions = {"fw": NetworkFunction("fw", Category.IO_BOUND, 100, 1e9)}
    flows = {"f": Flow("f", 80, 1), "g": Flow("g", 80, 1)}
    branches = [Branch("c", ("fw",), ("f",)), Branch("c", ("fw",), ("g",))]
    assert natif.instantiate(functions, branches, flows) == {"fw": 2}


def test_oversized_flow_is_reported_not_dropped() -> None:
    functions = {"fw": NetworkFunction("fw", Category.IO_BOUND, 100, 1e9)}
    flows = {"big": Flow("big", 150, 1)}
    plan = natif.natif(functions, [Branch("c", ("fw",), ("big",))], flows)
    assert plan.instances == {"fw": 2}
    assert plan.distribution.oversized == [("fw", "big")]
    assert plan.distribution.paths["big"] == [("fw", 0)]


def test_negligibility_threshold_switches_metric() -> None:
    # CPU-bound function; flows are tiny in bps but heavy in pps: with the threshold on, the
    # distribution follows pps and spreads the two heavy-pps flows over both instances.
    functions = {"ids": NetworkFunction("ids", Category.CPU_BOUND, 100, 1e9)}
    flows = {
        "p1": Flow("p1", 90, 10.0),
        "p2": Flow("p2", 80, 9.0),
        "t1": Flow("t1", 1, 11.0),
        "t2": Flow("t2", 1, 10.5),
    }
    branches = [Branch("c", ("ids",), tuple(flows))]
    by_bps = natif.distribute(functions, branches, flows, {"ids": 2})
    by_pps = natif.distribute(functions, branches, flows, {"ids": 2}, negligible_threshold=10)
    pps = lambda d: sorted(v.pps for v in d.loads.values())  # noqa: E731
    assert pps(by_bps) == [81, 91] or max(pps(by_bps)) > 100  # bps order ignores packet rate
    assert max(pps(by_pps)) <= 91
    assert by_pps.loads[("ids", 0)].flows[0] == "p1"


def test_md1_delay_model() -> None:
    # rho = 0.5 at 1000 pps capacity: t_s = 1 ms, wait = 1 ms * 0.5 / (2 * 0.5) = 0.5 ms.
    assert natif.md1_delay_s(500, 1000) == pytest.approx(1.5e-3)
    assert natif.md1_delay_s(0, 1000) == pytest.approx(1e-3)
    assert math.isinf(natif.md1_delay_s(1000, 1000))  # rho = 1 is overload
    with pytest.raises(ValueError):
        natif.md1_delay_s(1, 0)


def test_natif_beats_throughput_only_on_high_packet_rate_profile() -> None:
    # Profile P1 of §7.1: high packet rate, low throughput, through an I/O-bound firewall
    # (38 kpps: four 10 kpps firewall instances at rho = 0.95).
    functions = {
        "fw": NetworkFunction("fw", Category.IO_BOUND, 10_000, 1e9),
        "ids": NetworkFunction("ids", Category.CPU_BOUND, 1e9, 200 * MBIT),
    }
    flows = {f"f{i}": Flow(f"f{i}", 1_900, 1 * MBIT) for i in range(20)}
    branches = [Branch("c", ("fw", "ids"), tuple(flows))]
    ours = natif.natif(functions, branches, flows)
    theirs = natif.throughput_only(functions, branches, flows)
    assert ours.instances["fw"] == 4 and theirs.instances["fw"] == 1
    ours_d = natif.flow_delays_s(functions, ours.distribution)
    theirs_d = natif.flow_delays_s(functions, theirs.distribution)
    assert max(ours_d.values()) < math.inf
    assert math.isinf(max(theirs_d.values()))  # 40 kpps on one 10 kpps firewall: overload
    scaled, greedy = natif.greedy(functions, branches, flows, cores=4)
    # Single-threaded functions cannot use the extra cores of the scaled-up instance.
    assert math.isinf(max(natif.flow_delays_s(scaled, greedy.distribution).values()))


def test_natif_rejects_unknown_names() -> None:
    functions = {"fw": NetworkFunction("fw", Category.IO_BOUND, 1, 1)}
    with pytest.raises(ValueError, match="unknown function 'nat'"):
        natif.instantiate(functions, [Branch("c", ("nat",), ())], {})


def test_calvin_classification_table() -> None:
    # CALVIN §III-B: forwarding is elementary; router, load balancer, NAT, packet filter are
    # basic (kernel, XDP); encryption, compression, network coding are advanced (user space).
    expected = {
        "forward": calvin.FunctionKind.ELEMENTARY,
        "router": calvin.FunctionKind.BASIC,
        "load_balancer": calvin.FunctionKind.BASIC,
        "nat": calvin.FunctionKind.BASIC,
        "packet_filter": calvin.FunctionKind.BASIC,
        "encryption": calvin.FunctionKind.ADVANCED,
        "compression": calvin.FunctionKind.ADVANCED,
        "network_coding": calvin.FunctionKind.ADVANCED,
    }
    got = {n: calvin.classify(calvin.KNOWN_FUNCTIONS[n]) for n in expected}
    assert got == expected
    assert calvin.runs_in(calvin.FunctionKind.BASIC) == "kernel_xdp"
    assert calvin.runs_in(calvin.FunctionKind.ADVANCED) == "user_space_af_xdp"


def _chain(cid: str, base_rtt_s: float, *fns: tuple[str, float]) -> calvin.ChainRequest:
    return calvin.ChainRequest(
        cid,
        "gaming",
        tuple(calvin.ChainFunctionRequest(calvin.KNOWN_FUNCTIONS[n], t) for n, t in fns),
        base_rtt_s,
    )


def test_calvin_admission_reproduces_section_iv_d() -> None:
    # §IV-D: 1400 B packets, 0.32 ms chain RTT; network coding (< 7 us) fits the 20 us budget,
    # encryption does not; with 256 B packets (0.19 ms) encryption fits.
    ledger = calvin.LatencyLedger(free_cores=[2, 3])
    nc = ledger.place(_chain("nc", 0.32e-3, ("nat", 0.0), ("network_coding", 7e-6)))
    assert nc.admitted, nc.reasons
    assert [f.core for f in nc.functions] == [None, 2]
    enc = ledger.place(_chain("enc", 0.32e-3, ("encryption", 25e-6)))
    assert not enc.admitted
    assert any("20 us advanced-function budget" in r for r in enc.reasons)
    assert any("edge budget" in r for r in enc.reasons)
    small = ledger.place(_chain("enc256", 0.19e-3, ("encryption", 15e-6)))
    assert small.admitted and small.functions[0].core == 3
    # No core left for another advanced function until a chain is released.
    full = ledger.place(_chain("nc2", 0.19e-3, ("network_coding", 5e-6)))
    assert not full.admitted and "no free core" in full.reasons[0]
    ledger.release("nc")
    assert ledger.place(_chain("nc2", 0.19e-3, ("network_coding", 5e-6))).admitted


def test_sfc_placement_fig_2_2() -> None:
    # Thesis ch. 2, Fig. 2.2: four SFs on two compute nodes; the service runs on node A.
    nodes = [sfc.Node("A", slots=3), sfc.Node("B", slots=3)]
    chain = ["sf1", "sf2", "sf3", "sf4"]
    lb = sfc.lb(chain, nodes)
    lc = sfc.lc(chain, nodes, service_node="A")
    lblc = sfc.lblc(chain, nodes, service_node="A")
    assert lb == ["A", "B", "A", "B"] and sfc.inter_node_links(lb) == 3
    assert lc == ["A", "A", "A", "B"] and sfc.inter_node_links(lc) == 1
    assert lblc == ["A", "A", "B", "B"] and sfc.inter_node_links(lblc) == 1
    # LBLC keeps LB's balance, LC does not.
    assert sfc.node_loads(lblc, nodes) == sfc.node_loads(lb, nodes) == {"A": 2, "B": 2}
    assert sfc.node_loads(lc, nodes) == {"A": 3, "B": 1}
    with pytest.raises(ValueError, match="do not fit"):
        sfc.lb(chain * 2, nodes)


def test_lb_prefers_least_loaded_node() -> None:
    nodes = [sfc.Node("A", 4, load=3), sfc.Node("B", 4, load=0)]
    assert sfc.lb(["x", "y", "z", "w"], nodes) == ["B", "B", "B", "A"]


def test_overload_model_reproduces_table_5_5() -> None:
    # Gallenmüller Table 5.5/5.6: R_max = (1 s - d_sum) / t_CPU.
    cases = [
        (11.4e-6, 2949.9e-6, 87.4e3),
        (12.6e-6, 8891.6e-6, 78.7e3),
        (14.3e-6, 2949.9e-6, 69.7e3),
        (15.1e-6, 8891.6e-6, 65.6e3),
    ]
    for t_cpu, d_sum, published in cases:
        assert overload.r_max_pps(t_cpu, d_sum) == pytest.approx(
            published, abs=100
        )  # the table truncates
    assert overload.t_cpu_from_latency(14.5e-6, 3.1e-6) == pytest.approx(11.4e-6)
    d = overload.check_overload(75e3, 11.4e-6, 2949.9e-6, margin=0.8)
    assert d.overloaded and d.excess_pps == pytest.approx(75e3 - 0.8 * d.r_max_pps)
    assert not overload.check_overload(60e3, 11.4e-6, 2949.9e-6).overloaded


def test_power_plan_keeps_critical_cores_out_of_c_states() -> None:
    plans = power.plan_power(range(4), [1], 800_000, 2_400_000, mode="feedback")
    pinned = power.CorePolicy((1,), "performance", 2_400_000, 2_400_000, "pinned_max", False)
    assert plans[0] == pinned
    assert plans[1].cores == (0, 2, 3) and plans[1].xman_mode == "feedback"
    assert plans[1].allow_cstates
    with pytest.raises(ValueError, match="not among the cores"):
        power.plan_power([0], [5], 1, 2)
