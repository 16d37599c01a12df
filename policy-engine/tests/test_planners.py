"""Planners reproduce the worked examples of their sources."""

from __future__ import annotations

import math
import re

import pytest
from cgloop.policy.planners import calvin, catalogue, natif, overload, power, sfc
from cgloop.policy.planners.natif import Branch, Category, Flow, NetworkFunction
from cgloop.v1 import node_agent_pb2 as na

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


def test_catalogue_is_the_proto_oneof_with_its_declared_kinds() -> None:
    # Every member of ChainFunction.function, in declaration order, with its CALVIN kind and
    # Natif bound from the function_traits option (the agent's table is built from the same).
    members = [f.name for f in na.ChainFunction.DESCRIPTOR.oneofs_by_name["function"].fields]
    assert list(catalogue.FUNCTIONS) == members
    kinds = {n: calvin.FunctionKind(f.kind).name for n, f in catalogue.FUNCTIONS.items()}
    assert kinds == {
        "forward": "ELEMENTARY",
        "acl": "BASIC",
        "mark": "BASIC",
        "rate_limit": "BASIC",
        "mirror": "BASIC",
        "dpi": "ADVANCED",
    }
    # CALVIN: payload work runs in user space, header work in BPF; Natif: the payload function
    # is CPU-bound, the header ones I/O-bound.
    for f in catalogue.FUNCTIONS.values():
        assert (f.kind == catalogue.ADVANCED) == (f.bound == catalogue.CPU_BOUND), f.name
    mark = catalogue.FUNCTIONS["mark"]
    assert mark.needs_a_parameter and [(p.name, p.max) for p in mark.params] == [
        ("dscp", 63),
        ("ecn", 3),
    ]
    assert catalogue.FUNCTIONS["dpi"].oneofs == ("pattern", "on_match")
    assert calvin.runs_in(calvin.FunctionKind.BASIC) == "kernel_xdp"
    assert calvin.runs_in(calvin.FunctionKind.ADVANCED) == "user_space_af_xdp"


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"mark": {}}, '#0 "mark": set dscp, ecn, or several'),
        ({"mark": {"dscp": 64}}, '#0 "mark": dscp 64 is not within 0..63'),
        ({"acl": {"dst_port": 70000}}, "dst_port 70000 is not within 0..65535"),
        ({"rate_limit": {"burst_bytes": 3000}}, "rate_bps 0 is not within 8..34359738360"),
        ({"mirror": {"interface": "x" * 16}}, "is not within length 1..15"),
        ({"dpi": {"text": "é" * 33, "drop": {}}}, "is not within length 1..64"),  # UTF-8 bytes
        ({"dpi": {"text": "GAME"}}, "on_match: set one of mark_dscp, drop"),
        ({"dpi": {"mark_dscp": 1}}, "pattern: set one of text, hex"),
        ({"dpi": {"hex": "abc", "drop": {}}}, 'hex "abc" is not hex bytes'),
    ],
)
def test_catalogue_refuses_like_the_agent(spec: dict, message: str) -> None:
    chain = na.ServiceChain(chain_id="c", traffic_class="gaming")
    chain.functions.append(catalogue.function(spec))
    with pytest.raises(catalogue.CatalogueError, match=re.escape(message)):
        catalogue.check_chain(chain)


def test_catalogue_reads_the_policy_form_and_names_what_is_wrong() -> None:
    fn = catalogue.function({"dpi": {"text": "GFN", "mark_dscp": 46}})
    assert fn.dpi.text == "GFN" and fn.dpi.mark_dscp == 46 and not fn.dpi.HasField("depth")
    assert catalogue.to_spec(fn) == {"dpi": {"text": "GFN", "mark_dscp": 46}}
    assert catalogue.name_of(catalogue.function("forward")) == "forward"
    with pytest.raises(catalogue.CatalogueError, match="'nat' is not in the catalogue; known: "):
        catalogue.function({"nat": {}})
    with pytest.raises(catalogue.CatalogueError, match=r'"port"(.|\n)*takes dscp, ecn'):
        catalogue.function({"mark": {"port": 1}})
    with pytest.raises(catalogue.CatalogueError, match="dscp"):
        catalogue.function({"mark": {"dscp": "high"}})


def test_scale_out_refusals_name_the_field_and_the_accepted_values() -> None:
    """Natif's scale-out as the agent checks it (bounds.rs `instances`), same words."""
    mark = catalogue.function({"mark": {"dscp": 1}})
    dpi = catalogue.function({"dpi": {"text": "G", "drop": {}}})
    mark.instances = 2
    with pytest.raises(catalogue.CatalogueError, match=re.escape(
        'chain function #0 "mark": instances 2 is not within 0..1: only advanced functions '
        "scale out"
    )):
        catalogue.check_chain(na.ServiceChain(traffic_class="g", functions=[mark]))
    dpi.instances = 5
    catalogue.check_instances(dpi, 1)  # no bound given: the planner's view
    with pytest.raises(catalogue.CatalogueError, match=re.escape(
        'chain function #1 "dpi": instances 5 is not within 0..4 (the agent\'s [bounds] '
        "max_function_instances)"
    )):
        catalogue.check_instances(dpi, 1, max_instances=4)
    dpi.instances = 2
    dpi.instance_cores.append(1)
    with pytest.raises(catalogue.CatalogueError, match=re.escape(
        "instance_cores has 1 entries; give one core per instance (2) or none"
    )):
        catalogue.check_instances(dpi, 1, max_instances=4)
    dpi.instance_cores.append(0)
    catalogue.check_instances(dpi, 1, max_instances=4)
    one = catalogue.function({"dpi": {"text": "G", "drop": {}}})
    one.instance_cores.append(1)  # instances 0 is one instance
    catalogue.check_instances(one, 0, max_instances=1)


def test_the_fake_agent_bounds_instance_cores_like_the_agent() -> None:
    from cgloop.policy.fake_agent import AgentBounds, Refused

    dpi = catalogue.function({"dpi": {"text": "G", "drop": {}}})
    dpi.instances, dpi.instance_cores[:] = 2, [0, 7]
    bounds = AgentBounds(online_cpus=[0, 1], cores=[0, 1])
    with pytest.raises(Refused, match=re.escape(
        'chain function #0 "dpi": instance_cores[1]: core 7 does not exist on this node '
        "(online CPUs: 0-1)"
    )):
        bounds.chain(na.ServiceChain(traffic_class="g", functions=[dpi]))
    dpi.instance_cores[:] = [0, 1]
    bounds.chain(na.ServiceChain(traffic_class="g", functions=[dpi]))
    bounds.cores = [0]
    with pytest.raises(Refused, match=re.escape("instance_cores[1]: core 1 is not in")):
        bounds.chain(na.ServiceChain(traffic_class="g", functions=[dpi]))
    dpi.instances = 5
    with pytest.raises(Refused, match=re.escape("instances 5 is not within 0..4")) as err:
        bounds.chain(na.ServiceChain(traffic_class="g", functions=[dpi]))
    assert err.value.code.name == "INVALID_ARGUMENT"


def test_calvin_order_and_declared_kind() -> None:
    dpi = catalogue.function({"dpi": {"text": "G", "drop": {}}})
    acl = catalogue.function({"acl": {"proto": 6}})
    with pytest.raises(catalogue.CatalogueError, match="follows an advanced one"):
        catalogue.check_chain(na.ServiceChain(traffic_class="g", functions=[dpi, acl]))
    dpi.kind = na.FUNCTION_KIND_BASIC
    with pytest.raises(catalogue.CatalogueError, match=r"CALVIN.*declare it FUNCTION_KIND_ADV"):
        catalogue.check(dpi)


def _fn(name: str) -> na.ChainFunction:
    return catalogue.function(
        {
            "forward": {"forward": {}},
            "acl": {"acl": {"proto": 17, "dst_port": 1900}},
            "mark": {"mark": {"dscp": 46}},
            "dpi": {"dpi": {"text": "GFN", "mark_dscp": 46}},
        }[name]
    )


def _chain(cid: str, base_rtt_s: float, *fns: tuple[str, float]) -> calvin.ChainRequest:
    return calvin.ChainRequest(
        cid,
        "gaming",
        tuple(calvin.ChainFunctionRequest(_fn(n), t) for n, t in fns),
        base_rtt_s,
    )


def test_calvin_admission_reproduces_section_iv_d() -> None:
    # §IV-D: 1400 B packets, 0.32 ms chain RTT; an advanced function of < 7 us (network coding
    # in the paper) fits the 20 us budget, one of 25 us (encryption) does not; with 256 B
    # packets (0.19 ms) 15 us fits. The advanced function here is the agent's dpi.
    ledger = calvin.LatencyLedger(free_cores=[2, 3])
    nc = ledger.place(_chain("nc", 0.32e-3, ("acl", 0.0), ("dpi", 7e-6)))
    assert nc.admitted, nc.reasons
    assert [f.core for f in nc.functions] == [None, 2]
    enc = ledger.place(_chain("enc", 0.32e-3, ("dpi", 25e-6)))
    assert not enc.admitted
    assert any("20 us advanced-function budget" in r for r in enc.reasons)
    assert any("edge budget" in r for r in enc.reasons)
    small = ledger.place(_chain("enc256", 0.19e-3, ("dpi", 15e-6)))
    assert small.admitted and small.functions[0].core == 3
    # No core left for another advanced function until a chain is released.
    full = ledger.place(_chain("nc2", 0.19e-3, ("dpi", 5e-6)))
    assert not full.admitted and "no free core" in full.reasons[0]
    ledger.release("nc")
    assert ledger.place(_chain("nc2", 0.19e-3, ("dpi", 5e-6))).admitted


def test_place_service_chain_returns_the_placed_agent_chain() -> None:
    fns = [_fn("mark"), _fn("acl"), _fn("dpi")]
    fns[0].kind = na.FUNCTION_KIND_ADVANCED  # a request's kind is replaced by the catalogue's
    chain = calvin.place_service_chain(
        fns,
        chain_id="gaming-edge",
        traffic_class="gaming",
        base_rtt_s=190e-6,
        free_cores=[2, 3],
        processing_s=[0, 0, 7e-6],
    )
    assert (chain.chain_id, chain.traffic_class) == ("gaming-edge", "gaming")
    assert [(catalogue.name_of(f), f.kind, f.core) for f in chain.functions] == [
        ("mark", na.FUNCTION_KIND_BASIC, 0),
        ("acl", na.FUNCTION_KIND_BASIC, 0),
        ("dpi", na.FUNCTION_KIND_ADVANCED, 2),
    ]
    assert chain.functions[2].dpi.text == "GFN"
    with pytest.raises(calvin.AdmissionRefused, match="needs processing_s") as refused:
        calvin.place_service_chain(
            [_fn("dpi")], chain_id="c", traffic_class="g", base_rtt_s=0, free_cores=[2]
        )
    assert refused.value.reasons == ["dpi: advanced function needs processing_s"]
    with pytest.raises(calvin.AdmissionRefused, match="no free core"):
        calvin.place_service_chain(
            [_fn("dpi")],
            chain_id="c",
            traffic_class="g",
            base_rtt_s=0,
            free_cores=[],
            processing_s=[1e-6],
        )
    with pytest.raises(catalogue.CatalogueError, match="follows an advanced"):
        calvin.place_service_chain(
            [_fn("dpi"), _fn("mark")],
            chain_id="c",
            traffic_class="g",
            base_rtt_s=0,
            free_cores=[2],
            processing_s=[1e-6, 0],
        )


def test_natif_takes_the_agent_functions_categories_from_the_catalogue() -> None:
    assert Category.of("acl") is Category.IO_BOUND and Category.of("dpi") is Category.CPU_BOUND
    assert Category.of("X") is None
    dpi = NetworkFunction.of("dpi", capacity_pps=1e9, capacity_bps=200 * MBIT)
    assert dpi.category is Category.CPU_BOUND
    with pytest.raises(ValueError, match="not in the chain catalogue"):
        NetworkFunction.of("nat", 1, 1)
    wrong = {"dpi": NetworkFunction("dpi", Category.IO_BOUND, 100, 1e9)}
    with pytest.raises(ValueError, match="CPU_BOUND in the chain catalogue"):
        natif.instantiate(wrong, [Branch("c", ("dpi",), ())], {})


def test_sfc_plans_an_agent_chain_checked_by_the_catalogue() -> None:
    nodes = [sfc.Node("A", slots=2), sfc.Node("B", slots=2)]
    chain = na.ServiceChain(traffic_class="gaming", functions=[_fn("mark"), _fn("acl"), _fn("dpi")])
    assert sfc.plan_chain(chain, nodes, "lblc", service_node="A") == [
        ("mark", "A"),
        ("acl", "A"),
        ("dpi", "B"),
    ]
    bad = na.ServiceChain(traffic_class="gaming", functions=[_fn("dpi"), _fn("mark")])
    with pytest.raises(catalogue.CatalogueError):
        sfc.plan_chain(bad, nodes)


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
