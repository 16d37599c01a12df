"""The closed loop end to end, every component real: Kafka broker, the store with its sink, the
lab's namespaces and HTB bottleneck, the XDP flow probe and the node agent on the edge, the
analytics worker with the trained classifier, the policy engine over mutual TLS.

Two faults, each a trial with fresh gaming flows: congestion (bulk TCP through the bottleneck)
and an unresponsive ECT(1) flow. Both loop levels run: the agent's micro loop (1 ms queue
monitor, RFC 9957 queue protection of the L4S class, the latency guard of the flows the engine
protects) and the global loop. Asserts that the gaming flows were classified and protected,
that the node acted first on each fault (congestion: the guard promoted the gaming flow; the
ECT(1) flood: queue protection sanctioned the abuser) and told the global loop through its
action records, that whatever the engine did verified as expected, that the rows are in
ClickHouse, and that taking the lab down leaves nothing behind. Needs root; ~3 min.

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
    pytest.mark.timeout(300),
]

from cgloop.config import Settings  # noqa: E402
from cgloop.dashboards.check import check_dashboards  # noqa: E402
from cgloop.lab import procs  # noqa: E402
from cgloop.lab.lab import Lab  # noqa: E402
from cgloop.lab.scenario import Scenario  # noqa: E402
from cgloop.lab.sessions import Ect1Spec  # noqa: E402
from cgloop.lab.topology import load_topology  # noqa: E402
from cgloop.loop.closed_loop import ClosedLoop, LoopOptions  # noqa: E402
from cgloop.loop.report import build_report  # noqa: E402
from cgloop.testing import data_missing, private_settings  # noqa: E402

SCENARIO = {
    "duration": 30,
    "traffic": [
        {"kind": "gaming", "platform": "gfn", "server": "gs1", "client": "cl1", "port": 49004},
        {"kind": "video_call", "a": "apps", "b": "home"},
    ],
    "faults": [
        {"kind": "congestion", "at": 5, "duration": 8, "flows": 4},
        {"kind": "ect1_abuse", "at": 20, "duration": 8, "rate_mbit": 60},
    ],
}

ECT1_PORT = Ect1Spec().port  # the abuser's port unless the scenario names one

# The verdict the engine's first action on a fault must end with, where it acts (docs/loop.md,
# "What a run looks like"). Where the engine acts, the repair is verified by the probes of the
# queue it concerns: anything but "improved" (not_checked: no probes read; no_effect: the queue
# stayed slow) is a failure.
# Documented exceptions are listed, not tolerated silently: a rate cap below the gaming demand
# is beyond moving flows between queues, and the engine must roll the move back; 8 % loss does
# not affect the gaming flow enough for any action (its verdict is None).
EXPECTED_VERDICT = {
    "congestion": "verified (improved)",  # gaming flow moved to 1:20
    "ect1_abuse": "verified (improved)",  # the gaming flow moved to 1:20
    "rate_cap": "rolled_back (worse)",
    "loss": None,
}
# A known gap, listed so it cannot spread: the L4S demotion (to 1:30) expects the best-effort
# queue it leaves back under 20 ms, but verification reads the probes toward the demoted
# flow's own endpoints, and the lab's abuser (apps -> home) runs between hosts nobody probes.
# Until verification reads the probes of the queue a flow left, that action ends not_checked.
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


# Panels with no source in the lab: it has no INT switch, and no component produces node
# samples (CPU frequency, power) yet; both are filled by their own tests' records
# (dashboards/tests).
NO_SOURCE_IN_THE_LAB = {
    ("cgloop-flow", "End-to-end latency percentiles (INT)"),
    ("cgloop-flow", "Latency CDF (INT, 0.1 ms steps)"),
    ("cgloop-flow", "Worst 20 latency events over time (INT)"),
    ("cgloop-flow", "Worst 20 latency events"),
    ("cgloop-nodes", "variable node"),
    ("cgloop-nodes", "Queue delay (INT)"),
    ("cgloop-nodes", "Queue occupancy (INT)"),
    ("cgloop-nodes", "CPU frequency per core"),
    ("cgloop-nodes", "Core utilisation"),
    ("cgloop-nodes", "Power"),
    ("cgloop-nodes", "Packet functions"),
}


def verifications(store_url: str) -> str:
    """Every verification the engine recorded, to say why a verdict was not the expected one."""
    import clickhouse_connect

    rows = clickhouse_connect.get_client(dsn=store_url).query(
        "SELECT action_id, state, verdict, verification_detail, latency_after.samples "
        "FROM cgloop.action_results FINAL WHERE verdict != '' ORDER BY time"
    ).result_rows
    return "\n".join(" | ".join(str(c) for c in r) for r in rows)


def protected_since(store_url: str, port: int) -> int | None:
    """When the engine's first protection of the flow on `port` was applied, ns (None: never)."""
    import clickhouse_connect

    rows = clickhouse_connect.get_client(dsn=store_url).query(
        "SELECT min(toUnixTimestamp64Nano(r.applied)) FROM cgloop.actions AS a FINAL "
        "INNER JOIN cgloop.action_results AS r FINAL ON r.action_id = a.id "
        "WHERE a.operation = 'ACTION_OPERATION_PROTECT_FLOW' "
        "AND r.state = 'ACTION_STATE_APPLIED' "
        f"AND (a.target_flow_src_port = {int(port)} OR a.target_flow_dst_port = {int(port)})"
    ).result_rows
    first = rows[0][0] if rows else None
    return int(first) if first else None


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


def test_closed_loop_end_to_end(loop_stack: Settings, tmp_path: Path) -> None:
    model = Settings().state_dir / "analytics" / "flow-classifier.skops"
    if not model.is_file():
        data_missing(f"no trained classifier at {model}: make setup trains it from the data")
    lab = Lab(load_topology(name=f"cgl-e2e-{os.getpid()}"), state_dir=tmp_path / "lab")
    scenario = Scenario.model_validate(SCENARIO)
    options = LoopOptions()
    closed = ClosedLoop(lab, scenario, loop_stack, tmp_path / "run", options)
    try:
        lab.up()
        closed.start()
        started_ns = time.time_ns()
        trials = closed.run()
        report = build_report(
            loop_stack.store_http_url, tmp_path / "run",
            [(t.name, t.report.faults, t.packets) for t in trials],
            options.latency_slo_ms, closed.policy_source, "two-level loop",
            node=closed.plan.node,
        )
        # Every NOC dashboard panel, macros expanded as the Grafana plugin does, against the
        # rows this run wrote; only panels whose source the lab lacks may be empty. The range
        # starts on a whole minute, as an operator's "last N minutes" covers the per-minute
        # roll-ups' bucket of the run's first second.
        whole_minute = started_ns - started_ns % 60_000_000_000
        problems = [
            p for p in check_dashboards(loop_stack.store_http_url, whole_minute, time.time_ns())
            if (p.uid, p.panel) not in NO_SOURCE_IN_THE_LAB
        ]
    finally:
        closed.stop()
        namespaces = lab.namespaces()
        lab.down()

    # lab down leaves nothing: no namespace, no process in them, no pinned maps, no state file
    left = [ns for ns in namespaces if procs.netns_path(ns).exists()]
    assert not left, f"namespaces left behind: {left}"
    assert not closed.pin_dir.exists(), f"{closed.pin_dir} left behind"
    assert lab.store.load() is None
    assert all(not s.alive() for s in closed.services.started)

    assert not problems, "\n".join(f"{p.dashboard} / {p.panel}: {p.message}" for p in problems)
    assert report.gaming_flows_classified >= 1, report.model_dump_json(indent=1)
    for kind in ("flow_records", "probe_records", "detections", "actions", "action_results"):
        assert report.rows[kind] > 0, f"no rows in cgloop.{kind}: {report.rows}"
    assert [f.kind for f in report.faults] == ["congestion", "ect1_abuse"]
    congestion, abuse = report.faults
    gaming_port = str(SCENARIO["traffic"][0]["port"] + 100)

    def not_yet_protected(f) -> bool:
        """The guard acts only for flows the global loop has named: on a loaded machine a
        trial's fresh gaming flow can be classified, and so protected, only after the flood
        began; then the global loop acting first is right. Asked only when the node was not
        first, of the store (the engine's protect_flow results)."""
        if f.kind != "congestion" or f.first_level == "node":
            return False
        since = protected_since(loop_stack.store_http_url, int(gaming_port))
        return since is None or since > f.onset_ns

    def placed_before_onset(f) -> bool:
        """The guard had already moved this trial's gaming flow to the gaming class when the
        flood began (a queue in the trial's lead) and had not released it: the flood cannot
        queue it, so the node has nothing left to do, and the flow must stay unaffected."""
        return f.kind == "congestion" and any(
            gaming_port in s for s in f.node_placed_at_onset
        )

    def node_excused(f) -> bool:
        return f.first_level != "node" and (not_yet_protected(f) or placed_before_onset(f))

    # The node's micro loop acted first on both faults, within the fault, and its actions are
    # in the store (the global loop reads the same records).
    for f in report.faults:
        context = f.model_dump_json(indent=1)
        assert f.first_level == "node" or node_excused(f), (
            f"the node did not act first although the flow was protected: {context}"
        )
        if placed_before_onset(f) and f.first_level != "node":
            assert not f.affected, f"placed in the gaming class, yet affected: {context}"
        if f.first_ns is not None:
            assert f.onset_ns <= f.first_ns <= f.end_ns, context
    # congestion: the latency guard moved the protected gaming flow of this trial (its port is
    # the scenario's + 100: trials get fresh flows) before or without the SLO breaking
    if not node_excused(congestion):
        promoted = [s for _, op, s in congestion.node_actions if op == "reprioritise_flow"]
        assert congestion.first_promotion_ns is not None, congestion.model_dump_json(indent=1)
        assert any(gaming_port in s for s in promoted), (gaming_port, congestion.node_actions)
    # the ground truth: the gaming flow never went over its SLO, or came back within the fault
    assert not congestion.affected or congestion.recovered_ns is not None, (
        congestion.model_dump_json(indent=1)
    )
    # the ECT(1) flood: RFC 9957 queue protection sanctioned the abuser (its port), at node level
    abuser_port = str(SCENARIO["faults"][1].get("port", ECT1_PORT))
    sanctioned = [s for _, op, s in abuse.node_actions if op == "queue_protection_sanction"]
    assert abuse.first_sanction_ns is not None, abuse.model_dump_json(indent=1)
    assert any(abuser_port in s for s in sanctioned), (abuser_port, abuse.node_actions)
    # Whatever the global loop still did verified as expected. The engine takes the node's
    # actions as facts: a move of a flow the guard has already moved is refused, not sent.
    wrong = [
        (f.kind, f.action, f.verdict)
        for f in report.faults
        if f.action is not None and not refused_after_the_node(f)
        and f.verdict != expected_verdict(f.kind, f.action)
    ]
    assert not wrong, f"verdicts {wrong}, expected {EXPECTED_VERDICT} (gaps {KNOWN_GAPS}); " + (
        "the engine's checks:\n" + verifications(loop_stack.store_http_url)
    )
    for f in report.faults:
        if f.action is not None and not refused_after_the_node(f):
            assert f.applied_ns is not None and f.onset_ns <= f.applied_ns <= f.end_ns, (
                f.model_dump_json(indent=1)
            )
    # the L4S detector saw the abuser (other detections, e.g. the gaming flow's throughput
    # dipping, may come first)
    kinds = [kind for _, kind, _ in abuse.detections]
    assert {"l4s_unresponsive_ecn", "l4s_microburst"} & set(kinds), kinds
