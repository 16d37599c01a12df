"""Two `cgloop policy run --standby` engines on the real broker: one decides; the leader is
killed (SIGKILL: no commit, no flush, no goodbye to the group) while detections flow; the
standby takes over after the group's session timeout and every detection gets exactly one
action, applied once at the agent (an in-memory NodeAgentService over real gRPC, shared by
both engines), none lost, none decided by two leaders at once."""

from __future__ import annotations

import os
import signal
import subprocess
import time
import uuid
from collections import Counter, defaultdict
from pathlib import Path

import pytest
from cgloop.bus.kafka import BatchConsumer, BatchProducer, ensure_topics
from cgloop.bus.topics import ACTIONS, DETECTIONS
from cgloop.policy.journal import Journal
from cgloop.policy.testing import AgentServer, MemoryNodeAgent, detection, flow
from cgloop.testing import cgloop_cmd
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


def test_standby_takes_over_from_a_killed_leader(stack_settings, tmp_path: Path) -> None:
    bootstrap = stack_settings.bootstrap_servers
    ensure_topics(bootstrap)
    run = uuid.uuid4().hex[:10]
    policy = tmp_path / "policy.yaml"
    policy.write_text(_policy(run))
    group = f"policy-{run}"
    labels = {"node_id": "node-a", "interface": "veth0", "platform": "GFN", "run": run}
    producer = BatchProducer(bootstrap)
    bus = Bus(bootstrap, run)
    procs: dict[str, subprocess.Popen] = {}
    logs: dict[str, Path] = {}
    sent: list[dpb.Detection] = []

    def send_one() -> None:
        det = detection(time.time_ns(), labels=labels, flow=flow(port=40000 + len(sent)))
        sent.append(det)
        producer.send(DETECTIONS.name, dpb.DetectionBatch(records=[det]), key=det.id)
        producer.flush()

    def flowing(seconds: float) -> None:
        """Detections every 0.2 s, reading the bus meanwhile."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            send_one()
            bus.read(0.2)

    with AgentServer(MemoryNodeAgent("node-a")) as agent:
        try:
            for name in ("a", "b"):
                source = f"engine-{name}-{run}"
                logs[source] = tmp_path / f"{name}.log"
                env = {
                    **os.environ,
                    "CGLOOP_KAFKA_BOOTSTRAP": bootstrap,
                    "CGLOOP_STATE_DIR": str(tmp_path / f"state-{name}"),
                    **stack_settings.kafka_security().env(),
                }
                procs[source] = subprocess.Popen(
                    cgloop_cmd(
                        "policy", "run", str(policy), "--agent", f"node-a={agent.address}",
                        "--journal", str(tmp_path / f"{name}.jsonl"), "--group", group,
                        "--source-id", source, "--standby", "--lease-timeout", str(LEASE_S),
                        "--no-verify", "--metrics-addr", "off", "--budget", "1000",
                    ),
                    env=env, stdout=logs[source].open("w"), stderr=subprocess.STDOUT,
                )  # fmt: skip
            # Detections flow until one engine decides, then a few seconds more (both up).
            deadline = time.monotonic() + 90
            while not bus.actions:
                assert time.monotonic() < deadline, _logs(logs)
                assert all(p.poll() is None for p in procs.values()), _logs(logs)
                flowing(0.5)
            flowing(4)
            leader = bus.actions[0].header.source_id
            (standby,) = set(procs) - {leader}
            assert {a.header.source_id for a in bus.actions} == {leader}, "two engines decided"
            # The crash: mid-stream, nothing committed or flushed on the way out.
            killed_ns = time.time_ns()
            procs[leader].send_signal(signal.SIGKILL)
            procs[leader].wait(10)
            flowing(LEASE_S + 6)
            # Every detection decided (by either engine), in bounded time.
            deadline = time.monotonic() + 60
            while len({i for a in bus.actions for i in a.reason_detection_ids}) < len(sent):
                assert time.monotonic() < deadline, _logs(logs)
                bus.read(0.5)
            bus.read(1.0)  # late duplicates, if any, would show now
            assert procs[standby].poll() is None, _logs(logs)
        finally:
            for p in procs.values():
                if p.poll() is None:
                    p.send_signal(signal.SIGTERM)
            for p in procs.values():
                try:
                    p.wait(30)
                except subprocess.TimeoutExpired:
                    p.kill()
            bus.consumer.close()

        by_detection: dict[str, set[str]] = defaultdict(set)
        for a in bus.actions:
            for d in a.reason_detection_ids:
                by_detection[d].add(a.id)
        # Exactly one action id per detection, across both engines; none lost.
        assert set(by_detection) == {d.id for d in sent}
        assert all(len(ids) == 1 for ids in by_detection.values()), by_detection
        action_ids = {a.id for a in bus.actions}
        assert len(action_ids) == len(sent)
        # Applied once each at the agent: one change per action; any second call of an id
        # was answered as a replay (the agent's idempotency by action_id).
        assert agent.agent.changes == len(sent)
        calls = Counter(i for m, i in agent.agent.calls if m == "SetFlowClass")
        assert set(calls) == action_ids
        # Never two deciders at once: the old leader decided nothing after it was killed,
        # the standby nothing before.
        by_source: dict[str, list[int]] = defaultdict(list)
        for a in bus.actions:
            by_source[a.header.source_id].append(a.header.timestamp_ns)
        assert set(by_source) == {leader, standby}
        assert max(by_source[leader]) < killed_ns <= min(by_source[standby])
        # Every action reached its end (verified, not checked: --no-verify).
        final = {r.action_id for r in bus.results if r.state == apb.ACTION_STATE_VERIFIED}
        assert final == action_ids
        # The standby's journal holds every action, the old leader's adopted ones too.
        journal = Journal(None)
        for entry in Journal._read(tmp_path / f"{standby.split('-')[1]}.jsonl"):
            journal._remember(entry)
        assert action_ids <= set(journal.order)
        failover_s = (min(by_source[standby]) - killed_ns) / 1e9
        replays = sum(n - 1 for n in calls.values())
        print(
            f"\nfailover: first decision by the standby {failover_s:.2f} s after the kill "
            f"(lease {LEASE_S:g} s); {len(sent)} detections, {len(by_source[leader])} "
            f"decided by the old leader, {len(by_source[standby])} by the new; {replays} "
            "applies answered as replays"
        )
        assert failover_s < LEASE_S + 30, _logs(logs)


def _logs(logs: dict[str, Path]) -> str:
    return "\n".join(f"--- {s}\n{p.read_text()[-3000:]}" for s, p in logs.items())
