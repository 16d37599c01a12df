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


def default_model_path() -> Path:
    from cgloop.config import settings

    return settings().state_dir / "analytics" / "flow-classifier.skops"


def _progress() -> Progress:
    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                    TimeElapsedColumn(), console=console)


DataRoot = Annotated[Path | None, typer.Option(help="folder with the real data (../shared/data)")]
MaxBg = Annotated[int, typer.Option(help="background flows sampled per Xbox capture")]
SynthN = Annotated[int, typer.Option(help="synthetic sessions per platform (marked synthetic)")]


def _examples(data_root: Path | None, max_background: int, synthetic: int):
    from cgloop.analytics.datasets import build_examples, load_all

    with console.status("loading real captures and synthetic sessions"):
        flows = load_all(data_root, max_background=max_background,
                         synthetic_per_platform=synthetic)
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
    folds: Annotated[int, typer.Option(help="grouped CV folds for the metrics in the card")] = 5,
) -> None:
    """Train the gaming-flow classifier on real + synthetic data; save a skops model file."""
    from cgloop.analytics.evaluate import train
    from cgloop.analytics.model import save

    out = out or default_model_path()
    ex, flows = _examples(data_root, max_background, synthetic)
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
    folds: int = 5,
) -> None:
    """Evaluate on whole held-out captures; write report.html, PNG plots and metrics.json."""
    from cgloop.analytics.evaluate import write_report
    from cgloop.analytics.model import read_card

    card = read_card(model) if model else None
    ex, flows = _examples(data_root, max_background, synthetic)
    ev = _cross_validate(ex, folds, flows)
    path = write_report(ev, out_dir, card)
    console.print(f"report → {path}")
    print(json.dumps({"report": str(path), **ev.metrics()}, indent=2))


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
        group: Annotated[str, typer.Option(help="consumer group")] = "cgloop-analytics",
        state: Annotated[Path | None, typer.Option(help="worker state file")] = None,
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
            latency_window_s=latency_window_s,
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
