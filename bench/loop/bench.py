"""The loop benchmark: how fast the closed loop repairs cloud-gaming latency, against the same
loop fed telemetry averaged over 1 s windows (MOSAICO's telemetry-window loops) and against no
loop at all, measured side by side in one run on the lab.

Every mode plays the same faults (congestion and an unresponsive ECT(1) flow, in turn), each
as its own trial with fresh gaming flows. Per fault: onset -> detection, onset -> action
applied (from the records in the store), and onset -> gaming p99 back under the SLO (from the
lab's per-packet ground truth, 250 ms windows). Targets (issue 9): onset -> action
applied p99 <= 100 ms; gaming p99 back under its SLO within 1 s.

    sudo uv run python bench/loop/bench.py --faults 30     # ~8 min per mode on 2 cores
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

import numpy as np
from cgloop.lab.lab import Lab
from cgloop.lab.scenario import Scenario
from cgloop.lab.topology import load_topology
from cgloop.loop.closed_loop import ClosedLoop, LoopOptions
from cgloop.loop.report import FaultOutcome, build_report
from cgloop.loop.services import exit_on_sigterm
from cgloop.stack.stack import Stack
from cgloop.testing import private_settings

# Faults the loop can repair by moving flows between queues. A rate cap below the gaming
# demand and random loss are left out: no queue change repairs them (`make run` shows both).
FAULTS = [
    {"kind": "congestion", "flows": 4},
    {"kind": "ect1_abuse", "rate_mbit": 60},
]
TRAFFIC = [
    {"kind": "gaming", "platform": "gfn", "server": "gs1", "client": "cl1", "port": 41004},
    {"kind": "video_call", "a": "apps", "b": "home"},
    {"kind": "web", "server": "apps", "client": "home"},
]
MODES = {
    "loop": LoopOptions(),
    "1s-window loop": LoopOptions(window_s=1.0),
    "no loop": LoopOptions(enabled=False),
}


def scenario(n: int, fault_s: float) -> Scenario:
    faults = [
        {**FAULTS[i % len(FAULTS)], "at": 1.0 + i * (fault_s + 1), "duration": fault_s}
        for i in range(n)
    ]
    return Scenario.model_validate(
        {"duration": 1.0 + n * (fault_s + 1), "traffic": TRAFFIC, "faults": faults}
    )


def pct(values: list[float], q: float) -> float | None:
    return float(np.percentile(values, q)) if values else None


def fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:7.0f}"


def summarise(faults: list[FaultOutcome], fault_s: float) -> dict:
    ms = lambda f, t: None if t is None else (t - f.onset_ns) / 1e6  # noqa: E731
    det = [v for f in faults if (v := ms(f, f.detection_ns)) is not None]
    app = [v for f in faults if (v := ms(f, f.applied_ns)) is not None]
    affected = [f for f in faults if f.affected]
    # not recovered within the fault counts as the whole fault (a lower bound on the truth)
    rec = [ms(f, f.recovered_ns) if f.recovered_ns else fault_s * 1000 for f in affected]
    return {
        "faults": len(faults),
        "detected": len(det),
        "acted": len(app),
        "affected": len(affected),
        "recovered_within_fault": sum(1 for f in affected if f.recovered_ns),
        "recovered_within_1s": sum(1 for v in rec if v <= 1000),
        "detect_ms": {q: pct(det, q) for q in (50, 90, 99)},
        "applied_ms": {q: pct(app, q) for q in (50, 90, 99)},
        "recovered_ms": {q: pct(rec, q) for q in (50, 90, 99)},
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--faults", type=int, default=30, help="faults per mode (>= 30 for the issue)")
    ap.add_argument("--fault-s", type=float, default=6.0, help="duration of each fault")
    ap.add_argument("--modes", default=",".join(MODES), help="comma-separated subset")
    ap.add_argument("--out", type=Path, default=None, help="results folder")
    args = ap.parse_args()
    if os.geteuid() != 0:
        print("bench/loop needs root (namespaces, XDP, tc)")
        return 2
    exit_on_sigterm()  # SIGTERM unwinds like Ctrl-C: lab, services and stack taken down
    out = args.out or Path(tempfile.mkdtemp(prefix="cgloop-bench-loop-"))
    settings = private_settings(out / "stack")
    stack = Stack(settings, sink=True)
    results: dict[str, dict] = {}
    try:
        assert stack.up().healthy
        sc = scenario(args.faults, args.fault_s)
        for mode in args.modes.split(","):
            options = MODES[mode]
            options.lead_s, options.tail_s = 4.0, 2.0
            lab = Lab(load_topology(name=f"cglb-{os.getpid()}"), state_dir=out / "lab")
            run_dir = out / mode.replace(" ", "-")
            closed = ClosedLoop(lab, sc, settings, run_dir, options)
            t0 = time.monotonic()
            try:
                lab.up()
                closed.start(say=lambda m, mode=mode: print(f"[{mode}] started {m}", flush=True))
                trials = closed.run(say=lambda m, mode=mode: print(f"[{mode}] {m}", flush=True))
                report = build_report(
                    settings.store_http_url, run_dir,
                    [(t.name, t.report.faults, t.packets) for t in trials],
                    options.latency_slo_ms, closed.policy_source, mode,
                )
            finally:
                closed.stop()
                lab.down()
            results[mode] = summarise(report.faults, args.fault_s)
            results[mode]["by_kind"] = {
                k: summarise([f for f in report.faults if f.kind == k], args.fault_s)
                for k in sorted({f.kind for f in report.faults})
            }
            results[mode]["wall_s"] = time.monotonic() - t0
            print(f"[{mode}] {json.dumps(results[mode])}", flush=True)
    finally:
        stack.down()
    (out / "results.json").write_text(json.dumps(results, indent=1))

    print(f"\ncgloop loop benchmark: {args.faults} faults per mode ({args.fault_s:g} s each), "
          f"gaming SLO p99 < {LoopOptions().latency_slo_ms:g} ms one-way; times in ms after "
          "onset (p50 / p90 / p99)")
    print(f"{'mode':16} {'onset->detected':>25} {'onset->applied':>25} "
          f"{'onset->recovered':>25} {'recovered<=1s':>14}")
    for mode, r in results.items():
        row = [" ".join(fmt(r[k][q]) for q in (50, 90, 99))
               for k in ("detect_ms", "applied_ms", "recovered_ms")]
        print(f"{mode:16} {row[0]:>25} {row[1]:>25} {row[2]:>25} "
              f"{r['recovered_within_1s']:>5}/{r['affected']:<8}")
    base = results.get("1s-window loop")
    loop = results.get("loop")
    if base and loop and loop["applied_ms"][50] and base["applied_ms"][50]:
        print(f"\nratio loop / 1s-window loop: onset->applied p50 "
              f"{loop['applied_ms'][50] / base['applied_ms'][50]:.2f}x, "
              f"onset->recovered p50 "
              f"{(loop['recovered_ms'][50] or 0) / (base['recovered_ms'][50] or 1):.2f}x")
    nol = results.get("no loop")
    if nol and loop and nol["recovered_ms"][50]:
        print(f"ratio loop / no loop: onset->recovered p50 "
              f"{(loop['recovered_ms'][50] or 0) / nol['recovered_ms'][50]:.2f}x")
    print(f"targets: onset->applied p99 <= 100 ms (loop: {fmt(loop and loop['applied_ms'][99])}),"
          f" recovered within 1 s ({loop and loop['recovered_within_1s']}/"
          f"{loop and loop['affected']} affected faults)")
    print(f"results: {out / 'results.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
