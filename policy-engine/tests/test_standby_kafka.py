"""Two `cgloop policy run --standby` engines on the real broker: one decides; the leader is
killed (SIGKILL: no commit, no flush, no goodbye to the group), or paused (SIGSTOP) past its
lease, while detections flow; the standby takes over after the group's session timeout and
every detection gets exactly one action, applied once at the agent (an in-memory
NodeAgentService over real gRPC, shared by both engines), none lost, none decided by two
leaders at once."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import pytest
from cgloop.bus.kafka import BatchConsumer, BatchProducer, ensure_topics
from cgloop.bus.topics import ACTIONS, DETECTIONS
from cgloop.policy.journal import FINAL, Journal
from cgloop.policy.testing import AgentServer, MemoryNodeAgent, detection, flow
from cgloop.testing import cgloop_cmd, free_port, scrape_metrics
from cgloop.v1 import action_pb2 as apb
from cgloop.v1 import detection_pb2 as dpb

pytestmark = pytest.mark.kafka

# The broker's group.min.session.timeout.ms is 6 s (Kafka's default): the shortest lease.
LEASE_S = 6.0


def _policy(run: str) -> str:
    return f"""
id: standby-{run}
match:
  kinds: [slo_latency]
  severity_at_least: major
  subject: flow
  labels: {{run: "{run}"}}
action:
  operation: reprioritise_flow
  target: {{node_id: "{{label:node_id}}", interface_name: "{{label:interface}}"}}
  parameters: {{class_id: 0x10010, rewrite_dscp: 46}}
  deadline: 30s
guards:
  hold_time: 1s
"""


class Bus:
    """Every action event of this run's policy on cgloop.actions.v1, as it arrives."""

    def __init__(self, bootstrap: str, run: str) -> None:
        self.policy = f"standby-{run}"
        self.consumer = BatchConsumer(bootstrap, f"watch-{run}", [ACTIONS.name])
        self.actions: list[apb.Action] = []
        self.results: list[apb.ActionResult] = []
        self._ours: set[str] = set()

    def read(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            item = self.consumer.poll(0.05)
            if item is None:
                continue
            for ev in item[1].events:  # type: ignore[attr-defined]
                if ev.WhichOneof("event") == "action":
                    if ev.action.policy_id == self.policy:
                        self.actions.append(ev.action)
                        self._ours.add(ev.action.id)
                elif ev.result.action_id in self._ours:
                    self.results.append(ev.result)


class Scenario:
    """Two engines of one standby group, detections, the bus and the agent they share."""

    def __init__(self, settings, tmp_path: Path, agent: AgentServer) -> None:
        self.bootstrap = settings.bootstrap_servers
        ensure_topics(self.bootstrap)
        self.run = run = uuid.uuid4().hex[:10]
        self.tmp = tmp_path
        policy = tmp_path / "policy.yaml"
        policy.write_text(_policy(run))
        self.labels = {"node_id": "node-a", "interface": "veth0", "platform": "GFN", "run": run}
        self.producer = BatchProducer(self.bootstrap)
        self.bus = Bus(self.bootstrap, run)
        self.agent = agent
        self.sent: list[dpb.Detection] = []
        self.procs: dict[str, subprocess.Popen] = {}
        self.logs: dict[str, Path] = {}
        self.metrics: dict[str, str] = {}  # source -> its /metrics address
        for name in ("a", "b"):
            source = f"engine-{name}-{run}"
            self.metrics[source] = f"127.0.0.1:{free_port()}"
            self.logs[source] = tmp_path / f"{name}.log"
            env = {
                **os.environ,
                "CGLOOP_KAFKA_BOOTSTRAP": self.bootstrap,
                "CGLOOP_STATE_DIR": str(tmp_path / f"state-{name}"),
                **settings.kafka_security().env(),
            }
            self.procs[source] = subprocess.Popen(
                cgloop_cmd(
                    "policy", "run", str(policy), "--agent", f"node-a={agent.address}",
                    "--journal", str(tmp_path / f"{name}.jsonl"), "--group", f"policy-{run}",
                    "--source-id", source, "--standby", "--lease-timeout", str(LEASE_S),
                    "--no-verify", "--metrics-addr", self.metrics[source], "--budget", "1000",
                ),
                env=env, stdout=self.logs[source].open("w"), stderr=subprocess.STDOUT,
            )  # fmt: skip

    def send_one(self) -> None:
        det = dpb.Detection()
        det.CopyFrom(
            detection(time.time_ns(), labels=self.labels, flow=flow(port=40000 + len(self.sent)))
        )
        self.sent.append(det)
        self.producer.send(DETECTIONS.name, dpb.DetectionBatch(records=[det]), key=det.id)
        self.producer.flush()

    def flowing(self, seconds: float) -> None:
        """Detections every 0.2 s, reading the bus meanwhile."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            self.send_one()
            self.bus.read(0.2)

    def leader(self) -> tuple[str, str]:
        """Detections flow until one engine decides, then 4 s more (both up): (leader,
        standby), checked that only the leader decided."""
        deadline = time.monotonic() + 90
        while not self.bus.actions:
            assert time.monotonic() < deadline, self.tails()
            assert all(p.poll() is None for p in self.procs.values()), self.tails()
            self.flowing(0.5)
        self.flowing(4)
        leader = self.bus.actions[0].header.source_id
        (standby,) = set(self.procs) - {leader}
        assert {a.header.source_id for a in self.bus.actions} == {leader}, "two engines decided"
        assert (self.leading(leader), self.leading(standby)) == (1, 0)
        return leader, standby

    def leading(self, source: str) -> float:
        """`cgloop_policy_leader` on `source`'s /metrics."""
        return scrape_metrics(self.metrics[source])["cgloop_policy_leader"][()]

    def burst(self) -> None:
        """30 detections at once, and 0.3 s: the leader is busy with them (applies take 20 ms
        each at the agent, one at a time)."""
        for _ in range(30):
            self.send_one()
        time.sleep(0.3)

    def all_decided(self, timeout_s: float = 90) -> None:
        """Until every detection has an action and every action its final result (the
        applies are asynchronous: a result may follow its action by seconds on a busy
        machine)."""
        deadline = time.monotonic() + timeout_s

        def done() -> bool:
            decided = {i for a in self.bus.actions for i in a.reason_detection_ids}
            final = {r.action_id for r in self.bus.results if r.state in FINAL}
            return len(decided) == len(self.sent) and {a.id for a in self.bus.actions} <= final

        while not done():
            assert time.monotonic() < deadline, self.tails()
            self.bus.read(0.5)
        self.bus.read(1.0)  # late duplicates, if any, would show now

    def stop(self) -> None:
        for p in self.procs.values():
            if p.poll() is None:
                p.send_signal(signal.SIGCONT)
                p.send_signal(signal.SIGTERM)
        for p in self.procs.values():
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
        self.bus.consumer.close()

    def check(self, leader: str, standby: str, deposed_ns: int) -> dict[str, list[int]]:
        """Exactly one action id per detection, applied once at the agent, all verified; the
        old leader decided nothing after `deposed_ns`, the new one nothing before. Returns
        each engine's decision times."""
        bus = self.bus
        by_detection: dict[str, set[str]] = defaultdict(set)
        for a in bus.actions:
            for d in a.reason_detection_ids:
                by_detection[d].add(a.id)
        # Exactly one action id per detection, across both engines; none lost.
        assert set(by_detection) == {d.id for d in self.sent}
        assert all(len(ids) == 1 for ids in by_detection.values()), by_detection
        action_ids = {a.id for a in bus.actions}
        assert len(action_ids) == len(self.sent)
        # Applied once each at the agent: one change per action; any second call of an id
        # was answered as a replay (the agent's idempotency by action_id).
        assert self.agent.agent.changes == len(self.sent)
        calls = Counter(i for m, i in self.agent.agent.calls if m == "SetFlowClass")
        assert set(calls) == action_ids
        # Never two deciders at once.
        by_source: dict[str, list[int]] = defaultdict(list)
        for a in bus.actions:
            by_source[a.header.source_id].append(a.header.timestamp_ns)
        assert set(by_source) == {leader, standby}
        assert max(by_source[leader]) < deposed_ns <= min(by_source[standby])
        # Every action reached its end (verified, not checked: --no-verify).
        final = {r.action_id for r in bus.results if r.state == apb.ACTION_STATE_VERIFIED}
        assert final == action_ids, self.story(action_ids - final)
        # The new leader's journal holds every action, the old leader's adopted ones too.
        journal = Journal(None)
        for entry in Journal._read(self.tmp / f"{standby.split('-')[1]}.jsonl"):
            journal._remember(entry)
        assert action_ids <= set(journal.order)
        replays = sum(n - 1 for n in calls.values())
        print(
            f"\n{len(self.sent)} detections, {len(by_source[leader])} decided by the old "
            f"leader, {len(by_source[standby])} by the new; {replays} applies answered as "
            "replays"
        )
        return by_source

    def took_lease_s(self, source: str, since_ns: int) -> float:
        """When `source` last logged taking the lease, in seconds after `since_ns`."""
        stamps = re.findall(
            r"^(\S+ \S+) INFO cgloop\.policy\.standby: \S+: took the lease",
            self.logs[source].read_text(),
            re.M,
        )
        at = datetime.strptime(stamps[-1], "%Y-%m-%d %H:%M:%S,%f").timestamp()
        return at - since_ns / 1e9

    def story(self, ids: set[str]) -> str:
        """What the bus and both journals say of these actions (a failure's message)."""
        lines = []
        for i in sorted(ids):
            for a in self.bus.actions:
                if a.id == i:
                    lines.append(f"{i} action {a.header.source_id} {a.header.sequence}")
            for r in self.bus.results:
                if r.action_id == i:
                    lines.append(
                        f"{i} result {r.header.source_id} {r.header.sequence} "
                        f"{apb.ActionState.Name(r.state)} {r.message}"
                    )
            for name in ("a", "b"):
                for e in Journal._read(self.tmp / f"{name}.jsonl"):
                    if e.action.id == i:
                        lines.append(f"{i} journal {name}: {apb.ActionState.Name(e.state)}")
        return "\n".join(lines) + "\n" + self.tails()

    def tails(self) -> str:
        return "\n".join(f"--- {s}\n{p.read_text()[-3000:]}" for s, p in self.logs.items())


@pytest.fixture
def scenario(stack_settings, tmp_path: Path) -> Iterator[Scenario]:
    # Each apply takes 20 ms at the agent (one at a time): a burst keeps the leader busy
    # deciding, applying and publishing when it is killed or paused.
    with AgentServer(MemoryNodeAgent("node-a", apply_delay_s=0.02)) as agent:
        s = Scenario(stack_settings, tmp_path, agent)
        try:
            yield s
        finally:
            s.stop()


def test_standby_takes_over_from_a_killed_leader(scenario: Scenario) -> None:
    leader, standby = scenario.leader()
    # The crash: mid-burst, nothing committed or flushed on the way out.
    scenario.burst()
    killed_ns = time.time_ns()
    scenario.procs[leader].send_signal(signal.SIGKILL)
    scenario.procs[leader].wait(10)
    scenario.flowing(LEASE_S + 6)
    scenario.all_decided()
    assert scenario.procs[standby].poll() is None, scenario.tails()
    assert scenario.leading(standby) == 1
    by_source = scenario.check(leader, standby, killed_ns)
    failover_s = (min(by_source[standby]) - killed_ns) / 1e9
    print(
        f"failover after SIGKILL: lease taken {scenario.took_lease_s(standby, killed_ns):.2f} s, "
        f"first decision {failover_s:.2f} s after the kill (lease {LEASE_S:g} s)"
    )
    assert failover_s < LEASE_S + 30, scenario.tails()


def test_a_paused_leader_is_fenced_when_it_resumes(scenario: Scenario) -> None:
    leader, standby = scenario.leader()
    # The leader freezes (SIGSTOP) mid-burst, longer than its lease: the standby takes over.
    scenario.burst()
    paused_ns = time.time_ns()
    scenario.procs[leader].send_signal(signal.SIGSTOP)
    deadline = time.monotonic() + LEASE_S + 60
    while not any(a.header.source_id == standby for a in scenario.bus.actions):
        assert time.monotonic() < deadline, scenario.tails()
        scenario.flowing(0.5)
    # It resumes believing it leads: its stale lease is confirmed with the coordinator first,
    # refused, and it decides nothing more while the new leader goes on.
    scenario.procs[leader].send_signal(signal.SIGCONT)
    scenario.flowing(5)
    scenario.all_decided()
    assert all(p.poll() is None for p in scenario.procs.values()), scenario.tails()
    assert (scenario.leading(leader), scenario.leading(standby)) == (0, 1)
    by_source = scenario.check(leader, standby, paused_ns)
    log = scenario.logs[leader].read_text()
    assert "lease revoked or lost" in log or "did not confirm the lease" in log, log[-3000:]
    print(
        f"failover after SIGSTOP: first decision by the standby "
        f"{(min(by_source[standby]) - paused_ns) / 1e9:.2f} s after the pause; the old "
        "leader said:",
        *(line for line in log.splitlines() if "lease" in line),
        sep="\n",
    )
