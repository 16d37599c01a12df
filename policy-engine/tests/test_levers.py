"""Every lever driven by the engine against the in-memory agent over gRPC (and the ONOS
contract server): the overload guard online, Natif scale-out / CALVIN re-placement, LBLC
placement of a new session, X-MAN verified by reading the state back, one INT congestion
detection acting through ONOS and the core's agent, and bad input failing before anything
changes, with the reason in the result."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from cgloop.policy import capacity, model
from cgloop.policy.actuators import NodeAgentActuator, OnosActuator, Router
from cgloop.policy.engine import Engine
from cgloop.policy.journal import Journal
from cgloop.policy.nodes import NodeBook
from cgloop.policy.telemetry import WindowStore
from cgloop.policy.testing import (
    AgentBounds,
    AgentServer,
    Fn,
    ManualClock,
    MemoryNodeAgent,
    classified,
    detection,
    hierarchy,
    node_samples,
    probes,
)
from cgloop.v1 import action_pb2 as apb
from cgloop.v1 import detection_pb2 as dpb
from cgloop.v1 import node_agent_pb2 as na
from cgloop.v1.detection_pb2 import QueueRef

MS = 1_000_000
S = 1_000_000_000

CHAIN = """
    chain_id: "{label:node_id}-gaming"
    traffic_class: gaming
    functions:
      - mark: {dscp: 46}
      - dpi: {depth: 64, hex: "00", mark_dscp: 46}
    processing_us: [0, 7]
    base_rtt_us: 190
"""

SCALE_OUT = f"""
id: scale-out
level: global
match: {{kinds: [function_overload], subject: function, labels: {{node_id: "*"}}}}
action:
  operation: set_chain
  target: {{node_id: "{{label:node_id}}"}}
  plan: {{planner: scale_out, function: "{{subject}}"}}
  parameters:{CHAIN}
  expect:
    metric: probe.p99_rtt_ns
    value: 20000000
    probe_dscp: 46
    within: 1s
    also: [function.busy_ratio, function.rx_dropped_per_s]
guards: {{hold_time: 0s}}
"""

PLACE = f"""
id: place
level: global
match: {{kinds: [gaming_flow_classified], severity_at_least: info, subject: flow}}
action:
  operation: set_chain
  target: {{node_id: "{{label:node_id}}"}}
  plan: {{planner: place, heuristic: HEURISTIC, candidates: ["{{label:node_id}}", core]}}
  parameters:{CHAIN}
guards: {{hold_time: 0s}}
"""

XMAN = """
id: xman
match: {kinds: [node_overload], subject: node}
action:
  operation: set_power_policy
  target: {node_id: "{subject}"}
  plan: {planner: xman}
  parameters: {cores: [0, 1], latency_critical: [1], min_frequency_khz: 1200000,
               max_frequency_khz: 3000000, xman_mode: load}
guards: {hold_time: 0s}
"""

CONGESTION = """
policies:
  - id: core-onos
    level: global
    match: {kinds: [queue_congestion], subject: queue, labels: {node_id: core}}
    action:
      operation: onos_flow_rule
      target: {device_id: "of:0000000000000001"}
      parameters: {priority: 40000, queue_id: 1, timeout_s: 30}
  - id: core-shape
    priority: 101
    match: {kinds: [queue_congestion], subject: queue, labels: {node_id: core}}
    action:
      operation: set_class_rate
      target: {node_id: core}
      parameters: {class_id: 0x10030, rate_bps: 100000000, ceil_bps: 150000000}
"""


def policy(text: str, **swap: str) -> model.Policy:
    for k, v in swap.items():
        text = text.replace(k, v)
    (p,) = model.parse_policies(text)
    return p


@pytest.fixture
def agents() -> Iterator[dict[str, AgentServer]]:
    """Two nodes (an edge and the core) with four cores each and a gaming class."""
    servers = {}
    for node in ("edge1", "core"):
        bounds = AgentBounds(online_cpus=[0, 1, 2, 3], cpuinfo_khz=(1_200_000, 3_000_000))
        agent = MemoryNodeAgent(node, bounds=bounds)
        agent.seed_hierarchy(hierarchy("veth0"))
        servers[node] = AgentServer(agent).__enter__()
    yield servers
    for s in servers.values():
        s.__exit__(None, None, None)


def engine_for(
    agents: dict[str, AgentServer],
    policies: list[model.Policy],
    clock: ManualClock,
    store: WindowStore | None = None,
    onos: OnosActuator | None = None,
) -> Engine:
    node = NodeAgentActuator({n: s.address for n, s in agents.items()})
    return Engine(
        policies,
        Router(node, onos=onos),
        telemetry=store,
        journal=Journal(None),
        clock=clock,
        nodes=NodeBook(),
    )


def states(events: list[apb.ActionEvent]) -> list[str]:
    return [
        f"action:{apb.ActionState.Name(e.action.state).removeprefix('ACTION_STATE_')}"
        if e.WhichOneof("event") == "action"
        else apb.ActionState.Name(e.result.state).removeprefix("ACTION_STATE_")
        for e in events
    ]


def overloaded(now: int, node: str = "edge1", function: str = "dpi") -> dpb.Detection:
    return detection(
        now,
        kind=dpb.DETECTION_KIND_FUNCTION_OVERLOAD,
        function_name=function,
        labels={"node_id": node},
    )


# A dpi instance on core 1 at 90 kpps, 90 % busy: t_CPU 10 µs, R_max 100 kpps on an idle core,
# so 80 % of it (72-76 kpps on cores with a little other load) is below its load: two
# instances.
HOT = dict(cores={0: 0.10, 1: 0.95, 2: 0.60, 3: 0.30}, functions=(Fn("dpi", 1, 90_000, 0.9),))


# --- the node samples and the R_max model -------------------------------------------------


def test_the_node_book_reads_rates_busy_ratio_and_drops_from_the_counters() -> None:
    book = NodeBook()
    book.ingest(node_samples("edge1", 10 * S, {0: 0.2, 1: 0.9}, (Fn("dpi", 1, 5_000, 0.5, 40),)))
    load = book.load("edge1")
    assert load is not None and load.cores == {0: 0.2, 1: 0.9}
    (dpi,) = load.of("dpi")
    assert (dpi.core, dpi.pps, dpi.busy_ratio, dpi.rx_dropped_per_s) == (1, 5_000, 0.5, 40)
    assert dpi.t_cpu_s == pytest.approx(100e-6)
    assert book.read("function.busy_ratio", "edge1", ["dpi"], 0, 11 * S) == (0.5, 2)
    assert book.read("function.rx_dropped_per_s", "edge1", ["dpi"], 0, 11 * S) == (40, 2)
    assert book.read("function.busy_ratio", "edge1", ["dpi"], 10 * S, 11 * S) is None  # one
    assert book.load("edge2") is None
    with pytest.raises(ValueError, match="unknown metric"):
        book.read("function.nope", "edge1", ["dpi"], 0, S)


def test_fit_scales_out_onto_the_least_loaded_cores() -> None:
    book = NodeBook()
    book.ingest(node_samples("edge1", 10 * S, **HOT))
    load = book.load("edge1")
    assert load is not None
    f = capacity.fit(load, "dpi", min_instances=2)
    # Core 1 keeps an instance (its other load is 5 %), core 0 (10 %) gets the second.
    assert (f.instances, f.cores) == (2, (1, 0))
    assert "45000 pps each" in f.describe()


def test_fit_moves_the_function_off_a_hogged_core_when_no_scale_out_fits() -> None:
    book = NodeBook()
    # A CPU hog on core 1 (100 % busy, dpi 15 % of it): 85 % other load, past the margin.
    book.ingest(node_samples("edge1", 10 * S, {0: 0.2, 1: 1.0}, (Fn("dpi", 1, 10_000, 0.15),)))
    load = book.load("edge1")
    assert load is not None
    f = capacity.fit(load, "dpi", min_instances=2)
    assert (f.instances, f.cores) == (1, (0,))
    book.ingest(node_samples("edge1", 12 * S, {0: 0.95, 1: 1.0}, (Fn("dpi", 1, 10_000, 0.15),)))
    load = book.load("edge1")
    assert load is not None
    with pytest.raises(capacity.NoCapacity, match="busy with other work"):
        capacity.fit(load, "dpi", min_instances=2)


# --- function_overload -> set_chain --------------------------------------------------------


def test_function_overload_scales_the_function_out_and_verifies_probes_and_counters(
    agents: dict[str, AgentServer],
) -> None:
    clock = ManualClock()
    store = WindowStore()
    engine = engine_for(agents, [policy(SCALE_OUT)], clock, store)
    engine.observe_nodes(node_samples("edge1", clock(), **HOT))
    events = engine.handle(dpb.DetectionBatch(records=[overloaded(clock())]))
    assert states(events) == ["action:PROPOSED", "APPLIED"], events
    assert events[1].result.message.startswith("planned scale-out: dpi: 2 instance(s)")
    dpi = agents["edge1"].agent.state.chains["gaming"].functions[1]
    assert (dpi.instances, list(dpi.instance_cores), dpi.core) == (2, [1, 0], 1)
    assert dpi.kind == na.FUNCTION_KIND_ADVANCED
    applied = events[1].result.applied_ns
    # After: the gaming probes (EF) under the objective, busy ratios down, no new drops; the
    # best-effort probes (DSCP 0) are not the expectation's.
    store.ingest_probes(probes(applied, applied + S, 8 * MS, dscp=46, source_id="edge1/agent"))
    store.ingest_probes(probes(applied, applied + S, 90 * MS, dscp=0, source_id="edge1/agent"))
    after = (Fn("dpi", 1, 45_000, 0.45), Fn("dpi", 0, 45_000, 0.45, instance=1))
    engine.observe_nodes(
        node_samples("edge1", applied + 900 * MS, HOT["cores"], after, count=3, interval_s=0.4)
    )
    clock.now_ns = applied + 2 * S
    engine.tick()
    (verified,) = engine.drain()
    assert verified.result.state == apb.ACTION_STATE_VERIFIED
    v = verified.result.verification
    assert v.verdict == apb.VERDICT_IMPROVED, v.detail
    assert v.after_value == 8 * MS
    assert "function.busy_ratio 0.45" in v.detail and "function.rx_dropped_per_s 0" in v.detail


def scaled_out(agents: dict[str, AgentServer]) -> tuple[ManualClock, WindowStore, Engine, int]:
    """An engine that has just scaled dpi out on edge1: (clock, store, engine, applied_ns)."""
    clock = ManualClock()
    store = WindowStore()
    engine = engine_for(agents, [policy(SCALE_OUT)], clock, store)
    engine.observe_nodes(node_samples("edge1", clock(), **HOT))
    events = engine.handle(dpb.DetectionBatch(records=[overloaded(clock())]))
    return clock, store, engine, events[1].result.applied_ns


def test_counters_still_rising_make_the_scale_out_no_effect(
    agents: dict[str, AgentServer],
) -> None:
    clock, store, engine, applied = scaled_out(agents)
    store.ingest_probes(probes(applied, applied + S, 8 * MS, dscp=46, source_id="edge1/agent"))
    dropping = (Fn("dpi", 1, 45_000, 0.95, rx_dropped_per_s=500),)
    engine.observe_nodes(
        node_samples("edge1", applied + 900 * MS, HOT["cores"], dropping, count=3, interval_s=0.4)
    )
    clock.now_ns = applied + 2 * S
    engine.tick()
    (verified,) = engine.drain()
    v = verified.result.verification
    assert v.verdict == apb.VERDICT_NO_EFFECT, v.detail
    assert "function.rx_dropped_per_s 500 (must not rise)" in v.detail


@pytest.mark.parametrize("keeping_up", [True, False])
def test_a_chain_whose_functions_keep_up_is_not_rolled_back_for_slower_probes(
    agents: dict[str, AgentServer], keeping_up: bool
) -> None:
    """The probes read worse after the scale-out (the hog that overloaded dpi slows the whole
    shared machine): with the functions' counters healthy the change stays (no_effect); with
    them still failing it is rolled back as worse."""
    clock, store, engine, applied = scaled_out(agents)
    store.ingest_probes(probes(applied - S, applied, 8 * MS, dscp=46, source_id="edge1/agent"))
    store.ingest_probes(probes(applied, applied + S, 90 * MS, dscp=46, source_id="edge1/agent"))
    after = ((Fn("dpi", 1, 45_000, 0.45), Fn("dpi", 0, 45_000, 0.45, instance=1)) if keeping_up
             else (Fn("dpi", 1, 45_000, 0.95, rx_dropped_per_s=500),))
    engine.observe_nodes(
        node_samples("edge1", applied + 900 * MS, HOT["cores"], after, count=3, interval_s=0.4)
    )
    clock.now_ns = applied + 2 * S
    engine.tick()
    ends = engine.drain()
    if keeping_up:
        (verified,) = ends
        assert verified.result.state == apb.ACTION_STATE_VERIFIED
        v = verified.result.verification
        assert v.verdict == apb.VERDICT_NO_EFFECT, v.detail
        assert "the functions keep up" in v.detail
    else:
        assert apb.ACTION_STATE_ROLLED_BACK in [e.result.state for e in ends if e.result], ends


def test_a_starved_instance_s_core_is_left_out_of_the_scale_out(
    agents: dict[str, AgentServer],
) -> None:
    """The hog's first sample still shows core 1 idle (dpi starved reads idle too): a scale-out
    from the samples alone would keep an instance there. The detection's evidence says the
    instance on core 1 stalled with frames waiting, so dpi goes to another core only."""
    from cgloop.policy.planning import starved_core
    from cgloop.v1.detection_pb2 import Evidence

    clock = ManualClock()
    engine = engine_for(agents, [policy(SCALE_OUT)], clock, WindowStore())
    quiet = dict(cores={0: 0.10, 1: 0.05, 2: 0.60, 3: 0.30}, functions=(Fn("dpi", 1, 90_000, 0.9),))
    engine.observe_nodes(node_samples("edge1", clock(), **quiet))
    det = overloaded(clock())
    det.labels["core"] = "1"
    det.evidence.extend([Evidence(name="stalled_ns", value=120e6, threshold=50e6, unit="ns"),
                         Evidence(name="rx_waiting", value=300, unit="packets")])
    assert starved_core(det) == 1
    events = engine.handle(dpb.DetectionBatch(records=[det]))
    assert states(events) == ["action:PROPOSED", "APPLIED"], events
    dpi = agents["edge1"].agent.state.chains["gaming"].functions[1]
    cores = list(dpi.instance_cores) or [dpi.core]
    assert 1 not in cores and cores, cores
    # below the detector's threshold, without frames waiting, or on core 0 ("not pinned"): none
    for stalled, waiting, core in ((40e6, 300, "1"), (120e6, 0, "1"), (120e6, 300, "0")):
        d = overloaded(clock())
        d.labels["core"] = core
        d.evidence.extend([Evidence(name="stalled_ns", value=stalled, threshold=50e6),
                           Evidence(name="rx_waiting", value=waiting)])
        assert starved_core(d) is None


def test_the_overload_guard_re_plans_a_chain_onto_a_free_core(
    agents: dict[str, AgentServer],
) -> None:
    """A policy without a planner asks for dpi on core 1, which a CPU hog holds: the guard
    moves it to the free core and says so in the result."""
    clock = ManualClock()
    fixed = SCALE_OUT.replace('  plan: {planner: scale_out, function: "{subject}"}\n', "")
    fixed = fixed.replace("base_rtt_us: 190", "base_rtt_us: 190\n    free_cores: [1, 0]")
    engine = engine_for(agents, [policy(fixed)], clock)
    engine.observe_nodes(
        node_samples("edge1", clock(), {0: 0.2, 1: 1.0}, (Fn("dpi", 1, 10_000, 0.15),))
    )
    events = engine.handle(dpb.DetectionBatch(records=[overloaded(clock())]))
    assert states(events)[:2] == ["action:PROPOSED", "APPLIED"]
    assert "re-planned (core 1 is 85% busy with other work" in events[1].result.message
    assert agents["edge1"].agent.state.chains["gaming"].functions[1].core == 0
    assert engine.stats.replanned == 1


def test_the_overload_guard_refuses_what_no_placement_keeps_under_r_max(
    agents: dict[str, AgentServer],
) -> None:
    clock = ManualClock()
    engine = engine_for(agents, [policy(SCALE_OUT)], clock)
    engine.observe_nodes(
        node_samples("edge1", clock(), {0: 0.97, 1: 1.0}, (Fn("dpi", 1, 10_000, 0.15),))
    )
    events = engine.handle(dpb.DetectionBatch(records=[overloaded(clock())]))
    assert states(events) == ["action:REFUSED", "REFUSED"]
    message = events[1].result.message
    assert message.startswith("guard overload: dpi on edge1:") and "core 0 is 97%" in message
    assert "gaming" not in agents["edge1"].agent.state.chains  # nothing sent


# --- a new session's chain placed by LB / LC / LBLC --------------------------------------


def test_a_new_session_gets_its_chain_on_the_node_the_heuristic_picks(
    agents: dict[str, AgentServer],
) -> None:
    clock = ManualClock()
    engine = engine_for(agents, [policy(PLACE, HEURISTIC="lb")], clock)
    # The edge is busy (mean 75 %, one core free), the core router idle.
    engine.observe_nodes(node_samples("edge1", clock(), {0: 0.7, 1: 0.9, 2: 0.7, 3: 0.7}))
    engine.observe_nodes(node_samples("core", clock(), {0: 0.1, 1: 0.1, 2: 0.1, 3: 0.1}))
    session = classified(clock(), node_id="edge1")
    events = engine.handle(dpb.DetectionBatch(records=[session]))
    assert states(events)[:2] == ["action:PROPOSED", "APPLIED"]
    assert events[0].action.target.node_id == "core"
    assert events[1].result.message.startswith("placed by LB on core: candidates edge1")
    assert "gaming" in agents["core"].agent.state.chains
    assert "gaming" not in agents["edge1"].agent.state.chains
    # The classifier sees the session again: placed once.
    clock.advance(0.5)
    assert engine.handle(dpb.DetectionBatch(records=[classified(clock(), node_id="edge1")])) == []
    assert engine.stats.plan_skipped == 1
    # Another session is placed on its own.
    other = classified(clock(), port=40002, node_id="edge1")
    assert states(engine.handle(dpb.DetectionBatch(records=[other])))[:2] == [
        "action:PROPOSED", "APPLIED",
    ]


def test_lc_keeps_the_chain_on_the_sessions_edge(agents: dict[str, AgentServer]) -> None:
    clock = ManualClock()
    engine = engine_for(agents, [policy(PLACE, HEURISTIC="lc")], clock)
    engine.observe_nodes(node_samples("edge1", clock(), {0: 0.5, 1: 0.2, 2: 0.5, 3: 0.5}))
    engine.observe_nodes(node_samples("core", clock(), {0: 0.1, 1: 0.1, 2: 0.1, 3: 0.1}))
    events = engine.handle(dpb.DetectionBatch(records=[classified(clock(), node_id="edge1")]))
    assert events[0].action.target.node_id == "edge1"
    # on the edge's least-loaded core
    assert agents["edge1"].agent.state.chains["gaming"].functions[1].core == 1


# --- node_overload -> X-MAN, read back --------------------------------------------------


def test_node_overload_pins_the_function_cores_and_reads_the_state_back(
    agents: dict[str, AgentServer],
) -> None:
    clock = ManualClock()
    engine = engine_for(agents, [policy(XMAN)], clock)
    engine.observe_nodes(
        node_samples(
            "edge1", clock(), {0: 0.9, 1: 0.95, 2: 0.9, 3: 0.9}, (Fn("dpi", 2, 1_000, 0.3),),
            frequency_khz=(1_200_000, 2_700_000),
        )
    )
    det = detection(clock(), kind=dpb.DETECTION_KIND_NODE_OVERLOAD, node_id="edge1")
    events = engine.handle(dpb.DetectionBatch(records=[det]))
    assert states(events) == ["action:PROPOSED", "APPLIED", "VERIFIED"]
    s = events[0].action.set_power_policy
    # The planner's, from the samples: every core, dpi's core latency-critical, the range.
    assert (list(s.cores), list(s.latency_critical)) == ([0, 1, 2, 3], [2])
    assert (s.min_frequency_khz, s.max_frequency_khz) == (1_200_000, 2_700_000)
    assert events[1].result.message.startswith("planned X-MAN on cores 0,1,2,3")
    v = events[2].result.verification
    assert v.metric == "agent.power_state" and v.verdict == apb.VERDICT_IMPROVED, v.detail
    assert v.after_value == 1.0
    assert "4/4 cores as set" in v.detail and "C-states off" in v.detail
    pinned = agents["edge1"].agent.state.power[2]
    assert pinned.forbid_cstates and pinned.min_frequency_khz == pinned.max_frequency_khz


def test_a_read_back_that_differs_is_no_effect(agents: dict[str, AgentServer]) -> None:
    """The agent reports a core other than it was set (a governor or driver overriding it)."""
    clock = ManualClock()

    class Overridden(MemoryNodeAgent):
        def GetPowerState(self, request, context):
            resp = super().GetPowerState(request, context)
            for c in resp.cores:
                if c.core == 2:
                    c.min_frequency_khz, c.max_frequency_khz = 1_200_000, 1_800_000
            return resp

    bounds = AgentBounds(online_cpus=[0, 1, 2, 3], cpuinfo_khz=(1_200_000, 3_000_000))
    agents["edge1"].__exit__(None, None, None)
    agents["edge1"] = AgentServer(Overridden("edge1", bounds=bounds)).__enter__()
    engine = engine_for(agents, [policy(XMAN)], clock)
    engine.observe_nodes(
        node_samples("edge1", clock(), {0: 0.9, 1: 0.9, 2: 0.9, 3: 0.9}, (Fn("dpi", 2, 1, 0.3),))
    )
    det = detection(clock(), kind=dpb.DETECTION_KIND_NODE_OVERLOAD, node_id="edge1")
    events = engine.handle(dpb.DetectionBatch(records=[det]))
    v = events[2].result.verification
    assert v.verdict == apb.VERDICT_NO_EFFECT
    assert "core 2: limits 1200000..1800000 kHz, set 3000000..3000000" in v.detail


# --- INT congestion on the core: ONOS and the core's agent ----------------------------------


def test_one_int_congestion_detection_acts_through_onos_and_the_core_agent(
    agents: dict[str, AgentServer],
) -> None:
    onos = pytest.importorskip("cgloop.actuators.onos")
    from cgloop.actuators.onos.contract import OnosContractServer

    clock = ManualClock()
    with OnosContractServer() as server:
        server.add_device("of:0000000000000001")
        client = onos.OnosClient(onos.OnosSettings(url=server.url))
        engine = engine_for(
            agents, model.parse_policies(CONGESTION), clock, onos=OnosActuator(client)
        )
        det = detection(
            clock(),
            kind=dpb.DETECTION_KIND_QUEUE_CONGESTION,
            queue=QueueRef(node_id="1", interface_name="veth0", queue_id=0x10030),
            labels={"node_id": "core"},
        )
        events = engine.handle(dpb.DetectionBatch(records=[det]))
        assert sorted(states(events)) == sorted(
            ["action:PROPOSED", "action:PROPOSED", "APPLIED", "APPLIED", "VERIFIED", "VERIFIED"]
        ), [e.result.message for e in events if e.WhichOneof("event") == "result"]
        # ONOS (the contract server) recorded the rule on the core device ...
        (rule,) = server.state.flows.values()
        assert rule["deviceId"] == "of:0000000000000001"
        assert rule["treatment"]["instructions"][0] == {"type": "QUEUE", "queueId": 1}
        # ... and the core's agent capped the flood's class on the congested interface.
        (cls,) = [
            c
            for c in agents["core"].agent.state.hierarchies["veth0"].classes
            if c.class_id == 0x10030
        ]
        assert (cls.rate_bps, cls.ceil_bps) == (100_000_000, 150_000_000)
        client.close()


# --- bad input: refused before anything changes, the reason in the result ---------------------


def test_an_out_of_range_power_setting_fails_before_any_core_changes(
    agents: dict[str, AgentServer],
) -> None:
    """Two core groups: the agent would take the first and refuse the second; the engine's
    dry run of every group first leaves all of them as they were."""
    clock = ManualClock()
    bad = XMAN.replace("  plan: {planner: xman}\n", "").replace(
        "min_frequency_khz: 1200000", "min_frequency_khz: 800000"
    )
    engine = engine_for(agents, [policy(bad)], clock)
    det = detection(clock(), kind=dpb.DETECTION_KIND_NODE_OVERLOAD, node_id="edge1")
    events = engine.handle(dpb.DetectionBatch(records=[det]))
    assert states(events) == ["action:PROPOSED", "FAILED"]
    message = events[1].result.message
    assert "INVALID_ARGUMENT" in message and "limits 800000..3000000 kHz outside" in message
    assert "the allowed 1200000..3000000 kHz" in message
    assert agents["edge1"].agent.state.power == {}


def test_no_capacity_and_unknown_functions_are_refused_with_the_reason(
    agents: dict[str, AgentServer],
) -> None:
    clock = ManualClock()
    # More instances than the node has free cores: the planner refuses before sending.
    many = policy(SCALE_OUT.replace("function: ", "min_instances: 5, function: "))
    engine = engine_for(agents, [many], clock)
    engine.observe_nodes(node_samples("edge1", clock(), **HOT))
    events = engine.handle(dpb.DetectionBatch(records=[overloaded(clock())]))
    assert states(events) == ["action:REFUSED", "REFUSED"]
    assert "5 instances asked, at most 4" in events[1].result.message
    # A function the detection names that the chain does not run as a user-space function.
    events = engine.handle(dpb.DetectionBatch(records=[overloaded(clock(), function="mark")]))
    assert "function 'mark' is not an advanced function" in events[1].result.message
    assert "gaming" not in agents["edge1"].agent.state.chains
    # A function outside the catalogue never loads.
    with pytest.raises(model.PolicyError, match="does not take this parameter"):
        policy(SCALE_OUT.replace("- mark: {dscp: 46}", "- nat: {}"))
    # CALVIN's admission: a user-space function over its 20 µs budget is refused, unsent.
    slow = policy(SCALE_OUT.replace("processing_us: [0, 7]", "processing_us: [0, 30]"))
    engine = engine_for(agents, [slow], clock)
    engine.observe_nodes(node_samples("edge1", clock(), **HOT))
    events = engine.handle(dpb.DetectionBatch(records=[overloaded(clock())]))
    assert states(events) == ["action:REFUSED", "REFUSED"]
    assert "CALVIN admission refused" in events[1].result.message
    assert "exceeds the 20 us advanced-function budget" in events[1].result.message


def test_plans_are_validated_with_the_policy() -> None:
    with pytest.raises(model.PolicyError, match="planner place needs candidates"):
        policy(PLACE.replace(', candidates: ["{label:node_id}", core]', ""), HEURISTIC="lb")
    with pytest.raises(model.PolicyError, match="fills in set_chain, not set_power_policy"):
        policy(XMAN.replace("{planner: xman}", "{planner: scale_out}"))
    with pytest.raises(model.PolicyError, match="function counters verify set_chain only"):
        policy(
            XMAN.replace(
                "guards:",
                "  expect: {metric: probe.p99_rtt_ns, value: 1, also: [function.busy_ratio]}\n"
                "guards:",
            )
        )


# --- the feed: node samples reach the engine's book -----------------------------------------


def test_the_telemetry_feed_reads_the_nodes_topic_into_the_book(monkeypatch) -> None:
    import threading

    from cgloop.bus import kafka
    from cgloop.bus.topics import FLOWS, NODES, PROBES
    from cgloop.policy.telemetry import KafkaTelemetryFeed

    delivered = threading.Event()

    class Consumer:
        def __init__(self, bootstrap, group, topics, **kw) -> None:
            self.topics = topics
            self.items = [(NODES, node_samples("edge1", 10 * S, {0: 0.5, 1: 0.25}), None)]

        def poll(self, timeout):
            if self.items:
                return self.items.pop()
            delivered.set()
            return None

        def close(self) -> None:
            pass

    monkeypatch.setattr(kafka, "BatchConsumer", Consumer)
    book = NodeBook()
    feed = KafkaTelemetryFeed("kafka:9092", WindowStore(), nodes=book)
    assert feed._consumer.topics == [PROBES.name, FLOWS.name, NODES.name]
    feed.start()
    assert delivered.wait(5)
    feed.stop()
    load = book.load("edge1")
    assert load is not None and load.cores == {0: 0.5, 1: 0.25}
    # The guard's feed alone (verification off) reads only the nodes topic.
    assert KafkaTelemetryFeed("k", None, nodes=NodeBook())._consumer.topics == [NODES.name]
    with pytest.raises(ValueError, match="needs a store or a node book"):
        KafkaTelemetryFeed("k", None)


def test_the_power_read_back_says_when_the_agents_tree_is_emulated():
    from cgloop.policy.verify import judge_power
    from cgloop.v1 import node_agent_pb2 as na
    from cgloop.v1 import node_pb2

    policy = na.PowerPolicy(cores=[1], min_frequency_khz=3_000_000, max_frequency_khz=3_000_000)
    core = node_pb2.CoreSample(core=1, min_frequency_khz=3_000_000, max_frequency_khz=3_000_000)
    real = judge_power([policy], na.GetPowerStateResponse(cores=[core]))
    lab = judge_power([policy], na.GetPowerStateResponse(cores=[core], emulated=True))
    assert "emulated" not in real.detail
    assert "emulated" in lab.detail and lab.verdict == real.verdict


def test_one_function_on_two_nodes_is_two_subjects_and_its_instances_one():
    from cgloop.policy.detections import subject_key

    def overload(node: str, instance: str) -> dpb.Detection:
        d = dpb.Detection(function_name="dpi")
        d.labels.update({"node_id": node, "instance": instance})
        return d

    assert subject_key(overload("edge1", "0")) != subject_key(overload("edge2", "0"))
    assert subject_key(overload("edge1", "0")) == subject_key(overload("edge1", "1"))
