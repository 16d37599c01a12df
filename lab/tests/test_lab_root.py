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

import psutil  # noqa: E402
from cgloop.lab import cgroups, procs  # noqa: E402
from cgloop.lab.faults import ActiveFault, CpuHog  # noqa: E402
from cgloop.lab.lab import Lab  # noqa: E402
from cgloop.lab.scenario import Runner, Scenario  # noqa: E402
from cgloop.lab.topology import load_topology  # noqa: E402
from cgloop.lab.traffic.stats import Packets  # noqa: E402
from pyroute2 import netns  # noqa: E402

# Lab v2's shape (core router, two edges, two homes) at rates a busy 2-core machine carries:
# the core's links (40 Mbit/s) faster than a home's bottleneck (20), as in the shipped lab.
TEST_TOPOLOGY = """
nodes:
  - {name: core, role: router}
  - {name: edge1, role: router}
  - {name: edge2, role: router}
  - {name: cpe1, role: router}
  - {name: cpe2, role: router}
  - {name: gs1, role: game-server}
  - {name: gs2, role: game-server}
  - {name: bulk, role: bulk-sender}
  - {name: apps, role: app-server}
  - {name: cl1, role: client}
  - {name: home1, role: client}
  - {name: cl2, role: client}
links:
  - {a: gs1, b: core, subnet: 10.77.1.0/30}
  - {a: gs2, b: core, subnet: 10.77.2.0/30}
  - {a: bulk, b: core, subnet: 10.77.3.0/30}
  - {a: apps, b: core, subnet: 10.77.4.0/30}
  - {a: core, b: edge1, subnet: 10.77.5.0/30,
     bottleneck: {down_mbit: 40, up_mbit: 40, limit_packets: 100, tier: core}}
  - {a: core, b: edge2, subnet: 10.77.6.0/30,
     bottleneck: {down_mbit: 40, up_mbit: 40, limit_packets: 100, tier: core}}
  - {a: edge1, b: cpe1, subnet: 10.77.10.0/30,
     bottleneck: {down_mbit: 20, up_mbit: 10, limit_packets: 100}}
  - {a: edge2, b: cpe2, subnet: 10.77.20.0/30,
     bottleneck: {down_mbit: 20, up_mbit: 10, limit_packets: 100}}
  - {a: cpe1, b: cl1, subnet: 10.77.11.0/30}
  - {a: cpe1, b: home1, subnet: 10.77.12.0/30}
  - {a: cpe2, b: cl2, subnet: 10.77.21.0/30}
"""

# One scenario for the traffic tests (one lab, one run, ~32 s): a 4 Mbit/s gaming-like session
# behind each edge, a third joining edge2's home mid-run, and every traffic fault once, with
# quiet gaps in between. gaming0 = gs1→cl1 (edge1), gaming1 = gs2→cl2 (edge2).
LATE_AT = 14
SCENARIO = {
    "duration": 32,
    "traffic": [
        {"kind": "gaming", "platform": "test", "server": "gs1", "client": "cl1"},
        {"kind": "gaming", "platform": "test", "server": "gs2", "client": "cl2", "port": 49006},
        {"kind": "gaming", "platform": "test", "server": "gs1", "client": "cl2", "port": 49008,
         "at": LATE_AT},
    ],
    "faults": [
        {"kind": "congestion", "at": 3, "duration": 4, "flows": 4, "dst": "home1"},
        {"kind": "core_congestion", "at": 9, "duration": 4, "flows": 4, "dst": "edge2"},
        {"kind": "rate_cap", "at": 15, "duration": 3, "rate_mbit": 2},
        {"kind": "loss", "at": 20, "duration": 3, "percent": 20},
        {"kind": "ect1_abuse", "at": 25, "duration": 2, "rate_mbit": 5, "dst": "home1"},
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


def test_shipped_v2_lab_up_is_idempotent_cpu_hogs_are_pinned_and_down_leaves_nothing(tmp_path):
    """The shipped topology itself (13 namespaces, both tiers shaped), a CPU hog fault on it,
    and down stopping everything."""
    lab = Lab(load_topology(name=f"cgl-lab-{os.getpid()}-u"), tmp_path / "state")
    core_no = max(os.sched_getaffinity(0))
    hog = ActiveFault(
        lab,
        CpuHog(at=0, duration=1, node="edge1", cores=[core_no], processes=2, nice=-5),
        "cpu_hog0",
        tmp_path,
    )
    try:
        lab.up()
        lab.up()  # converges: nothing to do, nothing broken
        st = lab.status()
        assert st.up and len(st.nodes) == 13
        rates = {
            (n.node, i.ifname): i.rate_mbit for n in st.nodes for i in n.interfaces if i.qdisc
            == "htb"
        }
        assert rates == {
            ("core", "edge1"): pytest.approx(200), ("edge1", "core"): pytest.approx(200),
            ("core", "edge2"): pytest.approx(200), ("edge2", "core"): pytest.approx(200),
            ("edge1", "cpe1"): pytest.approx(100), ("cpe1", "edge1"): pytest.approx(20),
            ("edge2", "cpe2"): pytest.approx(100), ("cpe2", "edge2"): pytest.approx(20),
        }
        core = next(n for n in st.nodes if n.node == "core")
        assert sorted(i.ifname for i in core.interfaces) == [
            "apps", "bulk", "edge1", "edge2", "gs1", "gs2"
        ]
        hog.apply()
        pids = hog.detail["pids"]
        assert len(pids) == 2 and hog.detail["affinity"] == [[core_no], [core_no]]
        assert all(procs.netns_inode(lab.ns("edge1")) == _netns_of(pid) for pid in pids)
        assert hog.detail["nice"] == [-5, -5] and hog.detail["scheduler"] == ["other", "other"]
        # In edge1's cgroup, what edge1's agent reads its CPU share from (none without cgroup2).
        edge1_cgroup = lab.cgroup("edge1")
        if cgroups.mount() is not None:
            assert edge1_cgroup is not None and hog.detail["cgroup"] == str(edge1_cgroup)
            assert all(_cgroup_of(pid) == edge1_cgroup for pid in pids)
        time.sleep(0.5)
        busy = [psutil.Process(pid).cpu_times() for pid in pids]
        assert sum(t.user + t.system for t in busy) > 0.1  # they really burn CPU
        # A process the lab started is stopped by down, and so is one it never recorded.
        recorded = lab.spawn("cl1", ["sleep", "300"], role="test")
        stray = procs.spawn(lab.ns("home2"), ["sleep", "300"])
        recorded_pids = [(recorded.pid, None), (stray.pid, None), *[(p, None) for p in pids]]
    finally:
        removed = lab.down()  # the hogs are still running: down stops them
    assert len(removed) == len(lab.topo.nodes)
    recorded.wait(5)
    stray.wait(5)
    _assert_gone(lab, recorded_pids)
    assert lab.down() == []  # a second down is harmless
    lab_cgroups = cgroups.lab_dir(lab.name)
    assert lab_cgroups is None or not lab_cgroups.exists(), "down removes the lab's cgroups"


def test_a_cpu_hog_fault_stops_its_processes_when_reverted(tmp_path):
    lab = _make_lab(tmp_path, "h")
    hog = ActiveFault(
        lab,
        CpuHog(at=0, duration=1, node="edge2", cores=[0], processes=1, realtime_priority=1),
        "cpu_hog0",
        tmp_path,
    )
    try:
        lab.up()
        hog.apply()
        (pid,) = hog.detail["pids"]
        assert os.sched_getaffinity(pid) == {0}
        assert os.sched_getscheduler(pid) == os.SCHED_FIFO and hog.detail["scheduler"] == ["fifo"]
        time.sleep(0.3)
        hog.revert()
        assert not procs.alive(pid, None)
        assert hog.detail["cpu_s"][0] > 0.05
        assert not any(p.role.startswith("cpu_hog0") for p in lab.state().processes)
    finally:
        lab.down()
    _assert_gone(lab, [])


def _cgroup_of(pid: int) -> Path | None:
    """The process's cgroup v2 directory (the `0::` line of /proc/PID/cgroup)."""
    root = cgroups.mount()
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        if line.startswith("0::") and root is not None:
            return root / line[3:].lstrip("/")
    return None


def _netns_of(pid: int) -> tuple[int, int]:
    st = os.stat(f"/proc/{pid}/ns/net")
    return st.st_dev, st.st_ino


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


def _windows(report, fault: str, session: str = "gaming0"):
    return next(
        w for w in report.windows if w.fault.startswith(fault) and w.session == session
    )


@pytest.mark.parametrize("session", ["gaming0", "gaming1"])  # behind edge1, behind edge2
def test_gaming_sessions_cross_both_edges_with_no_loss(scenario_run, session):
    _, report = scenario_run
    before = _windows(report, "congestion", session).before  # the first 3 s, nothing injected
    assert before.packets > 500
    assert before.loss_pct < 0.5
    # 4 Mbit/s at 60 fps through 40 then 20 Mbit/s: a frame's burst takes ~1 ms to serialise.
    assert 0 < before.p50_ms < 5
    assert before.p99_ms < 15
    down = report.sessions[session]["down"]
    assert down["malformed"] == 0 and down["socket_drops"] == 0
    up = report.sessions[session]["up"]["summary"]
    assert up["packets"] > 1000 and up["loss_pct"] < 0.5  # client input every 10 ms


def test_core_congestion_delays_the_congested_edges_sessions_only(scenario_run):
    _, report = scenario_run
    hit = _windows(report, "core_congestion", "gaming1")  # cl2, behind edge2
    spared = _windows(report, "core_congestion", "gaming0")  # cl1, behind edge1
    assert hit.during.p99_ms > max(2 * hit.before.p99_ms, hit.before.p99_ms + 10), hit
    assert hit.after.p99_ms < hit.during.p99_ms / 2  # it drains once the flood stops
    assert spared.during.p99_ms < spared.before.p99_ms + 10, spared
    assert spared.during.p99_ms < hit.during.p99_ms / 2
    assert spared.during.loss_pct < 0.5
    flood = next(e for e in report.faults if e.kind == "core_congestion").detail
    assert flood.get("mbit", 0) > 10, flood  # TCP to edge2's sink, held by the 40 Mbit/s core


def test_a_session_starting_mid_scenario_sends_only_from_its_start(scenario_run):
    _, report = scenario_run
    late = next(t for t in report.traffic if t.id == "gaming2")
    assert (late.start_ns - report.started_ns) / 1e9 == pytest.approx(LATE_AT, abs=0.01)
    packets = Packets.load(Path(report.run_dir) / "gaming2-client.npz")
    assert len(packets) > 500
    assert packets.send_ns.min() >= late.start_ns
    assert packets.send_ns.min() - late.start_ns < 1e9  # started on time
    lines = (Path(report.run_dir) / "traffic.jsonl").read_text().splitlines()
    assert len(lines) == len(SCENARIO["traffic"])
    # no delay windows for the faults that were over before it began
    late_faults = {w.fault for w in report.windows if w.session == "gaming2"}
    assert late_faults == {"rate_cap2", "loss3", "ect1_abuse4"}


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
    assert lab.rate_mbit("edge1", "cpe1") == pytest.approx(20)  # restored


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
    assert kinds == ["congestion", "core_congestion", "rate_cap", "loss", "ect1_abuse"]
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
        " {kind: web, server: apps, client: home1}]\n"
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
