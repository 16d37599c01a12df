"""`cgloop lab up|down|status|run`: the network-namespace testbed."""

from __future__ import annotations

import os
import time
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

console = Console()

NameOpt = typer.Option("cgl", "--name", help="lab name: namespaces are NAME-<node>")
TopoOpt = typer.Option(
    None, "--topology", help="topology YAML (default: the shipped lab v2; topology-v1.yaml in "
    "the package's data folder is the one-edge lab)"
)
StateOpt = typer.Option(None, "--state-dir", help="where the lab records what it created")
ScenarioOpt = typer.Option(
    None, "--scenario", help="scenario YAML (default: the shipped one, for lab v2)"
)


def _lab(name: str, topology: Path | None, state_dir: Path | None):
    from cgloop.lab.lab import Lab
    from cgloop.lab.topology import load_topology

    if os.geteuid() != 0:
        console.print("[red]cgloop lab needs root (network namespaces, tc, BPF)[/]")
        raise typer.Exit(2)
    try:
        return Lab(load_topology(topology, name=name), state_dir)
    except ValueError as exc:
        console.print(f"[red]{exc}[/]")
        raise typer.Exit(2) from exc


def register(app: typer.Typer) -> None:
    sub = typer.Typer(
        help="Network-namespace testbed, traffic generators and fault injection",
        no_args_is_help=True,
    )
    app.add_typer(sub, name="lab")

    @sub.command()
    def up(
        name: str = NameOpt, topology: Path | None = TopoOpt, state_dir: Path | None = StateOpt
    ) -> None:
        """Create the lab's namespaces, links, routes and bottleneck (idempotent)."""
        lab = _lab(name, topology, state_dir)
        t0 = time.monotonic()
        lab.up()
        console.print(
            f"lab [bold]{lab.name}[/] up: {len(lab.topo.nodes)} namespaces, "
            f"{len(lab.topo.links)} links ({time.monotonic() - t0:.1f} s)"
        )

    @sub.command()
    def down(
        name: str = NameOpt, topology: Path | None = TopoOpt, state_dir: Path | None = StateOpt
    ) -> None:
        """Stop the lab's processes and delete its namespaces (also after a crash)."""
        lab = _lab(name, topology, state_dir)
        removed = lab.down()
        console.print(f"lab [bold]{lab.name}[/] down: removed {len(removed)} namespaces")

    @sub.command()
    def status(
        name: str = NameOpt, topology: Path | None = TopoOpt, state_dir: Path | None = StateOpt
    ) -> None:
        """Namespaces, interfaces, shaping and queue counters."""
        lab = _lab(name, topology, state_dir)
        st = lab.status()
        table = Table(title=f"lab {st.name}: {'up' if st.up else 'not (fully) up'}")
        for col in (
            "node",
            "interface",
            "address",
            "qdisc",
            "rate Mbit/s",
            "tx pkts",
            "drops",
            "backlog",
            "procs",
        ):
            table.add_column(col)
        for node in st.nodes:
            if not node.exists:
                table.add_row(node.node, f"[red]namespace {node.netns} missing[/]")
                continue
            for i, iface in enumerate(node.interfaces):
                table.add_row(
                    node.node if i == 0 else "",
                    iface.ifname,
                    iface.address or "",
                    iface.qdisc or "",
                    f"{iface.rate_mbit:g}" if iface.rate_mbit else "",
                    str(iface.tx_packets) if iface.qdisc == "htb" else "",
                    str(iface.drops) if iface.qdisc == "htb" else "",
                    str(iface.backlog_packets) if iface.qdisc == "htb" else "",
                    str(node.processes) if i == 0 else "",
                )
        console.print(table)
        if not st.up:
            raise typer.Exit(1)

    @sub.command()
    def run(
        scenario: Path | None = ScenarioOpt,
        name: str = NameOpt,
        topology: Path | None = TopoOpt,
        state_dir: Path | None = StateOpt,
        teardown: bool = typer.Option(False, "--down", help="take the lab down afterwards"),
    ) -> None:
        """Bring the lab up, run a scenario (traffic + faults), print the report."""
        from cgloop.lab.scenario import Runner, check_scenario, load_scenario

        lab = _lab(name, topology, state_dir)
        try:
            sc = load_scenario(scenario)
            check_scenario(sc, lab.topo)
        except ValueError as exc:
            console.print(f"[red]{exc}[/]")
            raise typer.Exit(2) from exc
        lab.up()
        run_dir = lab.run_dir / "runs" / time.strftime("%Y%m%d-%H%M%S")
        try:
            with console.status(f"running scenario ({sc.duration:g} s)") as status:
                report = Runner(lab, sc, run_dir, on_event=lambda t: status.update(t)).run()
        except (RuntimeError, OSError, KeyError) as exc:
            console.print(f"[red]scenario failed: {exc}[/] (outputs in {run_dir})")
            raise typer.Exit(1) from exc
        finally:
            if teardown:
                lab.down()
        print_report(report)

    return None


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


def print_report(report) -> None:
    table = Table(title="gaming downstream one-way delay per fault (before / during / after)")
    for col in ("fault", "session", "p50 ms", "p99 ms", "p99.9 ms", "max ms", "loss %"):
        table.add_column(col)
    for w in report.windows:
        for label, s in (("before", w.before), ("during", w.during), ("after", w.after)):
            table.add_row(
                w.fault if label == "before" else "",
                f"{w.session} {label}",
                _ms(s.p50_ms),
                _ms(s.p99_ms),
                _ms(s.p999_ms),
                _ms(s.max_ms),
                f"{s.loss_pct:.2f}",
            )
    console.print(table)
    for ident, res in report.sessions.items():
        down = res.get("down", {})
        summ = down.get("summary") if isinstance(down, dict) else None
        if summ:
            console.print(
                f"{ident}: {summ['packets']} packets, p99 {_ms(summ['p99_ms'])} ms, "
                f"loss {summ['loss_pct']:.2f} %"
            )
        elif res.get("kind") == "web" and res.get("fetch_ms"):
            f = res["fetch_ms"]
            console.print(
                f"{ident}: {res['fetches']} fetches, {res['errors']} errors, "
                f"fetch time p50 {f['p50']:.1f} ms, p99 {f['p99']:.1f} ms"
            )
        elif "error" in res:
            console.print(f"{ident}: {res['error']}")
    console.print(f"run folder: {report.run_dir}")
