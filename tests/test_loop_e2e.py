"""The closed loop end to end on the multi-node lab (lab v2: core ══ edge1, edge2 ══ cpe1, cpe2),
every component real: Kafka broker, the store with its sink, the lab's namespaces and shaped
links, an XDP flow probe and a node agent on each edge (queues, probes, the gaming chain
mark → rate_limit → dpi on AF_XDP, an emulated power sysfs tree), the core's agent (HTB towards
each edge, the INT source) with the INT collector beside it, two analytics workers in one
consumer group with the trained classifier, one policy engine over mutual TLS driving every
agent, and the ONOS contract server (no ONOS runs here).

Faults, each a trial with fresh gaming flows, and a session joining late:
  * congestion on edge1's home link: the queues (the latency guard promotes the gaming flow);
  * an unresponsive ECT(1) flow into edge2's home: the queues (RFC 9957 queue protection);
  * edge1's dpi worker starved on its core (a SCHED_FIFO hog above it, in edge1's cgroup):
    function_overload → set_chain (Natif scale-out or CALVIN re-placement);
  * edge2's core 0 busy (a SCHED_FIFO hog below its worker): node_overload → set_power_policy
    (X-MAN, verified by reading the emulated tree back);
  * congestion on the core's link towards edge2, seen by INT: onos_flow_rule (the contract
    server validates and records it) and the core agent's own change of its queues;
  * a gaming session joining: classified, then a chain placement (LBLC) for it that the engine
    either applies and verifies or refuses with the overload guard's reason in the result.
Each agent reads its own node's share of the cores (the lab's cgroup per node,
`[cpu_accounting]`): on this one VM a hog is only its node's overload. Over the whole run: the
gaming traffic of both edges through the dpi function (its counters in the node samples), no
detection emitted twice by the two workers, the rows in ClickHouse, the dashboards' queries, and
nothing left behind once the lab is down. Needs root; ~5 min.

No timing is asserted beyond order (each lever within its fault): the suite must pass beside a
CPU hog; the benchmark (bench/loop) measures how fast.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

pytestmark = [
    pytest.mark.root,
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root (network namespaces, XDP, tc)"),
    pytest.mark.timeout(600),
]

from cgloop.config import Settings  # noqa: E402
from cgloop.dashboards.check import check_dashboards  # noqa: E402
from cgloop.lab import procs  # noqa: E402
from cgloop.lab.lab import Lab  # noqa: E402
from cgloop.lab.scenario import Scenario  # noqa: E402
from cgloop.lab.sessions import Ect1Spec  # noqa: E402
from cgloop.lab.topology import load_topology  # noqa: E402
from cgloop.loop.closed_loop import ClosedLoop, LoopOptions  # noqa: E402
from cgloop.loop.edge import DPI_CORE, DPI_RT_PRIORITY  # noqa: E402
from cgloop.loop.report import build_report  # noqa: E402
from cgloop.testing import data_missing, private_settings  # noqa: E402

SCENARIO = {
    "duration": 40,
    "traffic": [
        {"kind": "gaming", "platform": "gfn", "server": "gs1", "client": "cl1", "port": 49004},
        {"kind": "gaming", "platform": "xc", "server": "gs2", "client": "cl2", "port": 49006},
        # marked EF by its provider: in edge1's gaming class and its chain (dpi) from the start,
        # so the function-overload trial always has a gaming flow in the starved function's path
        {"kind": "gaming", "platform": "xc", "server": "gs2", "client": "cl1", "port": 49010,
         "dscp": 46},
        {"kind": "video_call", "a": "apps", "b": "home1"},
        {"kind": "gaming", "platform": "psn", "server": "gs1", "client": "cl2", "port": 49008,
         "at": 30},
    ],
    "faults": [
        {"kind": "congestion", "at": 2, "duration": 4, "flows": 4, "dst": "home1"},
        {"kind": "ect1_abuse", "at": 8, "duration": 4, "rate_mbit": 60, "dst": "home2"},
        # edge1's dpi worker starved on its core (SCHED_FIFO above it): function_overload
        {"kind": "cpu_hog", "at": 14, "duration": 4, "node": "edge1", "cores": [DPI_CORE],
         "realtime_priority": DPI_RT_PRIORITY + 10},
        # edge2's core 0 busy (SCHED_FIFO below its worker): node_overload
        {"kind": "cpu_hog", "at": 20, "duration": 4, "node": "edge2", "cores": [0],
         "realtime_priority": 1},
        {"kind": "core_congestion", "at": 26, "duration": 4, "flows": 4, "dst": "edge2"},
    ],
}
# Each fault and the late session: the lever that must act on it, on which node ("core": the
# core's agent; the ONOS device is the core's), and the detection that leads there.
LEVERS = {
    "congestion": ("reprioritise_flow", "edge1"),
    "ect1_abuse": ("queue_protection_sanction", "edge2"),
    "core_congestion": ("onos_flow_rule", "of:0000000000000001"),
    "cpu_hog@edge1": ("set_chain", "edge1"),
    "cpu_hog@edge2": ("set_power_policy", "edge2"),
    "session_join": ("set_chain", None),  # whichever node of its path LBLC chose
}
DETECTION = {
    "core_congestion": "queue_congestion",
    "cpu_hog@edge1": "function_overload",
    "cpu_hog@edge2": "node_overload",
}
# A lever whose policy's hold time may keep an earlier application in force through the trial
# (the VM's load overloads a node, and floods fill the core's queues, in other trials too):
# its hold time (loop/src/cgloop/loop/data/policies/levers.yaml: lab-node-overload-xman; the
# ONOS rule of lab-core-congestion-onos also lives 30 s, its timeout_s)
HELD = {"cpu_hog@edge2": 30.0, "core_congestion": 30.0}
OPERATIONS = {"set_power_policy": "ACTION_OPERATION_SET_POWER_POLICY",
              "onos_flow_rule": "ACTION_OPERATION_ONOS_FLOW_RULE"}
# Levers verified at least once over the run, in a trial or not (the core's set_class_rate is
# asserted in its trial: verified or rolled back by its verification).
REQUIRED = ("set_power_policy", "onos_flow_rule")
# What a guard writes in a result it refused or re-planned: the overload guard
# (cgloop.policy.capacity) and the policy's own (each trial's fresh sessions are placed once
# each, and the placement policy's hold time keeps a node from taking one chain after another).
GUARD_WORDS = ("guard overload", "guard admission", "do not fit", "re-planned", "guard hold_time",
               "guard budget", "guard in_flight")

ECT1_PORT = Ect1Spec().port  # the abuser's port unless the scenario names one

# The verdict the engine's first queue action on a fault must end with, where it acts.
# Anything but "improved" (not_checked: no probes read; no_effect: the queue stayed slow) is a
# failure. A known gap is listed so it cannot spread: the L4S demotion (to 1:30) expects the
# best-effort queue it leaves back under 20 ms, but verification reads the probes toward the
# demoted flow's own endpoints, and the lab's abuser runs between hosts nobody probes.
EXPECTED_VERDICT = {"congestion": "verified (improved)", "ect1_abuse": "verified (improved)"}
DEMOTION = "class_id=65584"  # 0x00010030
KNOWN_GAPS = {("ect1_abuse", DEMOTION): "verified (not_checked)"}


def expected_verdict(kind: str, action: str | None) -> str | None:
    for (gap_kind, gap_action), verdict in KNOWN_GAPS.items():
        if kind == gap_kind and gap_action in (action or ""):
            return verdict
    return EXPECTED_VERDICT[kind]


def refused_after_the_node(f) -> bool:
    """The engine's move of a gaming flow, refused because the node's guard had moved it."""
    return (
        f.verdict == "refused" and "class_id=65568" in (f.action or "")  # 0x00010020 gaming
        and f.first_promotion_ns is not None and f.first_promotion_ns <= (f.decision_ns or 0)
    )


def fault_key(f) -> str:
    """A fault's key in LEVERS: a CPU hog by its node (a function's core, a whole node)."""
    return f"{f.kind}@{f.target}" if f.kind == "cpu_hog" else f.kind


# Panels with no source in the lab: no RAPL power meter in the VM (the emulated tree has
# cpufreq and cpuidle only).
NO_SOURCE_IN_THE_LAB = {("cgloop-nodes", "Power")}


def verifications(store_url: str) -> str:
    """Every verification the engine recorded, to say why a verdict was not the expected one."""
    import clickhouse_connect

    rows = clickhouse_connect.get_client(dsn=store_url).query(
        "SELECT action_id, state, verdict, verification_detail, latency_after.samples "
        "FROM cgloop.action_results FINAL WHERE verdict != '' ORDER BY time"
    ).result_rows
    return "\n".join(" | ".join(str(c) for c in r) for r in rows)


@pytest.fixture(scope="module")
def loop_stack(tmp_path_factory: pytest.TempPathFactory):
    """The embedded stack WITH its Kafka→ClickHouse sink: the test reads the loop's rows."""
    from cgloop.stack.stack import Stack

    settings = private_settings(tmp_path_factory.mktemp("loop-stack"))
    stack = Stack(settings, sink=True)
    try:
        assert stack.up().healthy
        yield settings
    finally:
        stack.down()


def held_in_force(store_url: str, operation: str, node: str, onset_ns: int, end_ns: int,
                  hold_s: float) -> bool:
    """Whether an earlier `operation` on `node` (or ONOS device) was in force through
    [onset_ns, end_ns): the engine applied and verified it within `hold_s` before the onset,
    and refused every attempt of the window by that hold time ("guard hold_time")."""
    import clickhouse_connect

    client = clickhouse_connect.get_client(dsn=store_url)
    ends = client.query(
        "SELECT r.state, r.verdict, toUnixTimestamp64Nano(r.applied), r.message, "
        "toUnixTimestamp64Nano(a.time) FROM cgloop.actions AS a INNER JOIN (SELECT action_id, "
        "state, verdict, applied, message FROM cgloop.action_results FINAL) AS r "
        "ON r.action_id = a.id WHERE a.operation = {op:String} AND (a.target_node_id = "
        "{node:String} OR a.target_device_id = {node:String}) "
        "AND toUnixTimestamp64Nano(a.time) BETWEEN {lo:Int64} AND {hi:Int64}",
        parameters={"op": operation, "node": node, "lo": int(onset_ns - hold_s * 1e9),
                    "hi": int(end_ns)},
    ).result_rows
    before = [e for e in ends if e[4] < onset_ns]
    during = [e for e in ends if e[4] >= onset_ns]
    # verified: improved (X-MAN read back) or not checked (an ONOS rule the contract server
    # recorded: nothing in the lab forwards by it), never rolled back
    return any(state == "ACTION_STATE_VERIFIED"
               and verdict in ("VERDICT_IMPROVED", "VERDICT_NOT_CHECKED")
               for state, verdict, *_ in before) and bool(during) and all(
        state == "ACTION_STATE_REFUSED" and "guard hold_time" in message
        for state, _, _, message, _ in during)


def duplicate_detections(store_url: str, since_ns: int) -> int:
    """Detections emitted twice (same kind, detector, window and subject) since `since_ns`: two
    workers in one group must split the partitions, never both handle a record."""
    import clickhouse_connect

    return int(clickhouse_connect.get_client(dsn=store_url).query(
        "SELECT count() - uniqExact(kind, detector, window_start, window_end, flow_src_port, "
        "flow_dst_port, queue_node_id, queue_interface_name, queue_id, node_id, function_name) "
        "FROM cgloop.detections FINAL WHERE time >= fromUnixTimestamp64Nano({t:Int64})",
        parameters={"t": since_ns},
    ).result_rows[0][0])


def engine_actions(store_url: str, since_ns: int) -> list[tuple[str, str, str, str, str]]:
    """The engine's actions since `since_ns` as the store tells them (cgloop.loop_actions):
    (operation, node, final state, verdict, the result's message and verification detail)."""
    import clickhouse_connect

    rows = clickhouse_connect.get_client(dsn=store_url).query(
        "SELECT la.operation, la.target_node_id, la.final_state, la.verdict, "
        "concat(la.message, ' | ', d.detail) FROM cgloop.loop_actions AS la LEFT JOIN ("
        " SELECT action_id, argMax(verification_detail, time) AS detail"
        " FROM cgloop.action_results FINAL GROUP BY action_id) AS d ON d.action_id = la.action_id "
        "WHERE la.level != 'ACTION_LEVEL_NODE' "
        "AND la.decided_at >= fromUnixTimestamp64Nano({t:Int64}) ORDER BY la.decided_at",
        parameters={"t": since_ns},
    ).result_rows
    # the store keeps the enums' full names: ACTION_OPERATION_SET_CHAIN → set_chain
    return [(str(op).removeprefix("ACTION_OPERATION_").lower(), *map(str, rest))
            for op, *rest in rows]


def dpi_packets(store_url: str, since_ns: int) -> dict[str, int]:
    """Packets the dpi function (AF_XDP, user space) handled per node, from the node samples."""
    import clickhouse_connect

    return {str(node): int(n) for node, n in clickhouse_connect.get_client(dsn=store_url).query(
        "SELECT node_id, max(packets) FROM cgloop.node_functions WHERE function_name = 'dpi' "
        "AND time >= fromUnixTimestamp64Nano({t:Int64}) GROUP BY node_id",
        parameters={"t": since_ns},
    ).result_rows}


def written_since(tree: Path, since_ns: int) -> list[str]:
    """Files of an emulated sysfs tree the agent wrote after `since_ns`."""
    return sorted(
        str(f.relative_to(tree)) for f in tree.rglob("*")
        if f.is_file() and not f.is_symlink() and f.stat().st_mtime_ns > since_ns
    )


def test_closed_loop_end_to_end(loop_stack: Settings, tmp_path: Path) -> None:
    model = Settings().state_dir / "analytics" / "flow-classifier.skops"
    if not model.is_file():
        data_missing(f"no trained classifier at {model}: make setup trains it from the data")
    lab = Lab(load_topology(name=f"cgl-e2e-{os.getpid()}"), state_dir=tmp_path / "lab")
    scenario = Scenario.model_validate(SCENARIO)
    options = LoopOptions()
    closed = ClosedLoop(lab, scenario, loop_stack, tmp_path / "run", options)
    begun_ns = time.time_ns()
    try:
        lab.up()
        closed.start()
        started_ns = time.time_ns()
        trials = closed.run()
        onos = closed.onos_rules()
        report = build_report(
            loop_stack.store_http_url, tmp_path / "run",
            [(t.name, t.faults, t.packets) for t in trials],
            options.latency_slo_ms, closed.policy_source, "two-level loop",
            node=closed.node_ids, notes=closed.notes.lines, onos=onos,
        )
        # Every NOC dashboard panel, macros expanded as the Grafana plugin does, against the
        # rows this run wrote; only panels whose source the lab lacks may be empty. The range
        # starts on a whole minute, as an operator's "last N minutes" covers the per-minute
        # roll-ups' bucket of the run's first second.
        whole_minute = started_ns - started_ns % 60_000_000_000
        exempt = NO_SOURCE_IN_THE_LAB
        problems = [
            p for p in check_dashboards(loop_stack.store_http_url, whole_minute, time.time_ns())
            if (p.uid, p.panel) not in exempt
        ]
        duplicates = duplicate_detections(loop_stack.store_http_url, started_ns)
        actions = engine_actions(loop_stack.store_http_url, begun_ns)
        dpi = dpi_packets(loop_stack.store_http_url, begun_ns)
    finally:
        closed.stop()
        namespaces = lab.namespaces()
        lab.down()

    # lab down leaves nothing: no namespace, no process in them, no pinned maps, no state file
    left = [ns for ns in namespaces if procs.netns_path(ns).exists()]
    assert not left, f"namespaces left behind: {left}"
    pins = [rt.pin_dir for rt in closed.nodes.values() if rt.pin_dir and rt.pin_dir.exists()]
    assert not pins, f"{pins} left behind"
    assert lab.store.load() is None
    assert all(not s.alive() for s in closed.services.started)

    context = report.model_dump_json(indent=1)
    assert closed.int_export, f"the core's agent was no INT source: {report.notes}"
    assert not problems, "\n".join(f"{p.dashboard} / {p.panel}: {p.message}" for p in problems)
    assert report.gaming_flows_classified >= 1, context
    for kind in ("flow_records", "probe_records", "node_samples", "int_queue_records",
                 "detections", "actions", "action_results"):
        assert report.rows[kind] > 0, f"no rows in cgloop.{kind}: {report.rows}"
    # two analytics workers, one group: no detection twice
    assert duplicates == 0, f"{duplicates} detections emitted twice"
    by_key = {fault_key(f): f for f in report.faults}
    assert sorted(by_key) == sorted(LEVERS), sorted(by_key)

    # The queues, as before lab v2: the node's micro loop acted first on both floods, within
    # the fault (or the engine did, for a flow the guard had not been told to protect yet).
    congestion, abuse = by_key["congestion"], by_key["ect1_abuse"]
    gaming_port = str(SCENARIO["traffic"][0]["port"] + 100)
    for f in (congestion, abuse):
        if f.first_ns is not None:
            assert f.onset_ns <= f.first_ns <= f.end_ns, f.model_dump_json(indent=1)
    # (the first lever may be the core's: the flood's TCP slow start also queues there, and
    # INT sees it; what the gaming flow needs is its own queue on edge1)
    promoted = [s for _, op, s in congestion.node_actions if op == "reprioritise_flow"]
    engine_moved = [lv for lv in congestion.levers if lv.operation == "reprioritise_flow"]
    # Or the guard already held the flow in the gaming class at the onset (it promoted it in
    # the trial's lead, e.g. on a queue of a loaded machine's own making): its edge had done its
    # part, and what the flood's slow start queued on the core is the core's lever's (INT).
    # A flood that never took the gaming p99 past the SLO (a loaded machine's flood can start
    # slowly) leaves nothing to repair: no lever is demanded then.
    placed_before = any(gaming_port in s for s in congestion.node_placed_at_onset)
    assert not congestion.affected or any(gaming_port in s for s in promoted) or engine_moved or (
        placed_before), congestion.model_dump_json(indent=1)
    assert not congestion.affected or congestion.recovered_ns is not None, (
        congestion.model_dump_json(indent=1))
    abuser_port = str(SCENARIO["faults"][1].get("port", ECT1_PORT))
    sanctioned = [s for _, op, s in abuse.node_actions if op == "queue_protection_sanction"]
    assert abuse.first_sanction_ns is not None, abuse.model_dump_json(indent=1)
    assert any(abuser_port in s for s in sanctioned), (abuser_port, abuse.node_actions)
    # (The analytics' L4S detection is not asserted: behind lab v2's core router the abuser's
    # 4-packet bursts arrive spaced by the core's 200 Mbit/s shaper; the node's per-packet
    # protection above is the lever.)
    # (the engine's move of a flow on the other edge, on a latency breach of the loaded
    # machine's own making during the trial, is not the fault's and not judged here; nor a move
    # in a trial whose gaming p99 never crossed the SLO, or one the node's micro loop had acted
    # on first (CI: sanctions at 37 ms, the engine's move at 3.5 s found nothing left to improve))
    wrong = [
        (f.kind, f.action, f.verdict) for f in (congestion, abuse)
        if f.affected and f.first_level != "node" and f.action is not None
        and f.action.startswith("reprioritise_flow") and f.node == LEVERS[f.kind][1]
        and not refused_after_the_node(f) and f.verdict != expected_verdict(f.kind, f.action)
    ]
    assert not wrong, f"verdicts {wrong}, expected {EXPECTED_VERDICT} (gaps {KNOWN_GAPS}); " + (
        "the engine's checks:\n" + verifications(loop_stack.store_http_url))

    # The engine's levers: each fault's detection, then its lever on its node, applied within
    # the fault and verified.
    for key, detection in DETECTION.items():
        f = by_key[key]
        ctx = f.model_dump_json(indent=1)
        assert detection in [kind for _, kind, _ in f.detections], ctx
        op, node = LEVERS[key]
        acted = [lv for lv in f.levers if lv.operation == op and (node is None or lv.node == node)]
        if key in HELD and acted and not any(lv.applied_ns for lv in acted):
            # X-MAN's state stays until changed: a power policy the engine applied and read back
            # on this node within its hold time before the onset (the VM's load can overload a
            # node between trials) is in force during the fault, and the trial's own attempt
            # is refused by that hold time, which is the guard working
            assert held_in_force(loop_stack.store_http_url, OPERATIONS[op], node, f.onset_ns,
                                 int(f.end_ns + options.tail_s * 1e9), HELD[key]), (
                f"{key}: {op} refused and none in force: {ctx}")
            continue
        assert acted, f"{key}: no {op} on {node or 'a node'}: {ctx}"
        # judged: verified, or rolled back by its verification (on this 2-core VM a hog leaves
        # the loop one core, and a verdict over 2 s of it can read a re-placement as worse)
        verified = [lv for lv in acted if lv.verified or "rolled_back" in (lv.verdict or "")]
        assert verified, f"{key}: {op} {[lv.verdict for lv in acted]}; the engine's checks:\n" + (
            verifications(loop_stack.store_http_url))
        assert all(lv.applied_ns is not None and f.onset_ns - 1e9 <= lv.applied_ns <= (
            f.end_ns + options.tail_s * 1e9) for lv in verified), ctx
    # core congestion: ONOS's rule, and the core agent's own change of its queues
    # (its class cap applied and judged: verified, or rolled back by its verification; or the
    # core's own latency guard moved the gaming flow into the core's gaming class first. The
    # cap's verdict is weak evidence: it reads the edges' probes, which do not cross the core's
    # queue (docs/loop.md, "Limits"))
    core = by_key["core_congestion"]
    capped = [lv for lv in core.levers if lv.node == "core" and lv.operation == "set_class_rate"
              and lv.applied_ns is not None
              and (lv.verified or "rolled_back" in (lv.verdict or ""))]
    guarded = core.first_node == "core" and core.first_lever == "reprioritise_flow"
    assert capped or guarded, core.model_dump_json(indent=1)
    assert onos.get("flows", 0) + onos.get("intents", 0) >= 1, onos
    # the joining session (behind edge2): classified, and a chain placement decided for it on a
    # node of its path (its edge or the core), which either verified or was refused by the
    # overload guard with its reason (R_max, CALVIN's admission) in the result
    join = by_key["session_join"]
    assert "gaming_flow_classified" in [kind for _, kind, _ in join.detections], (
        join.model_dump_json(indent=1))
    placed = [a for a in actions if a[0] == "set_chain" and a[1] in ("edge2", "core")]
    assert placed, actions
    # (or rolled back by its verification: a placement that made the session's latency worse
    # is undone, as every action is; what must not happen is a placement the agent refused)
    assert all(
        v.startswith("VERDICT_IMPROVED") or "VERIFIED" in st or "ROLLED_BACK" in st
        or any(w in m for w in GUARD_WORDS)
        for _, _, st, v, m in placed
    ), placed
    # the gaming chain on both edges: the traffic went through dpi in user space
    assert all(dpi.get(edge, 0) > 0 for edge in ("edge1", "edge2")), dpi
    # X-MAN: set_power_policy verified by reading the state back, and its settings really
    # written to an edge's emulated tree
    power = [a for a in actions if a[0] == "set_power_policy"]
    assert any("VERIFIED" in st and "emulated" in m for _, _, st, _, m in power), power
    written = [w for edge in ("edge1", "edge2")
               for w in written_since(tmp_path / "run" / "sysfs" / edge, begun_ns)]
    assert any(w.endswith(("scaling_governor", "scaling_min_freq", "disable")) for w in written), (
        written)
    # every lever acted at least once and was verified (in a trial or not)
    verified_ops = {a[0] for a in actions if "VERIFIED" in a[2]}
    missing = [op for op in REQUIRED if op not in verified_ops]
    assert not missing, f"levers never verified: {missing}; engine actions {actions}"
