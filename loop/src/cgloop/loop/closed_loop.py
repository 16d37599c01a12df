"""The closed loop on the lab: stack, lab, every service, the scenario, then the report.

`ClosedLoop.start()` brings everything up in dependency order and fails with the name and log
of the service that did not come up; `run(scenario)` plays the lab scenario (traffic and faults)
while the loop runs; `stop()` ends the services (the lab stays up unless asked, so the store and
the lab can be inspected afterwards).
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import time
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import grpc
from cgloop.bus.topics import ANALYTICS_INPUTS
from cgloop.config import Settings
from cgloop.lab.lab import Lab
from cgloop.lab.scenario import Report as LabReport
from cgloop.lab.scenario import Runner, Scenario
from cgloop.lab.sessions import GamingSpec, MediaSession
from cgloop.lab.traffic.stats import Packets
from cgloop.loop.edge import (
    EdgePlan,
    agent_channel,
    agent_toml,
    configure_agent,
    wait_for_probe_records,
)
from cgloop.loop.services import (
    REFLECT_PORT,
    ServiceError,
    Services,
    agent_binary,
    bridge_argv,
    cgloop_exe,
    group_caught_up,
    group_ready,
    probe_binary,
    settings_env,
)
from cgloop.slo import LAB
from cgloop.slo import table as slo_table
from cgloop.v1 import node_agent_pb2 as na
from cgloop.v1.node_agent_pb2_grpc import NodeAgentServiceStub

LOOP_POLICIES = "policies"
# What the analytics worker consumes: the one topic table's list, shared with the worker.
ANALYTICS_TOPICS = ANALYTICS_INPUTS


def policy_values(plan: EdgePlan) -> dict[str, str]:
    """What the policy templates' placeholders become for this edge: its node and bottleneck
    interface, and the gaming latency objective it defends (the SLO table's, cgloop.slo)."""
    return {
        "{edge_node}": plan.node,
        "{edge_interface}": plan.bottleneck,
        "{latency_slo_ns}": str(round(plan.latency_slo_ms * 1_000_000)),
        "{latency_slo_ms}": f"{plan.latency_slo_ms:g}",
    }


def write_policies(folder: Path, plan: EdgePlan) -> Path:
    """The loop's policies for this edge: the packaged templates with its node, interface and
    latency objective (`policy_values`)."""
    folder.mkdir(parents=True, exist_ok=True)
    values = policy_values(plan)
    for src in (resources.files("cgloop.loop") / "data" / LOOP_POLICIES).iterdir():
        if src.name.endswith(".yaml"):
            text = src.read_text()
            for placeholder, value in values.items():
                text = text.replace(placeholder, value)
            (folder / src.name).write_text(text)
    return folder


@dataclass
class LoopOptions:
    """How the loop reacts; `window_s` > 0 averages telemetry over windows (the MOSAICO-style
    baseline the benchmark compares against); `enabled=False` runs everything but the policy
    engine and the agent's micro loop (the no-loop baseline); `micro_loop=False` keeps the
    global loop alone (today's loop: no queue protection, no latency guard on the node)."""

    enabled: bool = True
    micro_loop: bool = True
    # the engine takes the node's own actions as facts (verifies, may roll them back); off, it
    # ignores them (the benchmark's control for what its verification of node moves does)
    node_facts: bool = True
    # the deployment profile of the SLO table (cgloop.slo) the loop defends: the analytics
    # judge every gaming flow by it, the probes report a reply overdue after its latency, the
    # policies protect flows and verify actions against it, the report reads recovery by it
    slo_profile: str = LAB
    # how long a breach lasts before it fires: flow-record metrics (throughput, loss, jitter;
    # a record per 100 ms) and latency (probes every 10 ± 5 ms and their overdue notices)
    slo_min_duration_s: float = 0.2
    latency_min_duration_s: float = 0.05
    window_s: float = 0.0
    probe_interval_ms: int = 100
    # the classifier (`cgloop train`; make setup trains it); default: the project's state dir
    model: Path | None = None
    # each fault is a trial: lead_s of normal traffic, the fault, tail_s after it
    lead_s: float = 6.0
    tail_s: float = 4.0

    @property
    def latency_slo_ms(self) -> float:
        """The gaming latency objective of `slo_profile` (one-way p99, ms)."""
        return slo_table().latency_ms(self.slo_profile)


@dataclass
class Trial:
    name: str
    report: LabReport
    packets: list[Packets]  # each gaming session's downstream packets (ground truth)


def default_scenario() -> Path:
    return Path(str(resources.files("cgloop.loop") / "data" / "scenario.yaml"))


def split_trials(scenario: Scenario, options: LoopOptions) -> list[Scenario]:
    trials = []
    for i, fault in enumerate(scenario.faults):
        traffic = []
        for spec in scenario.traffic:
            if isinstance(spec, GamingSpec):
                spec = spec.model_copy(update={"port": spec.port + 100 * (i + 1)})
            traffic.append(spec)
        trials.append(Scenario(
            duration=options.lead_s + fault.duration + options.tail_s,
            traffic=traffic,
            faults=[fault.model_copy(update={"at": options.lead_s})],
        ))
    return trials


class ClosedLoop:
    """The loop on the lab (`lab` given: services inside its namespaces, reached through the
    bridge) or on this host's own interfaces (`lab=None`, `plan` given: `cgloop run
    --interface`)."""

    def __init__(
        self, lab: Lab | None, scenario: Scenario | None, settings: Settings, run_dir: Path,
        options: LoopOptions | None = None, plan: EdgePlan | None = None,
    ) -> None:
        self.lab, self.scenario, self.settings = lab, scenario, settings
        self.run_dir = run_dir
        self.options = options or LoopOptions()
        if plan is None:
            if lab is None or scenario is None:
                raise ValueError("without a lab, the loop needs an EdgePlan (interfaces)")
            plan = EdgePlan.from_lab(lab.topo, scenario)
        plan.latency_slo_ms = self.options.latency_slo_ms
        self.plan = plan
        self.run_id = run_dir.name
        self.services = Services(lab, run_dir / "logs")
        name = lab.name if lab else "host"
        self.loop_dir = settings.state_dir / "loop" / name
        self.agent_socket = self.loop_dir / "agent.sock"
        self.certs = self.loop_dir / "certs"
        self.credentials: grpc.ChannelCredentials | None = None
        self.policy_source = f"policy-engine/{self.run_id}"
        # The probe's pinned maps (bpffs is one per machine, not per namespace: one dir per lab)
        self.pin_dir = Path(f"/sys/fs/bpf/cgloop-{name}")
        self.name = name
        self.agent_pid: int | None = None

    def _spawn(self, node: str, name: str, argv: list[str]):
        if self.lab is not None:
            return self.services.spawn_lab(node, name, argv)
        return self.services.spawn_host(name, argv)

    # --- start ---------------------------------------------------------------------------------
    def start(self, say=lambda _msg: None) -> None:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        (self.run_dir / "logs").mkdir(exist_ok=True)
        self.loop_dir.mkdir(parents=True, exist_ok=True)
        self.agent_socket.unlink(missing_ok=True)
        s, p, o = self.services, self.plan, self.options
        subprocess.run(
            [str(agent_binary()), "certs", "--out", str(self.certs)],
            check=True, capture_output=True, text=True,
        )
        if self.lab is not None:
            bridge = s.spawn_lab(p.node, "bridge", bridge_argv(self.settings))
            s.wait_for(bridge, s.log_says(bridge, "bridge ready"), 15)
            say("bridge from the edge to the broker and the store")

        config = self.run_dir / "agent.toml"
        config.write_text(agent_toml(
            p, str(self.run_dir / "agent-journal.pb"), self.settings.bootstrap_servers,
            micro_loop=o.enabled and o.micro_loop,
        ))
        agent = self._spawn(p.node, "node-agent", [
            str(agent_binary()), "serve", "--config", str(config),
            "--listen", f"unix:{self.agent_socket}", "--tls-dir", str(self.certs),
        ])
        s.wait_for(agent, s.log_says(agent, "listening on"), 30)
        self.agent_pid = agent.proc.pid  # what the benchmark measures the agent's cost on
        for t in p.targets if self.lab is not None else []:
            # On real interfaces the clients run `cgloop-node-agent reflect` themselves. The
            # reflector listens on loopback unless told: here, the client's lab address, the
            # one the probes target.
            s.spawn_lab(t.client, f"reflector-{t.client}", [
                str(agent_binary()), "reflect", "--listen", f"{t.address}:{REFLECT_PORT}",
            ])
        creds = grpc.ssl_channel_credentials(
            root_certificates=(self.certs / "ca.pem").read_bytes(),
            private_key=(self.certs / "client.key").read_bytes(),
            certificate_chain=(self.certs / "client.pem").read_bytes(),
        )
        self.credentials = creds
        # Closed once configured: services and generators are forked from this process.
        with agent_channel(str(self.agent_socket), creds) as channel:
            stub = NodeAgentServiceStub(channel)
            configure_agent(stub, p, self.run_id)
            if p.targets:
                wait_for_probe_records(stub)
        say(f"node agent on {p.node}: queues on {p.bottleneck}, {len(p.targets) * 2} probes")

        probe = self._spawn(p.node, "flow-probe", [
            str(probe_binary()), "run", *(a for i in p.interfaces for a in ("-i", i)),
            "--no-egress", "--kafka", self.settings.bootstrap_servers,
            "--source-id", f"{p.node}/flow-probe", "--interval-ms", str(o.probe_interval_ms),
            "--pin-dir", str(self.pin_dir),
            "--function", f"{p.node}={','.join(p.interfaces)}",
        ])
        s.wait_for(probe, s.log_says(probe, "cgloop-probe: observing"), 30)
        say(f"flow probe on {p.node}: {', '.join(p.interfaces)}")

        # Stable group names: a later run resumes where this one stopped instead of replaying
        # the topics from their start; the journals make a restarted engine repeat nothing.
        analytics_group = f"cgloop-loop-analytics-{self.name}"
        model = o.model or Settings().state_dir / "analytics" / "flow-classifier.skops"
        if not model.is_file():
            raise ServiceError(
                f"no flow classifier at {model}: the loop cannot recognise gaming flows without "
                "it (`make setup` trains it; or run `cgloop train --out FILE`)"
            )
        analytics_argv = [
            cgloop_exe(), "analytics", "run", "--group", analytics_group, "--model", str(model),
            "--state", str(self.loop_dir / "analytics-state.json"),
            "--slo-profile", o.slo_profile,
            "--slo-min-duration-s", str(o.slo_min_duration_s),
            "--latency-min-duration-s", str(o.latency_min_duration_s),
        ]
        if o.window_s > 0:
            analytics_argv += ["--latency-window-s", str(o.window_s)]
        env = {**settings_env(self.settings), "PYTHONUNBUFFERED": "1"}
        analytics = s.spawn_host("analytics", analytics_argv, env=env)
        s.wait_for(analytics, group_ready(self.settings.bootstrap_servers, analytics_group), 90)
        # Ready means caught up: the records written while it loaded its model are handled,
        # so what it detects from now on is current.
        t = time.monotonic()
        s.wait_for(analytics, group_caught_up(
            self.settings.bootstrap_servers, analytics_group, ANALYTICS_TOPICS), 120)
        say(f"analytics worker (caught up in {time.monotonic() - t:.1f} s)")

        if o.enabled:
            policy_group = f"cgloop-loop-policy-{self.name}"
            policies = write_policies(self.run_dir / "policies", p)
            policy = s.spawn_host("policy-engine", [
                cgloop_exe(), "policy", "run", str(policies),
                "--agent", f"{p.node}=unix:{self.agent_socket}",
                "--agent-tls-dir", str(self.certs),
                "--journal", str(self.loop_dir / "policy-journal.jsonl"),
                "--group", policy_group,
                "--source-id", self.policy_source,
                *(() if o.node_facts else ("--no-node-facts",)),
            ], env=env)
            s.wait_for(policy, group_ready(self.settings.bootstrap_servers, policy_group), 90)
            say("policy engine")

    # --- run -----------------------------------------------------------------------------------
    def run(self, say=lambda _msg: None) -> list[Trial]:
        assert self.lab is not None and self.scenario is not None
        """Each fault of the scenario as its own trial: the scenario's traffic with fresh gaming
        flows (new ports, so nothing the loop did in an earlier trial protects them), `lead_s`
        of normal traffic, the fault, `tail_s` to recover and settle."""
        trials = []
        for i, sc in enumerate(split_trials(self.scenario, self.options)):
            name = f"trial{i:02d}-{sc.faults[0].kind}"
            runner = Runner(self.lab, sc, self.run_dir / name, on_event=say)
            report = runner.run()
            dead = self.services.check()
            if dead:
                raise ServiceError("services died during the scenario:\n" + "\n".join(dead))
            packets = []
            for ident, session in runner.sessions.items():
                if ident.startswith("gaming") and isinstance(session, MediaSession):
                    with contextlib.suppress(OSError):
                        packets.append(session.packets("down"))
            trials.append(Trial(name, report, packets))
        return trials

    def agent_state(self) -> na.NodeState | None:
        """What the node agent has applied (queues, flow rules, probes), or None."""
        if self.credentials is None:
            return None
        try:
            with agent_channel(str(self.agent_socket), self.credentials) as channel:
                return NodeAgentServiceStub(channel).GetState(na.GetStateRequest(), timeout=5).state
        except grpc.RpcError:
            return None

    def stop(self) -> None:
        self.services.stop()
        self.agent_socket.unlink(missing_ok=True)
        shutil.rmtree(self.pin_dir, ignore_errors=True)  # pins outlive the probe by design

