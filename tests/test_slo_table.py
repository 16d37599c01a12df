"""The gaming SLOs are declared once, in the SLO table (core: cgloop/slo/objectives.toml, read
by `cgloop.slo`), and every component that judges a flow by an objective reads it there.

* Every consumer's value is the table's: the analytics' SLO detector (per platform and under
  the lab's profile), the loop (its options, its edge plan, the policies it renders, what it
  passes to the analytics worker), the lab's traffic profiles, the policy engine's default
  protections (one per platform) and its verification (the shipped policies' expectations are
  the triggering flow's platform objective) and the dashboards' threshold.
* No SLO number is written anywhere else: outside tests, a number assigned to an SLO-named
  value in those components' Python, or an SLO number in the loop's policy templates or the
  policy engine's shipped policies, is a second declaration waiting to drift.
* A broken table is refused with the file and the field named.
"""

from __future__ import annotations

import io
import os
import re
import subprocess
import tokenize
from pathlib import Path

import pytest
import yaml
from cgloop.analytics.detectors.slo import PLATFORM_SLOS, platform_slos
from cgloop.dashboards import slo as dashboard_slo
from cgloop.errors import CgloopError
from cgloop.lab.traffic.profiles import GAMING_PLATFORMS, PROFILES
from cgloop.loop.closed_loop import LoopOptions, write_policies
from cgloop.loop.edge import EdgePlan
from cgloop.policy.decide import Decider
from cgloop.policy.model import default_policies
from cgloop.policy.testing import detection
from cgloop.slo import GENERIC, LAB, load, table, table_path
from cgloop.testing import cgloop_cmd
from cgloop.v1.common_pb2 import RecordHeader

REPO = Path(__file__).resolve().parents[1]
TABLE = "core/src/cgloop/slo/objectives.toml"
# The components that judge flows by an objective; their Python outside tests.
CONSUMERS = (
    "analytics/src", "loop/src", "dashboards/src", "lab/src", "policy-engine/src", "core/src",
)
# A number given to an SLO-named value (`latency_slo_ms = 20.0`, `slo_p99_ms=20`), and, in the
# detector that holds the per-platform objectives, to an objective's field.
SLO_NUMBER = re.compile(
    r"(?i)\b(\w*slo\w*_(?:ms|ns|us)|\w*slo_p\d+\w*)\b\s*(?::[^=\n]+)?=\s*[-+]?\.?\d"
)
OBJECTIVE_NUMBER = re.compile(
    r"\b(latency_ms|jitter_ms|loss|min_down_mbps)\b\s*(?::[^=\n]+)?=\s*[-+]?\.?\d"
)
OBJECTIVE_HOMES = ("analytics/src/cgloop/analytics/detectors/",)
# The loop's policy templates: an objective there is a placeholder the loop renders.
TEMPLATES = "loop/src/cgloop/loop/data/policies"
TEMPLATE_NUMBER = re.compile(r"^\s*(latency_slo_ns|value):\s*\d", re.MULTILINE)
# The policy engine's shipped policies: an expectation takes its value from the table
# (`value_from: slo.latency_ns`, resolved per the detection's platform). The protections'
# `latency_slo_ns` parameters are the exception, each compared with its platform's objective
# by test_the_policy_engines_protections_are_each_platforms_objective.
ENGINE_POLICIES = "policy-engine/src/cgloop/policy/policies"
ENGINE_NUMBER = re.compile(r"\b(latency_slo_ns|value)\s*:\s*[-+]?\.?\d[\w.+-]*")
CHECKED_ELSEWHERE = {("protect.yaml", "latency_slo_ns")}


def _code(text: str) -> str:
    """Python without its comments (a comment may explain a number; it declares nothing)."""
    kept = [
        t for t in tokenize.generate_tokens(io.StringIO(text).readline)
        if t.type != tokenize.COMMENT
    ]  # fmt: skip
    return tokenize.untokenize(kept)


def _is_test(path: str) -> bool:
    parts = path.split("/")
    return "tests" in parts or parts[-1].startswith("test_") or parts[-1] == "conftest.py"


def _sources() -> list[tuple[str, str]]:
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", *CONSUMERS],
        cwd=REPO, capture_output=True, text=True, check=True,
    ).stdout.split()  # fmt: skip
    return [
        (p, (REPO / p).read_text(errors="replace"))
        for p in listed
        if p.endswith(".py") and not _is_test(p) and (REPO / p).is_file()
        and "/v1/" not in p  # generated protobuf bindings
    ]


def _hits(path: str, text: str) -> list[str]:
    code = _code(text)
    found = list(SLO_NUMBER.finditer(code))
    if path.startswith(OBJECTIVE_HOMES):
        found += OBJECTIVE_NUMBER.finditer(code)
    return [f"{path}: {m.group(0)}" for m in found]


# ------------------------------------------------------------------------------- the table


def test_the_table_is_the_packaged_file_and_names_its_sources() -> None:
    assert table_path().resolve() == (REPO / TABLE).resolve()
    t = table()
    assert {"gfn", "std", "psn", "xc", GENERIC} <= set(t.platforms)
    assert t.latency_ms(LAB) > 0
    for name, p in t.platforms.items():
        assert "MOSAICO D234" in p.source or "Named default" in p.source, name
    # the source is cited by name, never by a file outside the repository
    text = (REPO / TABLE).read_text()
    assert "seeds/" not in text and "../" not in text


def test_a_broken_table_is_refused_naming_the_file_and_the_field(tmp_path: Path) -> None:
    good = (REPO / TABLE).read_text()
    cases = {
        "negative": (good.replace("latency_ms = 100.0", "latency_ms = -1.0", 1),
                     "platforms.gfn.latency_ms: Input should be greater than 0"),
        "missing": (good.replace("jitter_ms = 2.0\n", "", 1), "platforms.gfn.jitter_ms: Field"),
        "unknown": (good.replace("loss = 0.05", "loss = 0.05\nlos = 1", 1), "platforms.gfn.los"),
        "no generic": (good.replace("[platforms.generic]", "[platforms.other]"), "generic"),
        "not toml": ("[platforms\n", "cannot read the SLO table"),
    }  # fmt: skip
    for name, (text, message) in cases.items():
        path = tmp_path / f"{name}.toml"
        path.write_text(text)
        with pytest.raises(CgloopError, match=re.escape(message)) as e:
            load(path)
        assert str(path) in str(e.value), name
    with pytest.raises(CgloopError, match=r"no SLO deployment profile 'x' \(known: lab\)"):
        table().deployment("x")


# ----------------------------------------------------------- every consumer reads the table


def test_the_detector_holds_each_platform_to_the_table() -> None:
    t = table()
    for name, prof in PLATFORM_SLOS.items():
        want = t.platforms[name]
        assert (prof.latency_ms, prof.jitter_ms, prof.loss, prof.min_down_mbps) == (
            want.latency_ms, want.jitter_ms, want.loss, want.min_down_mbps), name
    assert {p.latency_ms for p in platform_slos(LAB).values()} == {t.latency_ms(LAB)}


def test_the_loop_and_the_lab_defend_the_tables_lab_profile(tmp_path: Path) -> None:
    lab = table().latency_ms(LAB)
    assert LoopOptions().slo_profile == LAB and LoopOptions().latency_slo_ms == lab
    plan = EdgePlan(node="edge", bottleneck="cpe", interfaces=["cpe"], link_mbit=100)
    assert plan.latency_slo_ms == lab
    assert {PROFILES[p].slo_p99_ms for p in GAMING_PLATFORMS} == {lab}
    rendered = [
        p for f in sorted(write_policies(tmp_path, plan).glob("*.yaml"))
        for p in yaml.safe_load(f.read_text())["policies"]
    ]  # fmt: skip
    values = [p["action"]["parameters"].get("latency_slo_ns") for p in rendered] + [
        p["action"].get("expect", {}).get("value") for p in rendered
    ]
    assert {v for v in values if v is not None} == {table().deployment(LAB).latency_ns}
    # the loop hands the analytics worker the profile, which the worker accepts
    out = subprocess.run(
        cgloop_cmd("analytics", "run", "--help"), capture_output=True, text=True, timeout=120,
        env={**os.environ, "COLUMNS": "200"}, check=True,
    ).stdout  # fmt: skip
    assert "--slo-profile" in out


def test_the_policy_engines_protections_are_each_platforms_objective() -> None:
    protections = {
        p.match.labels["platform"]: p.action.parameters["latency_slo_ns"]
        for p in default_policies()
        if p.action.operation.value == "protect_flow"
    }
    assert set(protections) == set(table().platforms) - {GENERIC}
    for platform, ns in protections.items():
        assert ns == table().platforms[platform].latency_ns, platform


def test_the_policy_engines_verification_expects_the_flows_objective() -> None:
    """The shipped policies' expectations are the table's latency objective of the triggering
    detection's platform (generic's without one), and the engine proposes it."""
    expecting = [p for p in default_policies() if p.action.expect is not None]
    assert {p.id for p in expecting} >= {"gaming-latency-reprioritise", "classic-burst-rate-limit"}
    for p in expecting:
        e = p.action.expect
        assert e is not None and e.value is None and e.value_from == "slo.latency_ns", p.id
        cases = [(n, {"platform": n}) for n in table().platforms] + [(GENERIC, {})]
        for platform, labels in cases:
            det = detection(10**18, labels={"node_id": "n", "interface": "i", **labels})
            action = Decider.propose(p, det, "k", 0, RecordHeader(), 0.0).action
            want = table().platforms[platform].latency_ns
            assert action.expected_effect.value == want, (p.id, platform)


def test_the_dashboards_threshold_offers_the_tables_profiles() -> None:
    assert dashboard_slo.choices() == [dashboard_slo.PER_PLATFORM, LAB]
    sql = dashboard_slo.latency_ms_sql()
    for p in table().platforms.values():
        assert repr(p.latency_ms) in sql


# ------------------------------------------------------------------------ no second source


def test_the_literal_check_can_fail() -> None:
    assert _hits("loop/src/x.py", "latency_slo_ms: float = 20.0\n")
    assert _hits("lab/src/x.py", "GAMING_SLO_P99_MS = 20.0\n")
    assert _hits("lab/src/x.py", "MediaProfile(name='x', slo_p99_ms=20)\n")
    assert _hits("analytics/src/cgloop/analytics/detectors/slo.py", "SloProfile(latency_ms=60.0)")
    assert not _hits("loop/src/x.py", "slo_min_duration_s: float = 0.2\n")
    assert not _hits("loop/src/x.py", "x = 1  # latency_slo_ms = 20\n")
    assert TEMPLATE_NUMBER.search("        value: 20000000   # 20 ms\n")
    assert _policy_hits("gaming.yaml", "      expect: {metric: m, value: 30000000}\n")
    assert _policy_hits("gaming.yaml", "        value: 2.0e7\n")
    assert _policy_hits("nodes.yaml", "      parameters: {<<: *p, latency_slo_ns: 6}\n")
    assert not _policy_hits("protect.yaml", "      parameters: {<<: *p, latency_slo_ns: 6}\n")
    assert not _policy_hits("gaming.yaml", "        value_from: slo.latency_ns\n")


def _policy_hits(name: str, text: str) -> list[str]:
    """SLO numbers in one of the engine's shipped policy files (comments aside)."""
    code = "\n".join(line.split("#", 1)[0] for line in text.splitlines())
    return [
        f"{ENGINE_POLICIES}/{name}: {m.group(0).strip()}"
        for m in ENGINE_NUMBER.finditer(code)
        if (name, m.group(1)) not in CHECKED_ELSEWHERE
    ]


def test_no_slo_number_outside_the_table() -> None:
    sources = _sources()
    assert len(sources) > 50, "the source listing found almost nothing"
    hits = [h for path, text in sources for h in _hits(path, text)]
    for f in sorted((REPO / TEMPLATES).glob("*.yaml")):
        hits += [
            f"{f.relative_to(REPO)}: {m.group(0).strip()}"
            for m in TEMPLATE_NUMBER.finditer(f.read_text())
        ]
    shipped = sorted((REPO / ENGINE_POLICIES).glob("*.yaml"))
    assert {f.name for f in shipped} >= {"gaming.yaml", "protect.yaml"}
    for f in shipped:
        hits += _policy_hits(f.name, f.read_text())
    assert not hits, (
        f"SLO numbers written outside {TABLE} (read them through cgloop.slo; the loop's "
        "policy templates take {latency_slo_ns}, the engine's expectations "
        "`value_from: slo.latency_ns`):\n" + "\n".join(hits)
    )
