"""Column codecs and skip indexes (migration 0014) against today's schema, side by side.

    uv run python bench/datasets/bench_codecs.py [--flow-rows 600000] [--flows 1000]
        [--int-rows 200000] [--probe-rows 100000] [--other-rows 20000] [--repeat 10] [--rounds 2]

One run, two stores: "old" (the migrations before 0014: ClickHouse's default LZ4 on every
column, no skip indexes) and "new" (every migration). The same SYNTHETIC records go into both,
through the sink's writer (`StoreWriter`: Arrow for flows and INT, ProtobufList for the rest):

* flows: `bench_datasets._probe_messages` (the probe's shape: `--flows` flows, a record per
  flow per 100 ms sweep, 64 keyed batches a sweep; records differ in address, sequence, times
  and RTP jitter only), inserted as the sink's chunks (`bench_datasets._store_chunks`);
* INT: `bench_arrow_codec._int_batches` (the sample's four kinds in turn, 10 000 flows);
* probes, node samples, detections, actions (with their results): the contract's sample records
  (`cgloop.contracts.samples`) with sequence, times and the measured values varied
  deterministically (`_other_batches`), over the same time span as the flows.

Synthetic records repeat more than real ones (every flow record goes to the same server and
carries the same counters), so both schemas' bytes per row are lower than real traffic's:
compare the ratio, measured side by side.

Each store runs in a process of its own (chDB: one data folder per process), `--rounds` times,
alternating old, new, new, old (a drifting load on a shared machine cancels out). It prints,
per schema and with the ratio new/old:

1. ingest rate, rows/s of each kind through `StoreWriter.insert` (the store's whole insert:
   ingest table, views, target tables and roll-ups; merges run in the background), the first
   insert of each kind untimed; flows in the sink's chunks, INT 50 000 records an insert, the
   other kinds 2 000;
2. bytes per row on disk once every table was merged to one part per partition (`OPTIMIZE ...
   FINAL` on both): the columns' compressed bytes (`system.parts.data_compressed_bytes`) and
   everything the parts hold (`system.parts.bytes_on_disk`: columns, marks, primary and skip
   indexes);
3. query time, p50/p90/p99 of `--repeat` runs, of every panel query of the provisioned
   dashboards (`cgloop.dashboards.build.render`, variables resolved and macros expanded as
   Grafana does, `cgloop.dashboards.check`) over two ranges: the last fifth of the data
   ("recent", what a NOC's last-15-minutes view is of a day) and all of it; plus three analyst
   lookups the bloom filters are for (a server's flows, one detection by id, one node's
   actions).

And the load average before and after: the figures are CPU-bound on a shared 2-core machine.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

TABLES = (
    "flow_records",
    "int_hop_records",
    "int_flow_records",
    "int_queue_records",
    "int_drop_records",
    "probe_records",
    "node_samples",
    "detections",
    "actions",
    "action_results",
)
# The migration this benchmark measures; "old" is every migration before it.
NEW_MIGRATION = 14
SWEEP_NS = 100_000_000


def _other_batches(span_ns: int, probe_rows: int, other_rows: int) -> dict[str, list[bytes]]:
    """Probe records, node samples, detections and actions over `span_ns` from the samples'
    T0: the contract's sample records, sequence, times and measured values varied (SYNTHETIC).
    Values follow a deterministic pseudo-random walk so the gauges are neither constant nor
    noise."""
    from cgloop.bus.topics import ACTIONS, DETECTIONS, NODES, PROBES
    from cgloop.contracts.samples import (
        T0_NS,
        sample_action_batch,
        sample_detection_batch,
        sample_node_sample_batch,
        sample_probe_record_batch,
    )
    from cgloop.v1.action_pb2 import ActionBatch
    from cgloop.v1.detection_pb2 import DetectionBatch
    from cgloop.v1.node_pb2 import NodeSampleBatch
    from cgloop.v1.probe_pb2 import ProbeRecordBatch

    def wobble(i: int, scale: int) -> int:
        return (i * 2654435761 >> 7) % scale

    out: dict[str, list[bytes]] = {}
    per = 1000  # records a Kafka message

    probe = sample_probe_record_batch().records[0]
    probes = 100
    step = span_ns * probes // max(probe_rows, 1)
    msgs, batch = [], ProbeRecordBatch()
    for i in range(probe_rows):
        r = batch.records.add()
        r.CopyFrom(probe)
        p, n = i % probes, i // probes
        r.header.source_id = f"node-{p % 10}/prober"
        r.header.sequence = n + 1
        r.probe_id = f"probe-{p:03}"
        r.probe_sequence = n + 1
        r.sent_ns = T0_NS + n * step + p * 1000
        r.rtt_ns = 300_000 + wobble(i, 200_000)
        r.forward_delay_ns, r.reverse_delay_ns = r.rtt_ns // 2, r.rtt_ns - r.rtt_ns // 2
        r.received_ns = r.sent_ns + r.rtt_ns
        r.header.timestamp_ns = r.received_ns
        r.lost, r.overdue = wobble(i, 100) == 0, False
        if len(batch.records) == per:
            msgs.append(batch.SerializeToString())
            batch = ProbeRecordBatch()
    out[PROBES.name] = msgs + ([batch.SerializeToString()] if batch.records else [])

    node = sample_node_sample_batch().records[0]
    nodes = max(1, other_rows * 1_000_000_000 // span_ns)  # one sample a second per node
    msgs, batch = [], NodeSampleBatch()
    for i in range(other_rows):
        r = batch.records.add()
        r.CopyFrom(node)
        k, s = i % nodes, i // nodes
        r.node_id = f"node-{k:03}"
        r.header.source_id = f"node-{k:03}/agent"
        r.header.sequence = s + 1
        r.header.timestamp_ns = T0_NS + s * 1_000_000_000
        r.power_watts = 80 + wobble(i, 4000) / 100
        r.energy_joules = 1000.0 + s * 80.5
        for c in r.cores:
            c.utilization = wobble(i + c.core, 1000) / 1000
        for q in r.queues:
            q.backlog_bytes = wobble(i, 90_000)
            q.drops += s // 7
            q.sojourn_p99_ns = 100_000 + wobble(i, 2_000_000)
        if len(batch.records) == per:
            msgs.append(batch.SerializeToString())
            batch = NodeSampleBatch()
    out[NODES.name] = msgs + ([batch.SerializeToString()] if batch.records else [])

    detection = sample_detection_batch().records[0]
    severities = ("SEVERITY_INFO", "SEVERITY_WARNING", "SEVERITY_CRITICAL")
    msgs, batch = [], DetectionBatch()
    for i in range(other_rows):
        r = batch.records.add()
        r.CopyFrom(detection)
        at = T0_NS + i * span_ns // other_rows
        r.header.sequence, r.header.timestamp_ns = i + 1, at
        r.id = f"det-{i:08}"
        r.window_start_ns, r.window_end_ns = at - 1_000_000_000, at
        r.confidence = 0.5 + wobble(i, 500) / 1000
        r.severity = severities[wobble(i, 20) // 18]  # mostly info
        if len(batch.records) == per:
            msgs.append(batch.SerializeToString())
            batch = DetectionBatch()
    out[DETECTIONS.name] = msgs + ([batch.SerializeToString()] if batch.records else [])

    events = sample_action_batch().events
    action = next(e for e in events if e.WhichOneof("event") == "action").action
    result = next(e for e in events if e.WhichOneof("event") == "result").result
    msgs, batch = [], ActionBatch()
    for i in range(other_rows // 2):
        at = T0_NS + i * span_ns // (other_rows // 2)
        a = batch.events.add().action
        a.CopyFrom(action)
        a.header.sequence, a.header.timestamp_ns = 2 * i + 1, at
        a.id = f"act-{i:08}"
        a.target.node_id = f"node-{i % 50:03}"
        res = batch.events.add().result
        res.CopyFrom(result)
        res.header.sequence, res.header.timestamp_ns = 2 * i + 2, at + 20_000_000
        res.action_id = a.id
        res.apply_latency_ns = 10_000 + wobble(i, 50_000)
        if len(batch.events) >= per:
            msgs.append(batch.SerializeToString())
            batch = ActionBatch()
    out[ACTIONS.name] = msgs + ([batch.SerializeToString()] if batch.events else [])
    return out


def generate(args: argparse.Namespace) -> dict[str, list[list[bytes]]]:
    """Every kind's inserts: topic -> chunks of Kafka values (SYNTHETIC records)."""
    from bench_arrow_codec import _int_batches
    from bench_datasets import _probe_messages, _store_chunks
    from cgloop.bus.topics import FLOWS, INT

    sweeps = -(-args.flow_rows // args.flows)
    span_ns = sweeps * SWEEP_NS
    inserts = {FLOWS.name: _store_chunks(_probe_messages(args.flow_rows, args.flows))}
    ints = _int_batches(args.int_rows)
    inserts[INT.name] = [ints[i : i + 10] for i in range(0, len(ints), 10)]
    for topic, msgs in _other_batches(span_ns, args.probe_rows, args.other_rows).items():
        inserts[topic] = [msgs[i : i + 2] for i in range(0, len(msgs), 2)]
    return inserts


_ANALYST = {
    # The synthetic flows all go to the sample's one server: this reads every row in both.
    "flows to the one server (dst_addr, bloom filter)": "SELECT count(), sum(bytes) FROM"
    " cgloop.flow_records WHERE dst_addr = toIPv6('{dst}')",
    "flows to a server without any (dst_addr, bloom filter)": "SELECT count(), sum(bytes) FROM"
    " cgloop.flow_records WHERE dst_addr = toIPv6('2001:db8::dead')",
    "one detection by id (bloom filter)": "SELECT kind, severity, window_end FROM"
    " cgloop.detections WHERE id = 'det-00001234'",
    "one node's actions (target_node_id, bloom filter)": "SELECT count() FROM cgloop.actions"
    " WHERE target_node_id = 'node-007'",
}


def worker(schema: str, inserts_file: str, store: str, repeat: int) -> None:
    """One schema in this process: migrate, ingest, merge, measure; print one JSON line."""
    import shutil

    import clickhouse_connect
    from cgloop.contracts.samples import T0_NS
    from cgloop.dashboards.build import render
    from cgloop.dashboards.check import (
        DEFAULT_MAX_DATA_POINTS,
        TimeRange,
        _panels,
        _resolve,
        expand_macros,
        interpolate,
        interval_ms,
    )
    from cgloop.datasets.records import KINDS
    from cgloop.datasets.sink.writer import StoreWriter
    from cgloop.datasets.store.migrations import default_migrations_dir, discover, migrate

    client = clickhouse_connect.get_client(dsn=f"chdb://{store}")
    with tempfile.TemporaryDirectory() as tmp:
        for m in discover(default_migrations_dir()):
            if schema == "new" or m.version < NEW_MIGRATION:
                shutil.copy(default_migrations_dir() / m.name, tmp)
        migrate(client, Path(tmp))
    with open(inserts_file, "rb") as f:
        inserts: dict[str, list[list[bytes]]] = pickle.load(f)
    writer = StoreWriter(client)
    out: dict = {"ingest": {}, "bytes": {}, "queries": {}}
    for topic, chunks in inserts.items():
        kind = KINDS[topic]
        rows, took = 0, 0.0
        for i, chunk in enumerate(chunks):
            start = time.perf_counter()
            written = writer.insert(kind, chunk, f"bench/{topic}/{i}")
            if i or len(chunks) == 1:  # a kind's first insert (its set-up) is not timed
                rows, took = rows + written, took + time.perf_counter() - start
        out["ingest"][kind.name] = [rows, took]
    del inserts
    for table in TABLES:
        client.command(f"OPTIMIZE TABLE cgloop.{table} FINAL")
    for table in TABLES:
        # system.parts, not system.columns: a small (compact) part has no per-column sizes.
        rows, compressed, uncompressed, disk, parts = client.query(
            "SELECT sum(rows), sum(data_compressed_bytes), sum(data_uncompressed_bytes),"
            " sum(bytes_on_disk), count() FROM system.parts"
            " WHERE database = 'cgloop' AND table = {t:String} AND active",
            parameters={"t": table},
        ).result_rows[0]
        out["bytes"][table] = [int(rows), int(compressed), int(uncompressed), int(disk), parts]

    class _Store:  # what check._resolve asks of a store: rows(sql)
        def rows(self, sql: str) -> list[list]:
            return [list(r) for r in client.query(sql).result_rows]

    def timed(sql: str) -> list[float]:
        client.query(sql)  # warm (the first run reads the files into the page cache)
        times = []
        for _ in range(repeat):
            start = time.perf_counter()
            client.query(sql)
            times.append(1e3 * (time.perf_counter() - start))
        return times

    end = (
        max(
            client.query(
                "SELECT toUnixTimestamp64Nano(max(interval_start)) FROM cgloop.flow_records"
            ).result_rows[0][0],
            T0_NS,
        )
        + SWEEP_NS
    )
    ranges = {"recent": TimeRange(end - (end - T0_NS) // 5, end), "all": TimeRange(T0_NS, end)}
    for label, rng in ranges.items():
        dashboards = [json.loads(t) for n, t in render().items() if n.endswith(".json")]
        for model in dashboards:
            problems: list = []
            variables = _resolve(model, _Store(), rng, problems)  # type: ignore[arg-type]
            for panel in _panels(model):
                if panel.get("type") == "row" or not panel.get("targets"):
                    continue
                points = int(panel.get("maxDataPoints") or DEFAULT_MAX_DATA_POINTS)
                step = interval_ms(rng, points)
                for target in panel["targets"]:
                    if "rawSql" not in target:
                        continue  # PromQL (pipeline health): the daemons' metrics, no store
                    try:
                        sql = interpolate(target["rawSql"], variables, rng, step)
                        sql = expand_macros(sql, rng, step)
                        times = timed(sql)
                    except Exception as exc:  # a panel the other schema cannot run: say so
                        print(f"  {schema}: {model['uid']} / {panel.get('title')}: {exc}"[:300],
                              file=sys.stderr)  # fmt: skip
                        continue
                    name = f"{label} | {model['uid']} | {panel.get('title')} {target['refId']}"
                    out["queries"][name] = times
    dst = client.query("SELECT toString(any(dst_addr)) FROM cgloop.flow_records").result_rows[0][0]
    for name, sql in _ANALYST.items():
        out["queries"][f"lookup | {name}"] = timed(sql.format(dst=dst))
    print(json.dumps(out))


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def dist(values: list[float]) -> str:
    return "/".join(f"{pct(values, q):.1f}" for q in (0.5, 0.9, 0.99))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--flow-rows", type=int, default=600_000, help="flow records")
    parser.add_argument("--flows", type=int, default=1000, help="flows a sweep (100 ms)")
    parser.add_argument("--int-rows", type=int, default=200_000, help="INT records")
    parser.add_argument("--probe-rows", type=int, default=100_000, help="probe records")
    parser.add_argument(
        "--other-rows", type=int, default=20_000, help="node samples, detections, actions each"
    )
    parser.add_argument("--repeat", type=int, default=10, help="runs of each query a round")
    parser.add_argument(
        "--rounds", type=int, default=2, help="runs of each store, alternating: old new new old"
    )
    parser.add_argument("--worker", nargs=3, metavar=("SCHEMA", "INSERTS", "STORE"),
                        help=argparse.SUPPRESS)  # fmt: skip
    args = parser.parse_args()
    if args.worker:
        worker(*args.worker, repeat=args.repeat)
        return

    load = [("before", os.getloadavg())]
    started = time.perf_counter()
    print(
        f"SYNTHETIC records: {args.flow_rows:,} flow ({args.flows:,} flows x 100 ms sweeps),"
        f" {args.int_rows:,} INT, {args.probe_rows:,} probe, {args.other_rows:,} node samples,"
        f" detections and actions (with their results) each ..."
    )
    inserts = generate(args)
    runs: dict[str, list[dict]] = {"old": [], "new": []}
    with tempfile.TemporaryDirectory(ignore_cleanup_errors=True) as tmp:
        inserts_file = Path(tmp) / "inserts.pickle"
        with open(inserts_file, "wb") as f:
            pickle.dump(inserts, f)
        del inserts
        print(f"  generated in {time.perf_counter() - started:.1f} s")
        # old, new, new, old, ...: the load of a shared machine drifts; this cancels a trend.
        order = [("old", "new") if r % 2 == 0 else ("new", "old") for r in range(args.rounds)]
        for r, schema in enumerate(s for pair in order for s in pair):
            t = time.perf_counter()
            done = subprocess.run(
                [sys.executable, __file__, "--repeat", str(args.repeat), "--worker", schema,
                 str(inserts_file), str(Path(tmp) / f"{schema}-{r}")],
                capture_output=True, text=True,
            )  # fmt: skip
            # A panel query that failed (named by the worker), or the worker's traceback.
            sys.stderr.write(done.stderr[-4000:])
            if done.returncode:
                raise SystemExit(f"the {schema} store's run failed ({done.returncode})")
            runs[schema].append(json.loads(done.stdout.strip().splitlines()[-1]))
            print(f"  {schema} store measured in {time.perf_counter() - t:.1f} s")
            load.append((f"after {schema}", os.getloadavg()))
    # Ingest: each kind's best rate over the rounds; bytes: the same in every round (the
    # first's); query times: every run of every round.
    results: dict[str, dict] = {}
    for schema, rs in runs.items():
        results[schema] = {
            "ingest": {
                k: max((r["ingest"][k] for r in rs), key=lambda v: v[0] / v[1])
                for k in rs[0]["ingest"]
            },
            "bytes": rs[0]["bytes"],
            "queries": {
                q: [t for r in rs for t in r["queries"].get(q, [])] for q in rs[0]["queries"]
            },
        }
    old, new = results["old"], results["new"]
    label = {"old": f"old (migrations < {NEW_MIGRATION:04})", "new": "new (0014 codecs, indexes)"}
    print(f"\n{label['old']} vs {label['new']}; ratio = new/old")

    print(
        f"\ningest through StoreWriter, rows/s, best of {args.rounds}"
        " (the whole store insert, views included):"
    )
    totals = {"old": [0, 0.0], "new": [0, 0.0]}
    for kind in old["ingest"]:
        rates = {}
        for s, r in results.items():
            rows, took = r["ingest"][kind]
            rates[s] = rows / took
            totals[s][0] += rows
            totals[s][1] += took
        print(
            f"  {kind:<11} {rows:>9,} rows: old {rates['old']:>10,.0f}  new {rates['new']:>10,.0f}"
            f"  ratio {rates['new'] / rates['old']:.2f}"
        )
    t_old, t_new = (totals[s][0] / totals[s][1] for s in ("old", "new"))
    print(f"  {'all':<11} {totals['old'][0]:>9,} rows: old {t_old:>10,.0f}  new {t_new:>10,.0f}"
          f"  ratio {t_new / t_old:.2f}")  # fmt: skip

    print("\nbytes per row, every part merged (columns compressed | on disk incl. marks, indexes):")
    sums = {"old": [0, 0], "new": [0, 0]}
    for table in TABLES:
        o, n = old["bytes"][table], new["bytes"][table]
        if not o[0]:
            continue
        for s, v in (("old", o), ("new", n)):
            sums[s][0] += v[1]
            sums[s][1] += v[3]
        print(
            f"  {table:<17} {o[0]:>9,} rows: columns old {o[1] / o[0]:7.1f} new"
            f" {n[1] / n[0]:7.1f} ratio {n[1] / max(o[1], 1):.2f} | disk old {o[3] / o[0]:7.1f}"
            f" new {n[3] / n[0]:7.1f} ratio {n[3] / max(o[3], 1):.2f}"
            f" (uncompressed {o[2] / o[0]:.0f})"
        )
    print(
        f"  all tables: columns {sums['old'][0] / 2**20:.1f} -> {sums['new'][0] / 2**20:.1f} MiB"
        f" (ratio {sums['new'][0] / sums['old'][0]:.2f}); on disk {sums['old'][1] / 2**20:.1f}"
        f" -> {sums['new'][1] / 2**20:.1f} MiB (ratio {sums['new'][1] / sums['old'][1]:.2f})"
    )

    print(
        f"\nquery time, ms, p50/p90/p99 of {args.repeat} runs x {args.rounds} rounds"
        " (ratio of p50s):"
    )
    ratios: dict[str, list[float]] = {}
    for name, o in old["queries"].items():
        n = new["queries"].get(name)
        if n is None:
            continue
        ratio = statistics.median(n) / max(statistics.median(o), 1e-6)
        ratios.setdefault(name.split(" | ")[0], []).append(ratio)
        print(f"  {name[:66]:<66} old {dist(o)}  new {dist(n)}  ratio {ratio:.2f}")
    for group, rs in ratios.items():
        print(
            f"  {group}: {len(rs)} queries, p50 ratio geometric mean"
            f" {statistics.geometric_mean(rs):.2f} (min {min(rs):.2f}, max {max(rs):.2f})"
        )
    for s in ("old", "new"):
        all_q = [t for q in results[s]["queries"].values() for t in q]
        print(f"  every query, every run, {s}: p50 {pct(all_q, .5):.1f} p90 {pct(all_q, .9):.1f}"
              f" p99 {pct(all_q, .99):.1f} ms")  # fmt: skip
    print(
        "\nload average (1/5/15 min): "
        + ", ".join(f"{when} " + " ".join(f"{v:.2f}" for v in x) for when, x in load)
        + f"; wall time {time.perf_counter() - started:.0f} s, {os.cpu_count()} CPUs"
    )


if __name__ == "__main__":
    main()
