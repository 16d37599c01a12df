"""`cgloop policy …` commands: validate, schema, run, pending/approve/reject, plan."""

from __future__ import annotations

import json
import signal
import threading
import time
from pathlib import Path
from typing import Annotated

import typer
import yaml
from cgloop import metrics
from cgloop.bus.topics import ACTIONS
from cgloop.contracts.ops import Daemon
from rich.console import Console
from rich.markup import escape
from rich.table import Table

console = Console()
err = Console(stderr=True)

DEFAULT_SOURCE_ID = "policy-engine"

PathsArg = Annotated[
    list[Path] | None,
    typer.Argument(help="policy files or folders; default: the shipped policies"),
]


def _load(paths: list[Path] | None):
    from cgloop.policy import model

    try:
        return model.load_policies(paths) if paths else model.default_policies()
    except model.PolicyError as exc:
        for problem in exc.problems:
            # One line per problem at any terminal width: people grep "file:line: field".
            err.print(f"[red]error[/red] {escape(str(problem))}", highlight=False, soft_wrap=True)
        raise typer.Exit(1) from None


def validate(paths: PathsArg = None) -> None:
    """Check policy files against the schema; errors name file, line and field."""
    policies = _load(paths)
    table = Table("id", "level", "mode", "matches", "operation", "hold")
    for p in policies:
        table.add_row(
            p.id,
            p.level.value,
            p.mode.value,
            ",".join(k.value for k in p.match.kinds),
            p.action.operation.value,
            f"{p.guards.hold_time:g}s",
        )
    console.print(table)
    console.print(f"{len(policies)} policies valid")


def schema(
    write: Annotated[bool, typer.Option(help="rewrite the published policy.schema.json")] = False,
) -> None:
    """Print the JSON Schema of policy files."""
    from cgloop.policy import model

    if write:
        model.write_schema()
        console.print(f"wrote {model.SCHEMA_PATH}")
    else:
        print(json.dumps(model.json_schema(), indent=2, sort_keys=True))


def _state_dir() -> Path:
    from cgloop.config import Settings

    return Settings().state_dir / "policy"


def run(
    paths: PathsArg = None,
    agent: Annotated[
        list[str] | None, typer.Option(help="node agent address: NODE_ID=HOST:PORT (repeat)")
    ] = None,
    journal: Annotated[Path | None, typer.Option(help="journal file")] = None,
    budget: Annotated[int, typer.Option(help="global budget: actions per window")] = 20,
    budget_window: Annotated[float, typer.Option(help="budget window, seconds")] = 60.0,
    verify: Annotated[bool, typer.Option(help="read probes/flows topics to verify")] = True,
    group: Annotated[str, typer.Option(help="Kafka consumer group")] = "cgloop-policy-engine",
    source_id: Annotated[
        str, typer.Option(help="source id on action records")
    ] = DEFAULT_SOURCE_ID,
    agent_tls_dir: Annotated[
        Path | None,
        typer.Option(help="mutual TLS to the node agents: ca.pem, client.pem, client.key"),
    ] = None,
    node_facts: Annotated[
        bool,
        typer.Option(help=f"read the node agents' own actions ({ACTIONS.name}) as facts"),
    ] = True,
    metrics_addr: Annotated[str | None, metrics.option(Daemon.DAEMON_POLICY_ENGINE)] = None,
    overload_margin: Annotated[
        float,
        typer.Option(
            min=0.05,
            max=1.0,
            help="overload guard: a chain change keeps every function instance under this "
            "share of its R_max (from the node samples); also function.busy_ratio's bound",
        ),
    ] = 0.8,
    max_instances: Annotated[
        int,
        typer.Option(
            min=1,
            max=64,
            help="most instances the scale-out planner gives a function (the agents' "
            "[bounds] max_function_instances)",
        ),
    ] = 4,
    standby: Annotated[
        bool,
        typer.Option(
            help="run as one of several engines of the --group, of which one decides at a "
            "time (a lease through Kafka's group protocol: group GROUP.leader); the others "
            "mirror its actions into their journals and take over when it stops or dies. "
            "Each engine needs its own --source-id and journal",
        ),
    ] = False,
    lease_timeout: Annotated[
        float,
        typer.Option(
            min=1.0,
            max=300.0,
            help="with --standby: seconds without a heartbeat after which the group deposes a "
            "leader and a standby takes over (Kafka's session.timeout.ms; the broker's "
            "group.min.session.timeout.ms, 6 s by default, bounds it from below)",
        ),
    ] = 10.0,
) -> None:
    """Run the engine: detections from Kafka in, actions to the node agents and Kafka out.

    It also reads the node samples (cores, chain function counters) for the overload guard
    and the chain planners."""
    from cgloop import logs
    from cgloop.config import Settings
    from cgloop.policy import service
    from cgloop.policy.actuators import ActuatorError, NodeAgentActuator, Router
    from cgloop.policy.engine import Engine
    from cgloop.policy.guards import Budget
    from cgloop.policy.journal import Journal
    from cgloop.policy.nodes import NodeBook
    from cgloop.policy.telemetry import KafkaTelemetryFeed, WindowStore

    logs.setup()
    addr = metrics.parse_addr(metrics_addr, Daemon.DAEMON_POLICY_ENGINE)  # bad: stop here
    if standby and source_id == DEFAULT_SOURCE_ID:
        err.print(
            "[red]error[/red] --standby: give each engine of the group its own --source-id "
            f"(not the default {DEFAULT_SOURCE_ID!r}): an engine adopts the actions of the "
            "other sources"
        )
        raise typer.Exit(2)
    policies = _load(paths)
    agents = {}
    for item in agent or []:
        node, sep, address = item.partition("=")
        if not sep or not node or ":" not in address:
            err.print(
                f"[red]error[/red] --agent {item!r}: expected NODE_ID=HOST:PORT or "
                "NODE_ID=unix:PATH"
            )
            raise typer.Exit(2)
        agents[node] = address
    try:
        node_agents = NodeAgentActuator(agents, tls_dir=agent_tls_dir)
    except ActuatorError as exc:
        err.print(f"[red]error[/red] {exc}")
        raise typer.Exit(2) from None
    for node, problem in node_agents.connect(timeout_s=2.0).items():
        # not fatal: the agent may come later; its actions fail (and say so) until it does
        err.print(f"[yellow]warning[/yellow] node agent {node}: {problem}")
    settings = Settings()
    state = _state_dir()
    store = WindowStore() if verify else None
    nodes = NodeBook()
    engine_metrics = service.EngineMetrics()
    server = metrics.serve(engine_metrics.registry, addr, Daemon.DAEMON_POLICY_ENGINE)
    feed = KafkaTelemetryFeed(
        settings.bootstrap_servers, store, metrics=engine_metrics, nodes=nodes
    ).start()
    journal_file = Journal(journal or state / "journal.jsonl")

    def make_engine() -> Engine:
        return Engine(
            policies,
            Router(node_agents),
            telemetry=store,
            journal=journal_file,
            budget=Budget(budget, budget_window),
            source_id=source_id,
            apply_async=True,  # the service loop keeps deciding while agents answer
            nodes=nodes,
            overload_margin=overload_margin,
            max_instances=max_instances,
        )

    engines: list[Engine] = []
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    (state / "approvals").mkdir(parents=True, exist_ok=True)
    console.print(
        f"policy engine: {len(policies)} policies, {len(agents)} node agents, "
        f"Kafka {settings.bootstrap_servers}"
        + (f", standby group {group} as {source_id}" if standby else "")
    )
    try:
        if standby:
            from cgloop.policy import standby as standby_group

            standby_group.run(
                make_engine,
                journal_file,
                policies,
                settings.bootstrap_servers,
                stop,
                group,
                source_id,
                session_timeout_s=lease_timeout,
                on_lead=engines.append,
                approvals=state / "approvals",
                node_facts=node_facts,
                metrics=engine_metrics,
            )
        else:
            engines.append(make_engine())
            engine_metrics.leader.set(1)
            service.run(
                engines[0],
                settings.bootstrap_servers,
                stop,
                group,
                state / "approvals",
                node_facts=node_facts,
                metrics=engine_metrics,
            )
    finally:
        if server is not None:
            server.close()
        if feed is not None:
            feed.stop()
        journal_file.close()
        for engine in engines[-1:]:
            console.print(f"stopped: {engine.stats} {engine.facts.stats}")
        if standby:
            console.print(f"stopped: led {len(engines)} times")


def pending(journal: Annotated[Path | None, typer.Option()] = None) -> None:
    """Actions waiting for an operator's approval."""
    from cgloop.policy.journal import Journal

    j = Journal(None)
    for entry in Journal._read(journal or _state_dir() / "journal.jsonl"):
        j._remember(entry)
    table = Table("action id", "policy", "operation", "target", "reasons")
    for e in j.open_entries():
        if e.awaiting_approval:
            table.add_row(
                e.action.id,
                e.action.policy_id,
                str(e.action.operation),
                e.target_key,
                ",".join(e.action.reason_detection_ids),
            )
    console.print(table)


def approve(action_id: str) -> None:
    """Approve an action the running engine holds for approval."""
    folder = _state_dir() / "approvals"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{action_id}.approve").write_text(str(time.time_ns()))
    console.print(f"approval of {action_id} handed to the engine")


def reject(action_id: str, reason: Annotated[str, typer.Option()] = "rejected") -> None:
    """Reject an action the running engine holds for approval."""
    folder = _state_dir() / "approvals"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{action_id}.reject").write_text(reason)
    console.print(f"rejection of {action_id} handed to the engine")


plan = typer.Typer(help="Planners (pure functions) on a YAML description", no_args_is_help=True)


@plan.command("natif")
def plan_natif(
    spec: Path,
    baseline: Annotated[bool, typer.Option(help="also run the throughput-only baseline")] = False,
) -> None:
    """Natif instantiation + flow distribution. SPEC: functions, branches, flows (see docs)."""
    from cgloop.policy.planners import natif

    try:
        data = yaml.safe_load(spec.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        text = " ".join(f"{spec}: cannot read: {exc}".split())
        err.print(f"[red]error[/red] {escape(text)}", soft_wrap=True, highlight=False)
        raise typer.Exit(1) from None
    try:
        functions = {
            f["name"]: natif.NetworkFunction(
                f["name"],
                natif.Category[f["category"].upper()],
                float(f["capacity_pps"]),
                float(f["capacity_bps"]),
                bool(f.get("multithreaded", False)),
                float(f.get("gain_pps", 1)),
                float(f.get("gain_bps", 1)),
            )
            for f in data["functions"]
        }
        flows = {
            f["name"]: natif.Flow(f["name"], float(f["pps"]), float(f["bps"]))
            for f in data["flows"]
        }
        branches = [
            natif.Branch(b["chain"], tuple(b["functions"]), tuple(b["flows"]))
            for b in data["branches"]
        ]
        result = natif.natif(functions, branches, flows)
    except (KeyError, TypeError, ValueError) as exc:
        err.print(f"[red]error[/red] {spec}: {exc!r}")
        raise typer.Exit(1) from None
    delays = natif.flow_delays_s(functions, result.distribution)
    table = Table("function", "instance", "flows", "pps", "bps")
    for (fn, idx), load in sorted(result.distribution.loads.items()):
        table.add_row(fn, str(idx), ",".join(load.flows), f"{load.pps:g}", f"{load.bps:g}")
    console.print(table)
    console.print(f"instances: {result.instances}")
    console.print(f"worst processing delay (M/D/1): {max(delays.values()) * 1e3:.3f} ms")
    if result.distribution.oversized:
        console.print(f"[yellow]flows larger than one instance:[/] {result.distribution.oversized}")
    if baseline:
        other = natif.throughput_only(functions, branches, flows)
        od = natif.flow_delays_s(functions, other.distribution)
        console.print(
            f"throughput-only: instances {other.instances}, worst delay "
            f"{max(od.values()) * 1e3:.3f} ms"
        )


@plan.command("sfc")
def plan_sfc(
    nodes: Annotated[str, typer.Option(help="NAME:SLOTS[:LOAD],…")],
    chain: Annotated[int, typer.Option(help="number of service functions")],
    service: Annotated[str, typer.Option(help="node running the service application")],
) -> None:
    """LB, LC and LBLC placements of a chain, with inter-node links."""
    from cgloop.policy.planners import sfc

    parsed = []
    for item in nodes.split(","):
        parts = item.split(":")
        try:
            load = float(parts[2]) if len(parts) > 2 else 0
            parsed.append(sfc.Node(parts[0], int(parts[1]), load))
        except (IndexError, ValueError):
            raise typer.BadParameter(
                f"{item!r} is not NAME:SLOTS[:LOAD]", param_hint="--nodes"
            ) from None

    fns = [f"sf{i + 1}" for i in range(chain)]
    table = Table("strategy", "placement", "inter-node links")
    for name, placement in [
        ("LB", sfc.lb(fns, parsed)),
        ("LC", sfc.lc(fns, parsed, service)),
        ("LBLC", sfc.lblc(fns, parsed, service)),
    ]:
        table.add_row(name, " ".join(placement), str(sfc.inter_node_links(placement)))
    console.print(table)


@plan.command("overload")
def plan_overload(
    offered_pps: float,
    t_cpu_us: Annotated[float, typer.Option(help="CPU time per packet, us")],
    interrupts_us_per_s: Annotated[float, typer.Option(help="interrupt time per second, us")] = 0,
    margin: Annotated[float, typer.Option(help="keep load under margin x R_max")] = 0.8,
) -> None:
    """Gallenmüller's R_max = (1 s - d_sum) / t_CPU against the offered load."""
    from cgloop.policy.planners import overload

    d = overload.check_overload(offered_pps, t_cpu_us * 1e-6, interrupts_us_per_s * 1e-6, margin)
    console.print(
        f"R_max {d.r_max_pps:,.0f} pps, limit {d.limit_pps:,.0f} pps, offered "
        f"{d.offered_pps:,.0f} pps: {'OVERLOAD' if d.overloaded else 'ok'}"
        + (f", shed {d.excess_pps:,.0f} pps" if d.overloaded else "")
    )


def register(app: typer.Typer) -> None:
    sub = typer.Typer(
        help="Policy engine: policies, guards, verification, rollback, planners",
        no_args_is_help=True,
    )
    for fn in (validate, schema, run, pending, approve, reject):
        sub.command()(fn)
    sub.add_typer(plan, name="plan")
    app.add_typer(sub, name="policy")
