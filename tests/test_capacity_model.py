"""bench/datasets/capacity.py: the capacity model of docs/scale.md (issue 23)."""

from __future__ import annotations

import importlib.util
import math
import subprocess
import sys
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "bench" / "datasets" / "capacity.py"


def load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("capacity", SCRIPT)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def inputs(cap: ModuleType, **changes: float) -> object:
    base = dict(
        edges=10, flows_per_probe=100_000, sweep_s=0.1, other_rows_per_s=0, cores_per_node=16,
        replicas=2, utilisation=0.6, sink_cores=2, sink_writers=2, store_us_per_row=4.0,
        sink_us_per_row=1.0, broker_us_per_row=0.1, writer_rows_per_s=250_000,
        worker_records_per_core=12_000, classified_flows_per_s=0,
    )  # fmt: skip
    return cap.Inputs(**{**base, **changes})


def test_records_shards_sinks_workers_and_partitions_follow_the_inputs() -> None:
    cap = load()
    p = cap.plan(inputs(cap))
    assert p.records_per_probe == 1_000_000 and p.flow_rows_per_s == 10_000_000
    # a shard: 16 cores x 0.6 / 4 µs = 2.4 M rows/s -> 5 shards, 10 nodes
    assert p.shard_rows_per_s == 2_400_000 and (p.shards, p.store_nodes) == (5, 10)
    # a sink: min(2 x 0.6 / 1 µs = 1.2 M, 2 writers x 250 k) = 500 k rows/s -> 20
    assert p.sink_instances == 20
    assert p.workers == math.ceil(10_000_000 / 12_000 / 0.6)
    assert p.flow_partitions == max(p.workers, p.sink_instances * 2, math.ceil(1e7 / 150_000))
    assert p.partition_bound == "analytics workers"
    assert math.isclose(p.broker_cores, 10_000_000 * 0.1e-6 / 0.6)
    # twice the sweep interval halves every rate-bound count
    half = cap.plan(inputs(cap, sweep_s=0.2))
    assert half.flow_rows_per_s == 5_000_000 and half.shards == 3 and half.sink_instances == 10
    # more store cores: fewer shards; classification adds worker time
    assert cap.plan(inputs(cap, cores_per_node=64)).shards == 2
    busy = cap.plan(inputs(cap, classified_flows_per_s=20_565 * 60))
    assert busy.workers == math.ceil((10_000_000 / 12_000 + 60) / 0.6)


def test_the_command_refuses_bad_input_by_its_option() -> None:
    bad = subprocess.run(
        [sys.executable, str(SCRIPT), "plan", "--utilisation", "1.5"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode != 0 and "--utilisation" in bad.stderr, bad.stderr
    ok = subprocess.run(
        [sys.executable, str(SCRIPT), "plan", "--edges", "2", "--json"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert ok.returncode == 0, ok.stderr
    assert '"flow_rows_per_s": 2000000.0' in ok.stdout
