"""`cgloop analytics …`, `cgloop train` and `cgloop evaluate`."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Annotated

import typer
from cgloop import metrics
from cgloop.contracts.ops import Daemon
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

console = Console(stderr=True)


def _error(exc: Exception) -> None:
    # One line at any terminal width, file names taken literally (no rich markup in them).
    console.print(f"[red]error[/red] {escape(str(exc))}", soft_wrap=True, highlight=False)


def _pairs(values: list[str] | None, option: str, form: str) -> list[tuple[str, str]]:
    """`KEY=VALUE` option values; a malformed one stops the command naming the option."""
    out = []
    for v in values or []:
        key, sep, val = v.partition("=")
        if not sep or not key.strip() or not val.strip():
            raise typer.BadParameter(f"{v!r} is not {form}", param_hint=option)
        out.append((key.strip(), val.strip()))
    if option == "--int-switch":
        for k, _ in out:
            _number(k, option, k)
    return out


def _number(text: str, option: str, whole: str) -> int:
    try:
        n = int(text)
    except ValueError:
        n = -1
    if not 0 <= n < 2**32:
        raise typer.BadParameter(
            f"{whole!r}: {text!r} is not a switch id or port number (0..2^32-1)",
            param_hint=option)
    return n


def default_model_path() -> Path:
    from cgloop.config import settings

    return settings().state_dir / "analytics" / "flow-classifier.skops"


def _progress() -> Progress:
    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                    TimeElapsedColumn(), console=console)


DataRoot = Annotated[Path | None, typer.Option(help="folder with the real data (../shared/data)")]
MaxBg = Annotated[int, typer.Option(help="background flows sampled per Xbox capture")]
SynthN = Annotated[int, typer.Option(help="synthetic sessions per platform (marked synthetic)")]


SynthRandom = Annotated[int | None, typer.Option(
    min=0, help="random synthetic sessions (bitrate, frame rate, GOP, jitter, loss, adaptation "
    "drawn at random; marked synthetic); default: datasets.RANDOM_SESSIONS (120)")]


def _examples(data_root: Path | None, max_background: int, synthetic: int,
              synthetic_random: int | None):
    from cgloop.analytics.datasets import RANDOM_SESSIONS, build_examples, load_all

    if synthetic_random is None:
        synthetic_random = RANDOM_SESSIONS
    with console.status("loading real captures and synthetic sessions"):
        flows = load_all(data_root, max_background=max_background,
                         synthetic_per_platform=synthetic, synthetic_random=synthetic_random)
    with _progress() as prog:
        task = prog.add_task("features", total=len(flows))
        ex = build_examples(flows, progress=lambda: prog.advance(task))
    return ex, flows


def _cross_validate(ex, folds: int, flows=None):
    from cgloop.analytics.evaluate import cross_validate

    with _progress() as prog:
        task = prog.add_task("held-out captures", total=folds)
        return cross_validate(ex, n_splits=folds, progress=lambda: prog.advance(task),
                              flows_meta=flows)


def train_cmd(
    out: Annotated[Path | None, typer.Option(help="model file to write")] = None,
    data_root: DataRoot = None,
    max_background: MaxBg = 150,
    synthetic: SynthN = 3,
    synthetic_random: SynthRandom = None,
    folds: Annotated[int, typer.Option(help="grouped CV folds for the metrics in the card")] = 5,
) -> None:
    """Train the gaming-flow classifier on real + synthetic data; save a skops model file."""
    from cgloop.analytics.evaluate import train
    from cgloop.analytics.model import save

    out = out or default_model_path()
    ex, flows = _examples(data_root, max_background, synthetic, synthetic_random)
    ev = _cross_validate(ex, folds, flows)
    with console.status("training the final model on every capture"):
        model, card = train(ex, ev)
        card = save(model, card, out)
    console.print(f"model {card.version} → {out}")
    print(json.dumps({"model": str(out), "version": card.version, "metrics": card.metrics,
                      "training_data_sha256": card.training_data_sha256}, indent=2))


def evaluate_cmd(
    out_dir: Annotated[Path, typer.Option(help="report folder")] = Path("analytics-report"),
    model: Annotated[Path | None, typer.Option(help="model whose card to show")] = None,
    data_root: DataRoot = None,
    max_background: MaxBg = 150,
    synthetic: SynthN = 3,
    synthetic_random: SynthRandom = None,
    folds: Annotated[int, typer.Option(min=2, help="grouped CV folds")] = 5,
    lab_cases: Annotated[int, typer.Option(
        min=0, help="non-circular lab sessions (labcases.py: another generator, bitrates "
        "outside the training range, loss, jitter, a rate cap)")] = 40,
    lab_others: Annotated[int, typer.Option(
        min=0, help="non-circular sessions of other traffic from the same generator "
        "(labothers.py: adaptive video streaming, video calls, bulk downloads), for false "
        "gaming alarms")] = 30,
    lab_seed: Annotated[int, typer.Option(
        help="seed of the lab cases (another seed: sessions no one has looked at)")] = 0,
    ablation: Annotated[bool, typer.Option(
        help="also evaluate without synthetic data, without each feature group, with the "
        "bitrate and with the former features")] = True,
    curve_repeats: Annotated[int, typer.Option(
        min=0, help="learning curve (learning.py): subsampled draws of the training captures "
        "per fraction (0: no curve)")] = 3,
) -> None:
    """Evaluate on whole held-out captures and on the non-circular lab cases, per class and
    data source, with the ablations; write report.html, PNG plots and metrics.json."""
    from cgloop.analytics import generalisation
    from cgloop.analytics.datasets import build_examples, lab_case_flows, lab_other_flows
    from cgloop.analytics.evaluate import write_report
    from cgloop.analytics.model import read_card

    card = read_card(model) if model else None
    ex, flows = _examples(data_root, max_background, synthetic, synthetic_random)
    with console.status("generating the lab cases"):
        lab = lab_case_flows(lab_cases, seed=lab_seed) + lab_other_flows(lab_others,
                                                                          seed=lab_seed)
        lab_ex = build_examples(lab)
    n = len(generalisation.variants()) if ablation else 1
    with _progress() as prog:
        task = prog.add_task("models (held-out captures and lab cases)", total=n)
        ev, cases, rows = generalisation.run(
            ex, flows, lab_ex, lab, folds=folds, ablation=ablation,
            progress=lambda name: prog.update(task, advance=1, description=name))
    extra = generalisation.metrics(ev, cases, rows)
    section = generalisation.html_section(ev, cases, rows)
    if curve_repeats:
        from cgloop.analytics import learning

        with _progress() as prog:
            fits = folds * (1 + curve_repeats * (len(learning.FRACTIONS) - 1))
            task = prog.add_task("learning curve", total=fits)
            points = learning.curve(ex, repeats=curve_repeats, folds=folds,
                                    progress=lambda: prog.advance(task))
        summ = learning.summary(points)
        extra["learning_curve"] = {"points": points, "summary": summ}
        section += learning.html_section(points, summ)
    path = write_report(ev, out_dir, card, section, extra)
    console.print(f"report → {path}")
    print(json.dumps({"report": str(path), **ev.metrics(), "targets": extra["targets"],
                      "ablation": extra["ablation"]}, indent=2, default=str))


def _print_reports(reports) -> None:
    import sys

    from rich.table import Table

    # a terminal's own width; piped to a file or a pager, wide enough for a row per flow
    out = Console(width=None if sys.stdout.isatty() else 180)
    for rep in reports:
        t = Table(title=f"{rep.capture} (model {rep.model_version})", title_justify="left")
        for col, just in (("flow", "left"), ("packets", "right"), ("s", "right"),
                          ("label", "left"), ("platform", "left"), ("confidence", "right"),
                          ("source", "left"), ("decided after", "right"), ("nDPI", "left")):
            t.add_column(col, justify=just)
        for c in rep.conversations:
            platform = f"{c.platform} ({c.platform_source})" if c.platform else ""
            decided = "never" if c.decision_s is None else f"{c.decision_s:.3f} s"
            t.add_row(escape(c.flow), str(c.packets), f"{c.duration_s:.1f}", c.label,
                      platform, f"{c.confidence:.2f}", c.source, decided, escape(c.ndpi_app))
        out.print(t)
        shares = ", ".join(f"{k} {v:.0%}" for k, v in rep.share.items())
        out.print(f"{len(rep.conversations)} conversations; label source: {shares}")
        bad = {k: v for k, v in rep.counters.items()
               if v and k not in ("packets", "accounted", "flows_created", "records",
                                  "rtp_confirmed")}
        if bad:
            out.print("packets the probe's parser skipped: "
                      + ", ".join(f"{k} {v}" for k, v in bad.items()))
        if rep.dpi_error:
            out.print(f"[yellow]signature path off:[/yellow] {escape(rep.dpi_error)}")


def register(app: typer.Typer) -> None:
    sub = typer.Typer(
        help="Features, cloud-gaming flow classifier, SLO and abuse detectors, streaming worker",
        no_args_is_help=True,
    )
    app.add_typer(sub, name="analytics")
    app.command("train")(train_cmd)
    app.command("evaluate")(evaluate_cmd)
    sub.command("train")(train_cmd)
    sub.command("evaluate")(evaluate_cmd)

    @sub.command("run")
    def run(
        model: Annotated[Path | None, typer.Option(help="model file (cgloop train)")] = None,
        group: Annotated[str, typer.Option(
            help="consumer group: workers started with the same group share the partitioned "
                 "inputs (scale-out; docs/analytics.md)")] = "cgloop-analytics",
        state: Annotated[Path | None, typer.Option(
            help="worker state file, one per worker (default: per group)")] = None,
        max_idle_s: Annotated[float | None, typer.Option(help="exit after idle seconds")] = None,
        anomaly: Annotated[bool, typer.Option(help="emit flow-anomaly detections")] = True,
        slo_profile: Annotated[
            str | None,
            typer.Option(help="a deployment profile of the SLO table (cgloop.slo, e.g. 'lab') "
                         "whose objectives replace every platform's; default: each platform's"),
        ] = None,
        slo_min_duration_s: Annotated[
            float, typer.Option(help="how long a value stays past its SLO before it fires")
        ] = 1.0,
        latency_min_duration_s: Annotated[
            float | None,
            typer.Option(help="the same for latency alone (default: --slo-min-duration-s)"),
        ] = None,
        latency_window_s: Annotated[
            float, typer.Option(help="average latency over windows of this length (0: off)")
        ] = 0.0,
        int_switch: Annotated[list[str] | None, typer.Option(
            help="INT switch id = node id, for switch-queue detections' node_id label "
                 "(repeatable, e.g. 1=core)")] = None,
        int_port: Annotated[list[str] | None, typer.Option(
            help="INT switch id:egress port = interface name, their interface label "
                 "(repeatable, e.g. 1:3=edge1)")] = None,
        int_flow_latency: Annotated[bool, typer.Option(
            help="take INT end-to-end latency as the flows' latency (only where the INT "
                 "switches span the whole path)")] = False,
        metrics_addr: Annotated[str | None, metrics.option(Daemon.DAEMON_ANALYTICS)] = None,
    ) -> None:
        """Consume flows/INT/probes/nodes, emit detections to cgloop.detections.v1."""
        from cgloop import logs
        from cgloop.analytics.engine import AnalyticsEngine, EngineConfig
        from cgloop.analytics.model import load
        from cgloop.analytics.worker import Worker, WorkerMetrics
        from cgloop.config import settings
        from cgloop.slo import table as slo_table

        if slo_profile is not None and slo_profile not in slo_table().deployments:
            raise typer.BadParameter(
                f"{slo_profile!r} is not a deployment profile of the SLO table (cgloop.slo); "
                f"known: {', '.join(sorted(slo_table().deployments))}",
                param_hint="--slo-profile",
            )
        switch_nodes = {int(k): v for k, v in _pairs(int_switch, "--int-switch", "ID=NODE")}
        switch_ports = {}
        for k, v in _pairs(int_port, "--int-port", "ID:PORT=IFNAME"):
            sw, _, port = k.partition(":")
            switch_ports[(_number(sw, "--int-port", k), _number(port, "--int-port", k))] = v
        logs.setup()
        worker_metrics = WorkerMetrics()
        server = metrics.start(worker_metrics.registry, metrics_addr, Daemon.DAEMON_ANALYTICS)
        path = model or default_model_path()
        clf, version = None, ""
        if path.exists():
            clf, card = load(path)
            version = card.version
            console.print(f"model {card.version} from {path}")
        else:
            console.print(f"[yellow]no model at {path}: classification off (run `cgloop train`)")
        engine = AnalyticsEngine(clf, version, EngineConfig(
            anomaly=anomaly, slo_profile=slo_profile,
            slo_min_duration_s=slo_min_duration_s, latency_min_duration_s=latency_min_duration_s,
            latency_window_s=latency_window_s, int_switch_nodes=switch_nodes,
            int_switch_ports=switch_ports, int_flow_latency=int_flow_latency,
        ))
        st = settings()
        worker = Worker(engine, st.bootstrap_servers,
                        state or st.state_dir / "analytics" / f"worker-{group}.json", group,
                        metrics=worker_metrics)
        try:
            stats = worker.run(max_idle_s=max_idle_s)
        finally:
            if server is not None:
                server.close()
        console.print(f"stopped: {stats.messages} messages, {stats.records} records, "
                      f"{stats.detections} detections, {stats.skipped_replays} replays skipped")
        if stats.end_to_end_s:
            import numpy as np

            # how long a record waited between its producer and this worker: the loop's budget
            q = np.percentile(np.asarray(stats.end_to_end_s) * 1000, [50, 99])
            console.print(f"produced -> handled: p50 {q[0]:.1f} ms, p99 {q[1]:.1f} ms")

    @sub.command("pcap")
    def pcap(
        file: Path,
        interval_ms: Annotated[int, typer.Option(help="export interval")] = 100,
        limit: Annotated[int, typer.Option(help="records to print (0: all)")] = 20,
    ) -> None:
        """Turn a pcap into FlowRecords (the probe's pcap twin) and print them."""
        from cgloop.analytics.records import read_capture
        from google.protobuf.json_format import MessageToDict

        try:
            recs, counters = read_capture(file, interval_ms * 1_000_000)
        except (ValueError, OSError) as exc:
            _error(exc)
            raise typer.Exit(2) from exc
        for r in recs[: limit or None]:
            print(json.dumps(MessageToDict(r)))
        counted = ", ".join(f"{k} {v}" for k, v in counters.items() if v)
        console.print(f"{len(recs)} records ({counted})")

    @sub.command("detect-pcap")
    def detect_pcap(
        file: Path,
        model: Annotated[Path | None, typer.Option(help="model file")] = None,
    ) -> None:
        """Run every detector (and the classifier) over a pcap; print the detections."""
        from cgloop.analytics.engine import AnalyticsEngine
        from cgloop.analytics.model import load
        from cgloop.analytics.records import records_from_pcap
        from google.protobuf.json_format import MessageToDict

        path = model or default_model_path()
        clf, version = None, ""
        if path.exists():
            clf, card = load(path)
            version = card.version
        engine = AnalyticsEngine(clf, version)
        try:
            recs = records_from_pcap(file)
        except (ValueError, OSError) as exc:
            _error(exc)
            raise typer.Exit(2) from exc
        n = 0
        for r in recs:
            for d in engine.on_flows([r]):
                n += 1
                print(json.dumps(MessageToDict(d)))
        console.print(f"{n} detections from {len(recs)} records")

    @sub.command("classify")
    def classify(
        files: Annotated[list[Path], typer.Argument(
            help="captures to classify: pcap or pcapng, gzip-compressed or not")],
        model: Annotated[Path | None, typer.Option(
            help="model file (cgloop train); default: the one set-up trains")] = None,
        as_json: Annotated[bool, typer.Option(
            "--json", help="print one JSON document (a list, one report per capture) "
            "instead of tables")] = False,
        min_packets: Annotated[int, typer.Option(
            min=1, help="leave out conversations with fewer packets (the training's floor)")] = 4,
    ) -> None:
        """Per conversation of each capture: class, platform, confidence, the source of the
        label (nDPI's signature of a gaming platform, else the behavioural model on the probe's
        records) and the time to decision. A capture that cannot be read or has no flows is
        refused by name (exit 2) and the others are still classified."""
        from cgloop.analytics.classify import NoFlows, classify_capture
        from cgloop.analytics.model import ModelError, load

        path = model or default_model_path()
        if not path.exists():
            _error(FileNotFoundError(f"no model at {path}: run `cgloop train` or pass --model"))
            raise typer.Exit(2)
        try:
            clf, card = load(path)
        except ModelError as exc:
            _error(exc)
            raise typer.Exit(2) from exc
        reports, failed = [], 0
        for f in files:
            try:
                reports.append(classify_capture(f, clf, card.version, min_packets=min_packets))
            except (NoFlows, ValueError, OSError) as exc:
                failed += 1
                _error(exc if str(f) in str(exc) else ValueError(f"{f}: {exc}"))
        if as_json:
            print(json.dumps([r.model_dump() for r in reports], indent=2))
        else:
            _print_reports(reports)
        if failed:
            raise typer.Exit(2)

    @sub.command("model-key")
    def model_key_cmd() -> None:
        """Create the key models are signed with (random, 0600) unless it exists; print where."""
        from cgloop.analytics.model import KEY_ENV, ensure_key

        if os.environ.get(KEY_ENV):
            print(f"the model key comes from {KEY_ENV}")
            return
        print(ensure_key())

    @sub.command("model-info")
    def model_info(path: Path) -> None:
        """Verify a model file (hash, format, types) and print its card."""
        from cgloop.analytics.model import ModelError, load

        try:
            _, card = load(path)
        except ModelError as exc:
            _error(exc)
            raise typer.Exit(1) from exc
        print(card.model_dump_json(indent=2))
