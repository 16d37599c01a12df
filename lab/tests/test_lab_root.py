"""The lab on the real kernel: namespaces, veths, HTB, the eBPF loss program, real traffic.

Needs root. Each lab is named `cgl-lab-<pid>-…` so parallel runs never collide, and every
fixture takes its lab down (and checks that nothing is left) even when a test fails.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = [
    pytest.mark.root,
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root (network namespaces, tc, BPF)"),
    pytest.mark.timeout(240),
]

from cgloop.lab import procs  # noqa: E402
from cgloop.lab.lab import Lab  # noqa: E402
from cgloop.lab.scenario import Runner, Scenario  # noqa: E402
from cgloop.lab.topology import load_topology  # noqa: E402
from pyroute2 import netns  # noqa: E402

TEST_TOPOLOGY = """
nodes:
  - {name: edge, role: router}
  - {name: cpe, role: router}
  - {name: gs1, role: game-server}
  - {name: bulk, role: bulk-sender}
  - {name: apps, role: app-server}
  - {name: cl1, role: client}
  - {name: home, role: client}
links:
  - {a: gs1, b: edge, subnet: 10.77.1.0/30}
  - {a: bulk, b: edge, subnet: 10.77.3.0/30}
  - {a: apps, b: edge, subnet: 10.77.4.0/30}
  - {a: edge, b: cpe, subnet: 10.77.0.0/30,
     bottleneck: {down_mbit: 20, up_mbit: 10, limit_packets: 100}}
  - {a: cpe, b: cl1, subnet: 10.77.11.0/30}
  - {a: cpe, b: home, subnet: 10.77.13.0/30}
"""

# One scenario for the traffic tests (one lab, one run, ~23 s): a 4 Mbit/s gaming-like session
# through a 20 Mbit/s bottleneck, and every fault once, with quiet gaps in between.
SCENARIO = {
    "duration": 23,
    "traffic": [{"kind": "gaming", "platform": "test", "server": "gs1", "client": "cl1"}],
    "faults": [
        {"kind": "congestion", "at": 3, "duration": 4, "flows": 4},
        {"kind": "rate_cap", "at": 9, "duration": 3, "rate_mbit": 2},
        {"kind": "loss", "at": 14, "duration": 3, "percent": 20},
        {"kind": "ect1_abuse", "at": 19, "duration": 2, "rate_mbit": 5},
    ],
}


def _assert_gone(lab: Lab, recorded_pids: list[tuple[int, int | None]]) -> None:
    prefix = f"{lab.name}-"
    assert not [ns for ns in netns.listnetns() if ns.startswith(prefix)]
    assert not [pid for pid, ticks in recorded_pids if procs.alive(pid, ticks)]
    assert not lab.store.path.exists()


def _make_lab(tmp_path: Path, suffix: str) -> Lab:
    path = tmp_path / "topology.yaml"
    path.write_text(TEST_TOPOLOGY)
    return Lab(load_topology(path, name=f"cgl-lab-{os.getpid()}-{suffix}"), tmp_path / "state")


def test_up_is_idempotent_and_down_leaves_nothing(tmp_path):
    lab = _make_lab(tmp_path, "u")
    try:
        lab.up()
        lab.up()  # converges: nothing to do, nothing broken
        st = lab.status()
        assert st.up
        edge = next(n for n in st.nodes if n.node == "edge")
        shaped = next(i for i in edge.interfaces if i.ifname == "cpe")
        assert shaped.qdisc == "htb" and shaped.rate_mbit == pytest.approx(20)
        assert len(edge.interfaces) == 4
        # A process the lab started is stopped by down, and so is one it never recorded.
        recorded = lab.spawn("cl1", ["sleep", "300"], role="test")
        stray = procs.spawn(lab.ns("home"), ["sleep", "300"])
        pids = [(recorded.pid, None), (stray.pid, None)]
    finally:
        removed = lab.down()
    assert len(removed) == len(lab.topo.nodes)
    recorded.wait(5)
    stray.wait(5)
    _assert_gone(lab, pids)
    assert lab.down() == []  # a second down is harmless


@pytest.fixture(scope="module")
def scenario_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("lab")
    lab = _make_lab(tmp, "s")
    try:
        lab.up()
        report = Runner(lab, Scenario.model_validate(SCENARIO), tmp / "run").run()
        yield lab, report
    finally:
        lab.down()
        _assert_gone(lab, [])


def _windows(report, fault: str):
    return next(w for w in report.windows if w.fault.startswith(fault))


def test_gaming_session_crosses_the_lab_with_no_loss(scenario_run):
    _, report = scenario_run
    before = _windows(report, "congestion").before  # the first 3 s, nothing injected yet
    assert before.packets > 500
    assert before.loss_pct < 0.5
    # 4 Mbit/s at 60 fps through 20 Mbit/s: a frame's burst takes ~1 ms to serialise.
    assert 0 < before.p50_ms < 5
    assert before.p99_ms < 15
    down = report.sessions["gaming0"]["down"]
    assert down["malformed"] == 0 and down["socket_drops"] == 0
    up = report.sessions["gaming0"]["up"]["summary"]
    assert up["packets"] > 1000 and up["loss_pct"] < 0.5  # client input every 10 ms


def test_congestion_raises_gaming_p99(scenario_run):
    _, report = scenario_run
    w = _windows(report, "congestion")
    assert w.during.p99_ms > max(3 * w.before.p99_ms, w.before.p99_ms + 20), w
    assert w.after.p99_ms < w.during.p99_ms / 2  # and it drains once the flood stops
    bulk = next(e for e in report.faults if e.kind == "congestion").detail
    assert bulk.get("mbit", 0) > 5, bulk


def test_rate_cap_limits_the_gaming_flow(scenario_run):
    lab, report = scenario_run
    w = _windows(report, "rate_cap")
    assert w.during.loss_pct > 30, w.during  # 4 Mbit/s offered into 2 Mbit/s
    assert w.during.p99_ms > 100  # the 100-packet FIFO stays full
    assert w.after.loss_pct < 1
    assert lab.rate_mbit("edge", "cpe") == pytest.approx(20)  # restored


def test_loss_fault_drops_the_requested_fraction(scenario_run):
    _, report = scenario_run
    w = _windows(report, "loss")
    assert w.during.expected > 500
    assert 13 < w.during.loss_pct < 27, w.during
    assert w.after.loss_pct < 1


def test_ect1_abuser_arrives_marked_and_onsets_are_recorded(scenario_run):
    _, report = scenario_run
    ect1 = next(e for e in report.faults if e.kind == "ect1_abuse").detail
    ecn = ect1["down"]["ecn"]
    assert ecn["ect1"] > 200 and ecn["not_ect"] == 0
    ect1_onset = next(e for e in report.faults if e.kind == "ect1_abuse").onset_ns
    assert 0 <= ect1["first_packet_ns"] - ect1_onset < 2e9  # generator start-up, bounded
    kinds = [e.kind for e in sorted(report.faults, key=lambda e: e.onset_ns)]
    assert kinds == ["congestion", "rate_cap", "loss", "ect1_abuse"]
    t0 = report.started_ns
    for event, spec in zip(
        sorted(report.faults, key=lambda e: e.onset_ns), SCENARIO["faults"], strict=True
    ):
        # Onset within 0.5 s of the scheduled time; applied in well under a second.
        assert abs((event.onset_ns - t0) / 1e9 - spec["at"]) < 0.5
        assert event.end_ns > event.onset_ns
    lines = (Path(report.run_dir) / "events.jsonl").read_text().splitlines()
    assert len(lines) == 2 * len(SCENARIO["faults"])  # on and off, written as they happened


def test_down_cleans_up_after_a_killed_run(tmp_path):
    lab = _make_lab(tmp_path, "k")
    scenario = tmp_path / "scenario.yaml"
    scenario.write_text(
        "duration: 60\n"
        "traffic: [{kind: gaming, platform: test, server: gs1, client: cl1},"
        " {kind: web, server: apps, client: home}]\n"
        "faults: [{kind: congestion, at: 1, duration: 50},"
        " {kind: loss, at: 1, duration: 50, percent: 1}]\n"
    )
    runner = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "cgloop.cli.main",
            "lab",
            "run",
            "--name",
            lab.name,
            "--topology",
            str(tmp_path / "topology.yaml"),
            "--state-dir",
            str(lab.store.dir),
            "--scenario",
            str(scenario),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            state = lab.state()
            if state and len(state.processes) >= 6:  # gaming 2 + web 2 + iperf3 2
                break
            assert runner.poll() is None, runner.stdout.read().decode()
            time.sleep(0.2)
        else:
            pytest.fail("the scenario never started its generators")
        time.sleep(1.5)
        runner.send_signal(signal.SIGKILL)  # the runner dies; its generators do not
        runner.wait(10)
        pids = [(p.pid, p.ticks) for p in lab.state().processes]
        assert any(procs.alive(pid, ticks) for pid, ticks in pids)
    finally:
        if runner.poll() is None:
            runner.kill()
            runner.wait()
        lab.down()
    _assert_gone(lab, pids)
