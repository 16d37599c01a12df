"""`cgloop run`: the closed loop end to end on the lab, then its report."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

# Piped into a file or a CI log, rich would fold the report's table to 80 columns.
console = Console(width=None if sys.stdout.isatty() else 160)
err = Console(stderr=True)


def register(app: typer.Typer) -> None:
    @app.command("run")
    def run(
        scenario: Annotated[
            Path | None, typer.Option(help="lab scenario YAML (default: the loop's demo)")
        ] = None,
        name: Annotated[str, typer.Option(help="lab name")] = "cgl",
        loop: Annotated[bool, typer.Option(help="run the policy engine (off: watch only)")] = True,
        micro_loop: Annotated[
            bool, typer.Option(help="the agent's node micro loop (off: the global loop alone)")
        ] = True,
        keep_lab: Annotated[bool, typer.Option(help="leave the lab up afterwards")] = False,
        out: Annotated[Path | None, typer.Option(help="report directory")] = None,
        interface: Annotated[
            list[str] | None,
            typer.Option(help="run on this host's interfaces instead of the lab (repeat)"),
        ] = None,
        bottleneck: Annotated[
            str | None, typer.Option(help="with --interface: the egress the agent shapes")
        ] = None,
        link_mbit: Annotated[
            float, typer.Option(help="with --interface: the bottleneck's rate, Mbit/s")
        ] = 100.0,
        probe_target: Annotated[
            list[str] | None,
            typer.Option(help="with --interface: a client running `cgloop-node-agent reflect`"),
        ] = None,
    ) -> None:
        """Run every cgloop service on the lab through a scripted scenario with faults, then
        print the per-fault report (onset, detection, decision, action, recovery) and write it
        as HTML. Needs root (network namespaces, XDP, tc)."""
        from cgloop.config import Settings
        from cgloop.lab.lab import Lab
        from cgloop.lab.scenario import load_scenario
        from cgloop.lab.topology import load_topology
        from cgloop.loop.closed_loop import ClosedLoop, LoopOptions, default_scenario
        from cgloop.loop.report import build_report, print_report, write_html
        from cgloop.loop.services import ServiceError, exit_on_sigterm

        if os.geteuid() != 0:
            err.print("[red]error[/red] cgloop run needs root (network namespaces, XDP, tc)")
            raise typer.Exit(2)
        exit_on_sigterm()  # SIGTERM unwinds like Ctrl-C: services stopped, lab down
        settings = Settings()
        if interface:
            _run_on_interfaces(settings, interface, bottleneck, link_mbit, probe_target or [])
            return
        if out is not None and (earlier := sorted(out.glob("agent-journal-*"))):
            # an agent replays its journal's actions, and a repeated action id with other terms
            # is refused: an earlier run's journals would meet this run's fresh lab
            err.print(f"[red]error[/red] --out {out} holds an earlier run ({earlier[0].name}): "
                      "give a new directory")
            raise typer.Exit(2)
        sc = load_scenario(scenario or default_scenario())
        console.print("starting the embedded stack (Kafka, store with its sink)…")
        _stack_up(settings)
        lab = Lab(load_topology(name=name))
        lab.up()
        run_dir = out or lab.run_dir / time.strftime("loop-%Y%m%dT%H%M%S")
        options = LoopOptions(enabled=loop, micro_loop=micro_loop)
        closed = ClosedLoop(lab, sc, settings, run_dir, options)
        label = ("no loop" if not loop else "two-level loop" if micro_loop
                 else "global loop only")
        try:
            closed.start(say=lambda m: console.print(f"  started {m}"))
            console.print(
                f"scenario: {len(sc.faults)} faults, each a trial with fresh gaming flows"
            )
            trials = closed.run(say=lambda m: console.print(f"  {m}"))
            console.print("waiting for the store to take the last records…")
            report = build_report(
                settings.store_http_url, run_dir,
                [(t.name, t.faults, t.packets) for t in trials],
                options.latency_slo_ms, closed.policy_source,
                label, node=closed.node_ids, notes=closed.notes.lines, onos=closed.onos_rules(),
            )
        except ServiceError as exc:
            err.print(f"[red]error[/red] {exc}")
            raise typer.Exit(1) from None
        finally:
            closed.stop()
            if not keep_lab:
                lab.down()
        print_report(report, console)
        html = write_html(report, run_dir / "report.html", {t.name: t.packets for t in trials})
        console.print(f"\nreport: {html}\nthe store stays queryable: `cgloop query 'SELECT …'`")


def _run_on_interfaces(
    settings, interfaces: list[str], bottleneck: str | None, link_mbit: float, targets: list[str]
) -> None:
    """The same services on real interfaces, until Ctrl-C or SIGTERM."""
    import ipaddress
    import socket

    from cgloop.loop.closed_loop import ClosedLoop, LoopOptions
    from cgloop.loop.edge import EdgePlan, ProbeTarget
    from cgloop.loop.services import ServiceError

    if bottleneck is None:
        err.print("[red]error[/red] --interface needs --bottleneck IF (the egress to shape)")
        raise typer.Exit(2)
    try:
        probes = [ProbeTarget(t, ipaddress.IPv4Address(t)) for t in targets]
    except ValueError as exc:
        err.print(f"[red]error[/red] --probe-target: {exc}")
        raise typer.Exit(2) from None
    plan = EdgePlan(
        node=socket.gethostname(), bottleneck=bottleneck,
        interfaces=sorted(set(interfaces)), link_mbit=link_mbit, targets=probes,
    )
    _stack_up(settings)
    run_dir = settings.state_dir / "loop" / "host" / time.strftime("run-%Y%m%dT%H%M%S")
    closed = ClosedLoop(None, None, settings, run_dir, LoopOptions(), plan=plan)
    try:
        closed.start(say=lambda m: console.print(f"  started {m}"))
        console.print(f"cgloop runs on {', '.join(plan.interfaces)} (Ctrl-C stops it); logs in "
                      f"{run_dir / 'logs'}")
        while not (dead := closed.services.check()):
            time.sleep(1)
        err.print("[red]error[/red] a service stopped:\n" + "\n".join(dead))
        raise typer.Exit(1)
    except ServiceError as exc:
        err.print(f"[red]error[/red] {exc}")
        raise typer.Exit(1) from None
    except KeyboardInterrupt:
        console.print("stopping")
    finally:
        closed.stop()


def _stack_up(settings) -> None:
    """The embedded stack, or a one-line reason it cannot start (a port taken, no disk)."""
    from cgloop.config import export_kafka_security
    from cgloop.stack.preflight import PreflightError
    from cgloop.stack.stack import Stack

    try:
        Stack(settings).up(progress=lambda m: console.print(f"  {m}"))
        export_kafka_security(settings)  # the services this process starts log in to it too
    except PreflightError as exc:
        err.print(f"[red]error[/red] the embedded stack cannot start: {exc}")
        raise typer.Exit(2) from None
