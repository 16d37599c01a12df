"""What the node micro loop's records cost the store: ingest and the dashboards' panels.

    uv run python bench/datasets/bench_micro_loop_panels.py [--hours 24] [--nodes 2]
        [--classes 5] [--sanctions-per-s 10] [--repeat 15] [--store DIR]

A private chDB store takes `--hours` of node samples (one a second per node, `--classes` queue
samples each: what the agent exports with `[queues]` on) and the node-level actions one
unresponsive ECT(1) flow causes for as long (a QUEUE_PROTECTION_SANCTION record and its result
per audit interval: `--sanctions-per-s` = 1000 / `[guard] audit_interval_ms`), through the
sink's ProtobufList path. It prints the ingest cost per node sample and per action, then each
micro-loop panel's query time over the last 15 minutes and over the whole range (p50/p90/p99 of
`--repeat` runs, ms) against a budget: 100 ms for 15 minutes (a 10 s refresh, several panels
at once) and 2 s for the whole range. With the load average: the numbers are CPU-bound on a
2-core machine shared with other builds. `--store DIR` keeps the filled store there and reuses
it on the next run (only the queries run again: for comparing panel SQL).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

_WORKER = r"""
import json, sys, time
import clickhouse_connect
from cgloop.bus.topics import ACTIONS, NODES
from cgloop.dashboards.build import render
from cgloop.dashboards.check import TimeRange, Variable, expand_macros, interpolate, interval_ms
from cgloop.datasets.records import KINDS
from cgloop.datasets.sink.writer import StoreWriter
from cgloop.datasets.store.migrations import migrate
from cgloop.v1 import action_pb2, common_pb2, node_pb2

path, hours = sys.argv[1], float(sys.argv[2])
nodes, classes, per_s, repeat = map(int, sys.argv[3:7])
client = clickhouse_connect.get_client(dsn=f"chdb://{path}")
migrate(client)
filled = client.query("SELECT count() FROM cgloop.node_samples").result_rows[0][0] > 0
writer = StoreWriter(client, columnar=False)
end_ns = 1_750_000_000 * 10**9
seconds = int(hours * 3600)
start_ns = end_ns - seconds * 10**9

t_nodes = 0.0
for node in range(0 if filled else nodes):
    for chunk in range(0, seconds, 3600):
        batch = node_pb2.NodeSampleBatch()
        for s in range(chunk, min(chunk + 3600, seconds)):
            r = batch.records.add(node_id=f"node-{node}")
            r.header.CopyFrom(common_pb2.RecordHeader(
                schema_version=1, source_id=f"node-{node}/node-agent", sequence=s + 1,
                timestamp_ns=start_ns + s * 10**9))
            for c in range(classes):
                r.queues.add(interface_name="cpe", class_id=0x10010 + 0x10 * c,
                             class_name=f"c{c}", backlog_bytes=s % 9000, drops=s // 7,
                             overlimits=s, sojourn_p99_ns=(s * 7919) % 20_000_000,
                             sojourn_max_ns=(s * 7919) % 40_000_000,
                             qprot_sanctioned_packets=s % 3, ce_marked_packets=s % 5)
            r.micro_loop.CopyFrom(node_pb2.MicroLoopStatus(acting=True, protected_flows=2))
        t = time.perf_counter()
        writer.insert(KINDS[NODES.name], [batch.SerializeToString()], f"n{node}-{chunk}")
        t_nodes += time.perf_counter() - t

t_actions, actions = 0.0, 0
step_ns = 10**9 // per_s if per_s else 0
for chunk in range(0, 0 if filled else seconds * per_s, 20_000):
    batch = action_pb2.ActionBatch()
    for i in range(chunk, min(chunk + 20_000, seconds * per_s)):
        at = start_ns + i * step_ns
        a = batch.events.add().action
        a.header.CopyFrom(common_pb2.RecordHeader(
            schema_version=1, source_id="node-0/node-agent", sequence=2 * i + 1, timestamp_ns=at))
        a.id, a.level = f"sanction-{i}", action_pb2.ACTION_LEVEL_NODE
        a.operation = action_pb2.ACTION_OPERATION_QUEUE_PROTECTION_SANCTION
        a.state, a.cause = action_pb2.ACTION_STATE_APPLIED, "class 1:40 queue delay 2.1 ms"
        a.target.node_id = "node-0"
        a.queue_protection_sanction.sanctioned_packets = 40
        res = batch.events.add().result
        res.header.CopyFrom(a.header)
        res.header.sequence += 1
        res.action_id, res.state = a.id, action_pb2.ACTION_STATE_APPLIED
        res.applied_ns, res.apply_latency_ns = at + 20_000, 20_000
        actions += 1
    t = time.perf_counter()
    writer.insert(KINDS[ACTIONS.name], [batch.SerializeToString()], f"a{chunk}")
    t_actions += time.perf_counter() - t
if not filled:
    client.command("OPTIMIZE TABLE cgloop.node_samples FINAL")
actions = client.query("SELECT count() FROM cgloop.actions").result_rows[0][0]

micro = {
    ("cgloop-nodes", t) for t in (
        "Queue delay per class (measured sojourn p99 / max)", "Queue backlog per class",
        "Drops and overlimits per class", "Queue protection sanctions and CE marks per class",
        "Micro loop status", "Actions on these nodes by level")
} | {("cgloop-loop", "Actions by level and operation"), ("cgloop-loop", "Node micro-loop actions"),
     ("cgloop-noc", "Actions per level and operation")}
models = [json.loads(t) for n, t in render().items() if n.endswith(".json")]
variables = {"node": Variable("node", [f"node-{n}" for n in range(nodes)], True, is_all=True)}
out = {"node_samples": nodes * seconds, "actions": actions, "reused": filled,
       "us_per_node_sample": 1e6 * t_nodes / max(nodes * seconds, 1),
       "us_per_action": 1e6 * t_actions / max(actions, 1), "panels": {}}
for label, span_s in (("15 min", 900), ("whole range", seconds)):
    rng = TimeRange(end_ns - span_s * 10**9, end_ns)
    step = interval_ms(rng)
    for m in models:
        for p in m["panels"]:
            if (m["uid"], p["title"]) not in micro:
                continue
            sql = interpolate(p["targets"][0]["rawSql"], variables, rng, step)
            sql = expand_macros(sql, rng, step)
            times = []
            for _ in range(repeat):
                t = time.perf_counter()
                client.query(sql)
                times.append(1e3 * (time.perf_counter() - t))
            out["panels"][f"{label} | {p['title']}"] = times
print(json.dumps(out))
"""


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--hours", type=float, default=24)
    ap.add_argument("--nodes", type=int, default=2)
    ap.add_argument("--classes", type=int, default=5)
    ap.add_argument("--sanctions-per-s", type=int, default=10)
    ap.add_argument("--repeat", type=int, default=15)
    ap.add_argument("--store", type=Path, help="keep the store here (reused when filled)")
    args = ap.parse_args()
    folder = args.store or Path(tempfile.mkdtemp(prefix="cgloop-bench-micro-"))
    try:
        done = subprocess.run(
            [
                sys.executable,
                "-c",
                _WORKER,
                str(folder / "store"),
                str(args.hours),
                str(args.nodes),
                str(args.classes),
                str(args.sanctions_per_s),
                str(args.repeat),
            ],
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode != 0:
            sys.exit(done.stderr[-3000:])
        out = json.loads(done.stdout.strip().splitlines()[-1])
    finally:
        if args.store is None:
            shutil.rmtree(folder, ignore_errors=True)
    load = os.getloadavg()
    print(
        f"store: {out['node_samples']} node samples ({args.classes} classes each), "
        f"{out['actions']} node-level actions with results, {args.hours} h"
    )
    if out["reused"]:
        print(f"ingest: not measured (the store in {folder} was filled by an earlier run)")
    else:
        print(
            f"ingest: {out['us_per_node_sample']:.1f} us per node sample, "
            f"{out['us_per_action']:.1f} us per action + result (ProtobufList, with the views)"
        )
    print(f"{'range | panel':<78} {'p50':>8} {'p90':>8} {'p99':>8} {'budget':>7} {'ratio':>6}")
    for name, times in out["panels"].items():
        budget = 100.0 if name.startswith("15 min") else 2000.0
        p99 = pct(times, 0.99)
        print(
            f"{name:<78} {statistics.median(times):8.1f} {pct(times, 0.9):8.1f} "
            f"{p99:8.1f} {budget:7.0f} {p99 / budget:6.2f}"
        )
    print(f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} ({os.cpu_count()} cores)")


if __name__ == "__main__":
    main()
