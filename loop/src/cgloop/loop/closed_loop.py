"""The closed loop on the lab: stack, lab, every service, the scenario, then the report.

`ClosedLoop.start()` brings everything up in dependency order and fails with the name and log
of the service that did not come up; `run(scenario)` plays the lab scenario (traffic and faults)
while the loop runs; `stop()` ends the services (the lab stays up unless asked, so the store and
the lab can be inspected afterwards).

On the multi-node lab (lab v2: `core` ══ `edgeN` ══ `cpeN`), per edge node: a bridge to the
broker, its node agent (queues on `cpeN`, probes to its gaming clients, the gaming class's
service chain, an emulated power sysfs tree), its flow probe; on the core: a bridge, its agent
(HTB on every core→edge link, the INT source when the agent has one) and the INT collector; on
loopback beside the broker: the ONOS contract server (no ONOS runs here), two analytics workers
in one consumer group and one policy engine driving every agent.
"""

from __future__ import annotations

import contextlib
import re
import secrets
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

import grpc
import yaml
from cgloop.binaries import find_binary
from cgloop.bus.topics import ANALYTICS_INPUTS
from cgloop.config import Settings
from cgloop.lab.lab import Lab, in_netns
from cgloop.lab.scenario import FaultEvent, Runner, Scenario
from cgloop.lab.scenario import Report as LabReport
from cgloop.lab.sessions import GamingSpec, MediaSession
from cgloop.lab.traffic.stats import Packets
from cgloop.loop.core import (
    CorePlan,
    core_agent_toml,
    int_collector_argv,
)
from cgloop.loop.edge import (
    EdgePlan,
    agent_channel,
    agent_toml,
    apply_chain,
    configure_agent,
    edge_plans,
    wait_for_probe_records,
)
from cgloop.loop.power import write_sysfs
from cgloop.loop.services import (
    REFLECT_PORT,
    Service,
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
EDGE_TEMPLATE = "loop.yaml"  # rendered once per edge node
LEVERS_TEMPLATE = "levers.yaml"  # rendered once (the core, ONOS, the global levers)
# What the analytics worker consumes: the one topic table's list, shared with the worker.
ANALYTICS_TOPICS = ANALYTICS_INPUTS
# Two workers in one consumer group: the group splits the partitions, no detection twice.
ANALYTICS_WORKERS = 2


# A policy's id line in a template: `  - id: lab-gaming-protect`
POLICY_ID = re.compile(r"^(\s*-\s+id:\s*)([A-Za-z0-9_.-]+)\s*$", re.MULTILINE)


def slo_values(latency_slo_ms: float) -> dict[str, str]:
    return {
        "{latency_slo_ns}": str(round(latency_slo_ms * 1_000_000)),
        "{latency_slo_ms}": f"{latency_slo_ms:g}",
    }


# The engine's global budget of changes per minute in the loop (the engine's default is 20): a
# lab trial every ~19 s brings fresh gaming sessions, each protected on its edge and on the core
# and placed once, besides the fault's own levers: about 30 changes a minute, which the
# default would cut short mid-trial (the joining session's placement refused by "guard budget").
ENGINE_BUDGET_PER_MIN = 60


def policy_values(plan: EdgePlan) -> dict[str, str]:
    """What the edge template's placeholders become for this edge: its node and bottleneck
    interface, and the gaming latency objective it defends (the SLO table's, cgloop.slo)."""
    return {
        "{edge_node}": plan.node,
        "{edge_interface}": plan.bottleneck,
        **slo_values(plan.latency_slo_ms),
    }


def lever_values(core: CorePlan, latency_slo_ms: float) -> dict[str, str]:
    """What the levers template's placeholders become: the core node, its ONOS device id and
    the gaming latency objective."""
    return {
        "{core_node}": core.node,
        "{core_device_id}": core.device_id,
        **slo_values(latency_slo_ms),
    }


def _template(name: str) -> str | None:
    src = resources.files("cgloop.loop") / "data" / LOOP_POLICIES / name
    return src.read_text() if src.is_file() else None


def _render(text: str, values: dict[str, str]) -> str:
    for placeholder, value in values.items():
        text = text.replace(placeholder, value)
    return text


def write_policies(folder: Path, plan: EdgePlan, suffix: bool = True) -> Path:
    """The edge template for this edge (`loop-<node>.yaml`): its node, interface and latency
    objective (`policy_values`), every policy id suffixed with the node (`-edge1`) so the
    policies of several edges load side by side."""
    folder.mkdir(parents=True, exist_ok=True)
    text = _template(EDGE_TEMPLATE)
    if text is None:
        raise FileNotFoundError(f"the loop's {EDGE_TEMPLATE} policy template is not packaged")
    text = _render(text, policy_values(plan))
    if suffix:  # in the text, so the template's comments stay with the policies
        text = POLICY_ID.sub(lambda m: f"{m[1]}{m[2]}-{plan.node}", text)
    ids = [p["id"] for p in yaml.safe_load(text)["policies"]]
    if suffix and not all(i.endswith(f"-{plan.node}") for i in ids):
        raise ValueError(f"{EDGE_TEMPLATE}: a policy id is not on a `- id: NAME` line: {ids}")
    out = folder / f"loop-{plan.node}.yaml"
    out.write_text(text)
    return folder


def write_levers(folder: Path, core: CorePlan, latency_slo_ms: float) -> Path | None:
    """The levers template rendered once (`levers.yaml`), or None while it is not packaged."""
    text = _template(LEVERS_TEMPLATE)
    if text is None:
        return None
    folder.mkdir(parents=True, exist_ok=True)
    out = folder / LEVERS_TEMPLATE
    out.write_text(_render(text, lever_values(core, latency_slo_ms)))
    return out


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
    # each fault is a trial: lead_s of normal traffic, the fault, tail_s after it. 10 s: on
    # the loaded 2-core lab v2 a trial's sessions began sending up to 5.8 s after the trial
    # started, and a fresh gaming flow must be classified and protected before the fault
    lead_s: float = 10.0
    tail_s: float = 4.0

    @property
    def latency_slo_ms(self) -> float:
        """The gaming latency objective of `slo_profile` (one-way p99, ms)."""
        return slo_table().latency_ms(self.slo_profile)


# A gaming session that joins mid-scenario is a trial of its own (`session_join`): the loop
# must classify it and place its chain (LB / LC / LBLC) within this long after it starts.
JOIN_WATCH_S = 8.0
SESSION_JOIN = "session_join"


@dataclass
class Trial:
    name: str
    report: LabReport
    packets: list[Packets]  # each gaming session's downstream packets (ground truth)
    # the fault events the report reads: the lab's, or a session join made into one
    faults: list[FaultEvent] = field(default_factory=list)


def default_scenario() -> Path:
    return Path(str(resources.files("cgloop.loop") / "data" / "scenario.yaml"))


def _late(spec) -> bool:
    return getattr(spec, "at", 0.0) > 0


def split_trials(scenario: Scenario, options: LoopOptions) -> list[Scenario]:
    """Each fault, then each session that joins late, as a trial of its own: the scenario's
    traffic from the start (late sessions left out) with fresh gaming flows (ports shifted by
    100 per trial), `lead_s` of it, the fault (or the session joining), `tail_s` after it."""
    base = [spec for spec in scenario.traffic if not _late(spec)]

    def fresh(specs: list, i: int) -> list:
        return [
            spec.model_copy(update={"port": spec.port + 100 * (i + 1)})
            if isinstance(spec, GamingSpec) else spec
            for spec in specs
        ]

    trials = []
    for i, fault in enumerate(scenario.faults):
        trials.append(Scenario(
            duration=options.lead_s + fault.duration + options.tail_s,
            traffic=fresh(base, i),
            faults=[fault.model_copy(update={"at": options.lead_s})],
        ))
    for spec in scenario.traffic:
        if _late(spec):
            i = len(trials)
            joining = spec.model_copy(update={"at": options.lead_s})
            trials.append(Scenario(
                duration=options.lead_s + JOIN_WATCH_S + options.tail_s,
                traffic=fresh([*base, joining], i),
            ))
    return trials


def trial_faults(sc: Scenario, report: LabReport) -> list[FaultEvent]:
    """The lab's fault events of a trial; for a trial without faults, each late session's
    start made into a `session_join` event (onset: its first scheduled send)."""
    if sc.faults:
        return list(report.faults)
    late = {
        (t.kind, getattr(t, "port", None)) for t in sc.traffic if _late(t)
    }
    return [
        FaultEvent(
            id=f"join-{ev.id}", kind=SESSION_JOIN, spec=ev.spec, onset_ns=ev.start_ns,
            end_ns=ev.start_ns + int(JOIN_WATCH_S * 1e9), apply_ms=0.0,
        )
        for ev in report.traffic
        if (ev.kind, ev.spec.get("port")) in late
    ]


@dataclass
class NodeRuntime:
    """One lab node's services of the loop: its agent's socket, its flow probe's pins."""

    node: str
    socket: Path
    pin_dir: Path | None = None
    agent: Service | None = None


@dataclass
class Notes:
    """What the report says about the run beside the faults: what is emulated, what was left
    out and why (one line each)."""

    lines: list[str] = field(default_factory=list)

    def add(self, line: str, say=lambda _msg: None) -> None:
        self.lines.append(line)
        say(line)


class ClosedLoop:
    """The loop on the lab (`lab` given: services inside its namespaces, reached through the
    bridges) or on this host's own interfaces (`lab=None`, `plan` given: `cgloop run
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
            plans = edge_plans(lab.topo, scenario)
            self.core = CorePlan.from_lab(lab.topo)
        else:
            plans, self.core = [plan], None
        for p in plans:
            p.latency_slo_ms = self.options.latency_slo_ms
        self.plans = plans
        self.plan = plans[0]  # the first edge (single-edge callers)
        self.run_id = run_dir.name
        self.services = Services(lab, run_dir / "logs")
        name = lab.name if lab else "host"
        self.loop_dir = settings.state_dir / "loop" / name
        # One CA and one client certificate for every agent: the engine has one TLS directory
        # (--agent-tls-dir); each agent listens on its own Unix socket.
        self.certs = self.loop_dir / "certs"
        self.credentials: grpc.ChannelCredentials | None = None
        self.policy_source = f"policy-engine/{self.run_id}"
        self.name = name
        # The probes' pinned maps (bpffs is one per machine, not per namespace: one dir per
        # lab and edge)
        self.nodes: dict[str, NodeRuntime] = {
            p.node: NodeRuntime(p.node, self.loop_dir / f"agent-{p.node}.sock",
                                Path(f"/sys/fs/bpf/cgloop-{name}-{p.node}"))
            for p in plans
        }
        if self.core is not None:
            self.nodes[self.core.node] = NodeRuntime(
                self.core.node, self.loop_dir / f"agent-{self.core.node}.sock")
        self.agent_socket = self.nodes[self.plan.node].socket
        self.pin_dir = self.nodes[self.plan.node].pin_dir
        self.agent_pid: int | None = None
        self.agent_pids: dict[str, int] = {}
        self.onos = None  # the ONOS contract server (cgloop.actuators.onos.contract)
        self.analytics_workers: list[Service] = []
        self.analytics_group = ""
        self.int_export = False  # whether the core's agent is the lab's INT source
        self.notes = Notes()

    def _spawn(self, node: str, name: str, argv: list[str]):
        if self.lab is not None:
            return self.services.spawn_lab(node, name, argv)
        return self.services.spawn_host(name, argv)

    def _stub_call(self, node: str, fn) -> object:
        assert self.credentials is not None
        with agent_channel(str(self.nodes[node].socket), self.credentials) as channel:
            return fn(NodeAgentServiceStub(channel))

    # --- start ---------------------------------------------------------------------------------
    def start(self, say=lambda _msg: None) -> None:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        (self.run_dir / "logs").mkdir(exist_ok=True)
        self.loop_dir.mkdir(parents=True, exist_ok=True)
        for rt in self.nodes.values():
            rt.socket.unlink(missing_ok=True)
        subprocess.run(
            [str(agent_binary()), "certs", "--out", str(self.certs)],
            check=True, capture_output=True, text=True,
        )
        self.credentials = grpc.ssl_channel_credentials(
            root_certificates=(self.certs / "ca.pem").read_bytes(),
            private_key=(self.certs / "client.key").read_bytes(),
            certificate_chain=(self.certs / "client.pem").read_bytes(),
        )
        if self.lab is not None:
            for node in self.nodes:
                bridge = self.services.spawn_lab(node, f"bridge-{node}",
                                                 bridge_argv(self.settings))
                self.services.wait_for(bridge, self.services.log_says(bridge, "bridge ready"), 15)
            say(f"bridges to the broker and the store from {', '.join(self.nodes)}")
        for plan in self.plans:
            self._start_edge(plan, say)
        if self.lab is not None:
            self.notes.add(
                "power: this VM has no cpufreq; each edge's agent reads and writes an emulated "
                f"sysfs tree (cpufreq, cpuidle) under {self.run_dir / 'sysfs'}")
        if self.core is not None:
            self._start_core(self.core, say)
        self._start_analytics(say)
        if self.options.enabled:
            self._start_onos(say)
            self._start_engine(say)

    def _start_agent(self, node: str, config_text: str) -> Service:
        config = self.run_dir / f"agent-{node}.toml"
        config.write_text(config_text)
        rt = self.nodes[node]
        agent = self._spawn(node, f"node-agent-{node}", [
            str(agent_binary()), "serve", "--config", str(config),
            "--listen", f"unix:{rt.socket}", "--tls-dir", str(self.certs),
        ])
        rt.agent = agent
        return agent

    def _start_edge(self, p: EdgePlan, say) -> None:
        s, o = self.services, self.options
        # The probe first: the agent's power module opens the probe's pinned per-function
        # counters when it starts (X-MAN's input), so they must exist by then. The probe
        # needs nothing of the agent (XDP at ingress of the edge's interfaces; the agent
        # attaches XDP only to its own AF_XDP ports).
        rt = self.nodes[p.node]
        probe = self._spawn(p.node, f"flow-probe-{p.node}", [
            str(probe_binary()), "run", *(a for i in p.interfaces for a in ("-i", i)),
            "--no-egress", "--kafka", self.settings.bootstrap_servers,
            "--source-id", f"{p.node}/flow-probe", "--interval-ms", str(o.probe_interval_ms),
            "--pin-dir", str(rt.pin_dir),
            "--function", f"{p.node}={','.join(p.interfaces)}",
        ])
        s.wait_for(probe, s.log_says(probe, "cgloop-probe: observing"), 30)
        say(f"flow probe on {p.node}: {', '.join(p.interfaces)}")
        if self.lab is not None:
            # this VM has no cpufreq: the agent's power module writes an emulated tree
            tree = write_sysfs(self.run_dir / "sysfs" / p.node)
            p.cpufreq_root, p.cpuidle_root = tree.cpufreq_root, tree.cpuidle_root
            p.cgroup = self.lab.cgroup(p.node)  # its share of the shared cores
        p.pin_dir = self.nodes[p.node].pin_dir  # X-MAN reads the probe's function counters
        agent = self._start_agent(p.node, agent_toml(
            p, str(self.run_dir / f"agent-journal-{p.node}.pb"), self.settings.bootstrap_servers,
            micro_loop=o.enabled and o.micro_loop,
        ))
        s.wait_for(agent, s.log_says(agent, "listening on"), 30)
        self.agent_pids[p.node] = agent.proc.pid
        if p.node == self.plan.node:
            self.agent_pid = agent.proc.pid  # what the benchmark measures the agent's cost on
        for t in p.targets if self.lab is not None else []:
            # On real interfaces the clients run `cgloop-node-agent reflect` themselves. The
            # reflector listens on loopback unless told: here, the client's lab address, the
            # one the probes target.
            s.spawn_lab(t.client, f"reflector-{t.client}", [
                str(agent_binary()), "reflect", "--listen", f"{t.address}:{REFLECT_PORT}",
            ])

        def configure(stub: NodeAgentServiceStub) -> str:
            configure_agent(stub, p, self.run_id)
            if p.targets:
                wait_for_probe_records(stub)
            if self.lab is None:
                return ""
            try:
                applied = apply_chain(stub, p, self.run_id)
            except grpc.RpcError as exc:
                self.notes.add(f"{p.node}: the gaming chain was refused by the agent: "
                               f"{exc.code().name} {exc.details()}", say)
                return ""
            return f", chain {'→'.join(f.WhichOneof('function') for f in applied.functions)}"

        chain = self._stub_call(p.node, configure)
        say(f"node agent on {p.node}: queues on {p.bottleneck}, {len(p.targets) * 2} probes"
            f"{chain}")

    def _start_core(self, c: CorePlan, say) -> None:
        s = self.services
        journal = str(self.run_dir / f"agent-journal-{c.node}.pb")
        if self.lab is not None:
            c.cgroup = self.lab.cgroup(c.node)
        o = self.options
        agent = self._start_agent(c.node, core_agent_toml(
            c, journal, self.settings.bootstrap_servers, micro_loop=o.enabled and o.micro_loop))
        s.wait_for(agent, s.log_says(agent, "listening on"), 30)
        self.int_export = True
        self.agent_pids[c.node] = agent.proc.pid

        def configure(stub: NodeAgentServiceStub) -> None:
            for h in c.hierarchies():
                stub.ApplyQueueHierarchy(na.ApplyQueueHierarchyRequest(
                    action_id=f"{self.run_id}-queues-{c.node}-{h.interface_name}", hierarchy=h,
                ), timeout=10)

        self._stub_call(c.node, configure)
        if self.lab is not None:
            c.int_ports = in_netns(self.lab.ns(c.node), lambda: {
                socket.if_nametoindex(i): i for i in c.edges})
        say(f"node agent on {c.node}: queues on {', '.join(c.edges)}"
            + (", INT source (switch id 1)" if self.int_export else ""))
        if self.int_export:
            collector = self._spawn(c.node, "int-collector", int_collector_argv(
                str(find_binary("cgloop-int-collector")), self.settings.bootstrap_servers,
                f"{c.node}/int-collector"))
            s.wait_for(collector, s.log_says(collector, '"listening"'), 30)
            say(f"INT collector on {c.node} (127.0.0.1:32766)")

    def _start_analytics(self, say) -> None:
        s, o = self.services, self.options
        # Stable group names: a later run resumes where this one stopped instead of replaying
        # the topics from their start; the journals make a restarted engine repeat nothing.
        analytics_group = f"cgloop-loop-analytics-{self.name}"
        model = o.model or Settings().state_dir / "analytics" / "flow-classifier.skops"
        if not model.is_file():
            raise ServiceError(
                f"no flow classifier at {model}: the loop cannot recognise gaming flows without "
                "it (`make setup` trains it; or run `cgloop train --out FILE`)"
            )
        env = {**settings_env(self.settings), "PYTHONUNBUFFERED": "1"}
        workers = []
        for i in range(1, ANALYTICS_WORKERS + 1):
            argv = [
                cgloop_exe(), "analytics", "run", "--group", analytics_group,
                "--model", str(model),
                "--state", str(self.loop_dir / f"analytics-state-{i}.json"),
                "--slo-profile", o.slo_profile,
                "--slo-min-duration-s", str(o.slo_min_duration_s),
                "--latency-min-duration-s", str(o.latency_min_duration_s),
            ]
            if self.core is not None and self.int_export:
                argv += self.core.analytics_args()
            if i > 1:  # the first has the ops table's port; the others any free one
                argv += ["--metrics-addr", "127.0.0.1:0"]
            if o.window_s > 0:
                argv += ["--latency-window-s", str(o.window_s)]
            workers.append(s.spawn_host(f"analytics-{i}", argv, env=env))
        ready = group_ready(self.settings.bootstrap_servers, analytics_group, len(workers))
        for w in workers:
            s.wait_for(w, ready, 90)
        # Ready means caught up: the records written while they loaded the model are handled,
        # so what they detect from now on is current.
        t = time.monotonic()
        s.wait_for(workers[0], group_caught_up(
            self.settings.bootstrap_servers, analytics_group, ANALYTICS_TOPICS), 120)
        say(f"{len(workers)} analytics workers in group {analytics_group} "
            f"(caught up in {time.monotonic() - t:.1f} s)")
        self.analytics_workers, self.analytics_group = workers, analytics_group

    def wait_caught_up(self, say=lambda _msg: None, timeout_s: float = 120.0) -> None:
        """The analytics group has handled what the topics held a moment ago: what the
        services wrote while the rest of the loop started (the engine, the ONOS server) is
        backlog, and a worker that took partitions replays `rebuild_s` of them first."""
        if not self.analytics_workers:
            return
        t = time.monotonic()
        self.services.wait_for(self.analytics_workers[0], group_caught_up(
            self.settings.bootstrap_servers, self.analytics_group, ANALYTICS_TOPICS), timeout_s)
        say(f"analytics caught up again in {time.monotonic() - t:.1f} s")

    def _start_onos(self, say) -> None:
        """The ONOS contract server on loopback, with the core as its one switch: no ONOS runs
        here; the server validates every request as ONOS's codecs would and records it."""
        if self.core is None:
            return
        from cgloop.actuators.onos.contract import OnosContractServer

        self.onos = OnosContractServer(password=secrets.token_urlsafe(12)).__enter__()
        self.onos.add_device(self.core.device_id, ports=len(self.core.interfaces))
        self.notes.add(f"ONOS: no ONOS runs here; the ONOS contract server on {self.onos.url} "
                       f"validated and recorded the rules (device {self.core.device_id} = "
                       f"{self.core.node})", say)

    def onos_env(self) -> dict[str, str]:
        if self.onos is None:
            return {}
        return {"CGLOOP_ONOS_URL": self.onos.url, "CGLOOP_ONOS_USERNAME": self.onos.username,
                "CGLOOP_ONOS_PASSWORD": self.onos.password}

    def write_all_policies(self) -> Path:
        folder = self.run_dir / "policies"
        for p in self.plans:
            write_policies(folder, p)
        if self.core is not None and write_levers(
                folder, self.core, self.options.latency_slo_ms) is None:
            self.notes.add(f"no {LEVERS_TEMPLATE} policy template yet: the core, power, chain "
                           "and ONOS levers have no policy")
        return folder

    def _start_engine(self, say) -> None:
        s = self.services
        env = {**settings_env(self.settings), "PYTHONUNBUFFERED": "1", **self.onos_env()}
        policy_group = f"cgloop-loop-policy-{self.name}"
        policies = self.write_all_policies()
        agents = [a for node, rt in self.nodes.items()
                  for a in ("--agent", f"{node}=unix:{rt.socket}")]
        policy = s.spawn_host("policy-engine", [
            cgloop_exe(), "policy", "run", str(policies), *agents,
            "--agent-tls-dir", str(self.certs),
            "--journal", str(self.loop_dir / "policy-journal.jsonl"),
            "--group", policy_group,
            "--source-id", self.policy_source,
            "--budget", str(ENGINE_BUDGET_PER_MIN),
            *(() if self.options.node_facts else ("--no-node-facts",)),
        ], env=env)
        s.wait_for(policy, group_ready(self.settings.bootstrap_servers, policy_group), 90)
        say(f"policy engine driving {', '.join(self.nodes)}")

    # --- run -----------------------------------------------------------------------------------
    def run(self, say=lambda _msg: None) -> list[Trial]:
        """Each fault of the scenario as its own trial: the scenario's traffic with fresh gaming
        flows (new ports, so nothing the loop did in an earlier trial protects them), `lead_s`
        of normal traffic, the fault, `tail_s` to recover and settle."""
        assert self.lab is not None and self.scenario is not None
        self.wait_caught_up(say)
        trials = []
        for i, sc in enumerate(split_trials(self.scenario, self.options)):
            name = f"trial{i:02d}-{sc.faults[0].kind if sc.faults else SESSION_JOIN}"
            if i:
                self._restore_chains(i, say)
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
            trials.append(Trial(name, report, packets, trial_faults(sc, report)))
        return trials

    def _restore_chains(self, trial: int, say) -> None:
        """Each edge's gaming chain as the lab sets it up (`EdgePlan.chain`), before a trial:
        a re-placement an earlier trial's fault led to is not carried into the next, so every
        function-overload fault meets dpi on its own core (in the benchmark, the first fault's
        re-placement had left the next two nothing to starve)."""
        for p in self.plans:
            try:
                self._stub_call(p.node, lambda stub, p=p: apply_chain(
                    stub, p, f"{self.run_id}-t{trial}"))
            except grpc.RpcError as exc:
                self.notes.add(f"{p.node}: restoring the gaming chain before trial {trial} was "
                               f"refused: {exc.code().name} {exc.details()}", say)

    def agent_state(self, node: str | None = None) -> na.NodeState | None:
        """What a node agent (the first edge's unless named) has applied, or None."""
        if self.credentials is None:
            return None
        try:
            return self._stub_call(node or self.plan.node, lambda stub: stub.GetState(
                na.GetStateRequest(), timeout=5).state)
        except grpc.RpcError:
            return None

    def onos_rules(self) -> dict[str, int]:
        """What the ONOS contract server recorded: flows, intents, meters."""
        if self.onos is None:
            return {}
        st = self.onos.state
        return {"flows": len(st.flows), "intents": len(st.intents),
                "meters": sum(len(m) for m in st.meters.values())}

    def stop(self) -> None:
        self.services.stop()
        if self.onos is not None:
            self.onos.close()
        for rt in self.nodes.values():
            rt.socket.unlink(missing_ok=True)
            if rt.pin_dir is not None:
                shutil.rmtree(rt.pin_dir, ignore_errors=True)  # pins outlive the probe

    @property
    def node_ids(self) -> list[str]:
        return list(self.nodes)
