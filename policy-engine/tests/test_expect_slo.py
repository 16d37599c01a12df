"""An expectation's value from the SLO table (`value_from: slo.*`): validated when a policy is
loaded, resolved per the triggering detection's platform, and what verification judges by."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from cgloop.policy import model
from cgloop.policy.actuators import NodeAgentActuator, Router
from cgloop.policy.engine import Engine
from cgloop.policy.journal import Journal
from cgloop.policy.telemetry import WindowStore
from cgloop.policy.testing import AgentServer, ManualClock, MemoryNodeAgent, detection, probes
from cgloop.slo import GENERIC, LAB, table
from cgloop.testing import cgloop_cmd
from cgloop.v1 import action_pb2 as apb
from cgloop.v1 import detection_pb2 as dpb

MS = 1_000_000

POLICY = """\
id: gaming
match:
  kinds: [slo_latency]
  subject: flow
action:
  operation: reprioritise_flow
  target: {{node_id: "{{label:node_id}}", interface_name: "{{label:interface}}"}}
  parameters: {{class_id: 0x10010, rewrite_dscp: 46}}
  expect:
    metric: probe.p99_rtt_ns
    comparator: less_than
{expect}
    within: 2s
guards:
  hold_time: 0s
"""


def policy(expect: str = "    value_from: slo.latency_ns") -> model.Policy:
    (p,) = model.parse_policies(POLICY.format(expect=expect), "p.yaml")
    return p


def errors(expect: str) -> str:
    with pytest.raises(model.PolicyError) as exc:
        policy(expect)
    return "\n".join(exc.value.problems)


def labels(**more: str) -> dict[str, str]:
    return {"node_id": "node-a", "interface": "veth0", **more}


# ------------------------------------------------------------------------------ resolution


def test_the_value_is_the_objective_of_the_detections_platform() -> None:
    e = policy().action.expect
    assert e is not None
    t = table()
    for name, objectives in t.platforms.items():
        assert e.resolve(labels(platform=name)) == objectives.latency_ns, name
    # the classifier's label in another case, a platform without a profile, no label at all
    assert e.resolve(labels(platform="GFN")) == t.platforms["gfn"].latency_ns
    assert e.resolve(labels(platform="unknown")) == t.platforms[GENERIC].latency_ns
    assert e.resolve(labels()) == t.platforms[GENERIC].latency_ns
    # a platform whose objective differs from generic's, or the check above proves nothing
    assert t.platforms["gfn"].latency_ns != t.platforms[GENERIC].latency_ns


def test_every_objective_and_a_deployment_profile() -> None:
    gfn = table().platforms["gfn"]
    want = {
        "slo.latency_ns": gfn.latency_ns,
        "slo.jitter_ns": round(gfn.jitter_ms * MS),
        "slo.loss": gfn.loss,
        "slo.min_down_bps": round(gfn.min_down_mbps * MS),
    }
    assert set(want) == set(model.SLO_VALUES)
    for name, value in want.items():
        e = policy(f"    value_from: {name}").action.expect
        assert e is not None and e.resolve(labels(platform="gfn")) == value, name
    lab = policy("    value_from: slo.latency_ns\n    slo_profile: lab").action.expect
    assert lab is not None
    assert lab.resolve(labels(platform="gfn")) == table().deployment(LAB).latency_ns
    fixed = policy("    value: 25000000").action.expect
    assert fixed is not None and fixed.resolve(labels(platform="gfn")) == 25 * MS


# ------------------------------------------------------------------------------ validation


def test_an_unknown_objective_or_profile_is_refused_naming_line_and_field() -> None:
    joined = errors("    value_from: slo.latency_ms")
    assert "p.yaml:12: action.expect.value_from: Input should be 'slo.latency_ns'" in joined
    joined = errors("    value_from: slo.latency_ns\n    slo_profile: moon")
    assert "p.yaml:13: action.expect.slo_profile: Value error, no SLO deployment profile " in joined
    assert "'moon' (known: lab)" in joined
    joined = errors("    value: 1\n    value_from: slo.latency_ns")
    assert "p.yaml:10: action.expect: Value error, give the expected value either as" in joined
    assert "not both" in joined
    assert "not neither" in errors("    baseline_window: 1s")
    assert "p.yaml:12: action.expect.value_ns: Extra inputs are not permitted" in errors(
        "    value_ns: 1"
    )
    assert "slo_profile: only applies with `value_from`" in errors(
        "    value: 1\n    slo_profile: lab"
    )


def test_policy_validate_refuses_an_unknown_objective(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(POLICY.format(expect="    value_from: slo.lag_ns"))
    good = tmp_path / "good.yaml"
    good.write_text(POLICY.format(expect="    value_from: slo.latency_ns"))
    run = subprocess.run(
        cgloop_cmd("policy", "validate", str(bad)), capture_output=True, text=True, timeout=120
    )
    out = run.stdout + run.stderr
    assert run.returncode != 0
    assert f"{bad}:12: action.expect.value_from" in out.replace("\n", "")
    run = subprocess.run(
        cgloop_cmd("policy", "validate", str(good)), capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 0, run.stdout + run.stderr


def test_the_shipped_gaming_policies_expect_the_tables_latency() -> None:
    expects = {p.id: p.action.expect for p in model.default_policies() if p.action.expect}
    assert set(expects) >= {"gaming-latency-reprioritise", "classic-burst-rate-limit"}
    for pid, e in expects.items():
        assert e.value is None and e.value_from is model.SloValue.LATENCY_NS, pid


# ------------------------------------------------------------------- what verification uses


@pytest.fixture
def agent() -> Iterator[AgentServer]:
    with AgentServer(MemoryNodeAgent("node-a")) as server:
        yield server


def test_verification_judges_by_the_flows_platform_objective(agent: AgentServer) -> None:
    """The same p99 RTT (80 ms, after 150 ms before) meets GeForce NOW's objective (100 ms)
    and misses generic's (60 ms): the engine expects each flow's own."""
    gfn, generic = table().platforms["gfn"].latency_ns, table().platforms[GENERIC].latency_ns
    after_ns = 80 * MS
    assert generic < after_ns < gfn
    verdicts = {}
    for platform in ("gfn", "somewhere-else"):
        clock = ManualClock()
        store = WindowStore()
        engine = Engine(
            [policy()],
            Router(NodeAgentActuator({"node-a": agent.address})),
            telemetry=store,
            journal=Journal(None, fsync=False),
            clock=clock,
        )
        t0 = clock()
        store.ingest_probes(probes(t0 - 2_000 * MS, t0, rtt_ns=150 * MS))
        det = detection(t0, labels=labels(platform=platform))
        events = engine.handle(dpb.DetectionBatch(records=[det]))
        action, applied = events[0].action, events[1].result
        verdicts[platform] = [action.expected_effect.value]
        store.ingest_probes(
            probes(applied.applied_ns, applied.applied_ns + 2_000 * MS, rtt_ns=after_ns)
        )
        clock.now_ns = applied.applied_ns + 2_000 * MS
        engine.tick()
        (ev,) = engine.drain()
        verdicts[platform].append(ev.result.verification.verdict)
        assert f"expected {action.expected_effect.value:g}" in ev.result.verification.detail
    assert verdicts == {
        "gfn": [gfn, apb.VERDICT_IMPROVED],
        "somewhere-else": [generic, apb.VERDICT_NO_EFFECT],
    }
