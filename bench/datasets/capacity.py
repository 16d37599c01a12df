"""Capacity model of cgloop's data path: what N edge nodes need (docs/scale.md, issue 23).

    uv run python bench/datasets/capacity.py --edges 40 [--flows-per-probe 100000]
        [--sweep-s 0.1] [--cores-per-node 16] ... [--json]
    uv run python bench/datasets/capacity.py measure-worker     # the analytics figure, here

From the probe's export (one flow record per active flow per sweep) to the records per second
the bus, the sinks, the store and the analytics workers carry, and from the CPU each of them
spends per record (measured on this project's benchmarks; the defaults below name their runs)
to how many of each: store shards and nodes, sink instances, Kafka partitions per topic,
analytics workers per group. Every input is an option; the output says which figure bounds.

The model is linear in records (each stage's CPU per record times the rate, over the cores it
may use at the target utilisation). It leaves out what was not measured per record: INT,
probes, node samples, detections and actions (orders of magnitude fewer rows than flows: add
them with --other-rows-per-s), disk, network, and the replica's own merges on a replicated
shard (each replica merges the parts it holds; the insert path, views included, runs on one).
"""

from __future__ import annotations

import json
import math
import time
from typing import Annotated

import typer
from pydantic import BaseModel, Field, ValidationError

# Measured per-record CPU (µs of CPU time a flow record), each with its run. docs/datasets.md,
# "Benchmark", probe shape, 2026-11-24 04:04-04:08 UTC (2-core machine, load 0.6-1.7):
KAFKA_CONSUME_US = 0.59  # "Kafka consume alone (same messages, no store)"
ARROW_CODEC_US = 0.33  # "cgloop.arrowcodec alone (protobuf -> Arrow IPC, no store)"
BROKER_US = 0.11  # the broker's JVM CPU per row through the sink
# The whole sink + store per row with the merges those inserts started run to the end (the
# "sustainable" line), consumer and codec included: 5.00 µs.
SINK_AND_STORE_US = 5.00
# One sink writer thread (partition -> writer, in order): 267 538 rows/s, the `new1` line.
ONE_WRITER_ROWS_PER_S = 267_538
# The analytics engine (AnalyticsEngine.on_flows, detectors, no classifier), one core, on the
# synthetic gaming sessions: `capacity.py measure-worker` (docs/scale.md gives the run).
WORKER_RECORDS_PER_CORE = 12_000
# Classifier: features + batched predict, docs/analytics.md "Benchmark": 20 565 flows/s.
CLASSIFY_FLOWS_PER_S = 20_565


class Inputs(BaseModel):
    """What the model takes (every figure per second unless named otherwise)."""

    edges: int = Field(ge=1, description="edge nodes, one probe each")
    flows_per_probe: int = Field(ge=1, description="active flows a probe watches")
    sweep_s: float = Field(gt=0, description="the probe's export sweep (s)")
    other_rows_per_s: float = Field(ge=0, description="INT, probe, node, ... rows, all edges")
    cores_per_node: int = Field(ge=1, description="cores of a store node")
    replicas: int = Field(ge=1, description="replicas per shard")
    utilisation: float = Field(gt=0, le=1, description="target CPU share a stage may use")
    sink_cores: int = Field(ge=1, description="cores of one sink instance")
    sink_writers: int = Field(ge=1, description="writer threads per sink (SinkConfig.writers)")
    store_us_per_row: float = Field(gt=0, description="store CPU per row, views and merges")
    sink_us_per_row: float = Field(gt=0, description="sink CPU per row (consume + codec)")
    broker_us_per_row: float = Field(ge=0, description="Kafka broker CPU per row")
    writer_rows_per_s: float = Field(gt=0, description="one sink writer's rows/s")
    worker_records_per_core: float = Field(gt=0, description="analytics records/s a core")
    classified_flows_per_s: float = Field(ge=0, description="new conversations classified/s")


class Plan(BaseModel):
    records_per_probe: float
    flow_rows_per_s: float
    rows_per_s: float
    bus_mb_per_s: float
    shard_rows_per_s: float
    shards: int
    store_nodes: int
    sink_instances: int
    flow_partitions: int
    partition_bound: str
    workers: int
    broker_cores: float


def flow_record_bytes() -> int:
    """Bytes of a flow record in a FlowRecordBatch on the bus: the contract's sample record
    (a gaming flow, RTP fields and histograms filled)."""
    from cgloop.contracts.samples import sample_flow_record_batch

    return len(sample_flow_record_batch().records[0].SerializeToString())


def plan(i: Inputs) -> Plan:
    per_probe = i.flows_per_probe / i.sweep_s
    flows = per_probe * i.edges
    rows = flows + i.other_rows_per_s
    usable = i.cores_per_node * i.utilisation
    shard_rate = usable * 1e6 / i.store_us_per_row
    shards = math.ceil(rows / shard_rate)
    sink_rate = min(i.sink_cores * i.utilisation * 1e6 / i.sink_us_per_row,
                    i.sink_writers * i.writer_rows_per_s)  # fmt: skip
    sinks = math.ceil(rows / sink_rate)
    classify_s = i.classified_flows_per_s / CLASSIFY_FLOWS_PER_S  # core-seconds a second
    workers = math.ceil((flows / i.worker_records_per_core + classify_s) / i.utilisation)
    # A partition is read by one consumer of a group and inserted by one sink writer, in order:
    # enough partitions for the rate one writer takes, and for every consumer of the largest
    # group to hold one (partitions cannot be taken away, and adding some moves keys, so a
    # conversation's records would change partition: size it once).
    bounds = {
        "rate per writer": math.ceil(flows / (i.writer_rows_per_s * i.utilisation)),
        "sink writers": sinks * i.sink_writers,
        "analytics workers": workers,
    }
    bound = max(bounds, key=lambda k: bounds[k])
    return Plan(
        records_per_probe=per_probe,
        flow_rows_per_s=flows,
        rows_per_s=rows,
        bus_mb_per_s=flows * flow_record_bytes() / 1e6,
        shard_rows_per_s=shard_rate,
        shards=shards,
        store_nodes=shards * i.replicas,
        sink_instances=sinks,
        flow_partitions=bounds[bound],
        partition_bound=bound,
        workers=workers,
        broker_cores=rows * i.broker_us_per_row / 1e6 / i.utilisation,
    )


app = typer.Typer(add_completion=False, help=__doc__.splitlines()[0])


@app.command("plan")
def plan_cmd(
    edges: Annotated[int, typer.Option(help="edge nodes, one probe each")] = 10,
    flows_per_probe: Annotated[int, typer.Option(help="active flows a probe watches")] = 100_000,
    sweep_s: Annotated[float, typer.Option(help="the probe's export sweep, s")] = 0.1,
    other_rows_per_s: Annotated[float, typer.Option(help="non-flow rows/s, all edges")] = 0.0,
    cores_per_node: Annotated[int, typer.Option(help="cores of a store node")] = 16,
    replicas: Annotated[int, typer.Option(help="replicas per shard")] = 2,
    utilisation: Annotated[float, typer.Option(help="target CPU share, 0-1")] = 0.6,
    sink_cores: Annotated[int, typer.Option(help="cores of a sink instance")] = 2,
    sink_writers: Annotated[int, typer.Option(help="writer threads a sink")] = 2,
    store_us_per_row: Annotated[
        float, typer.Option(help="store CPU µs a row (views, merges)")
    ] = SINK_AND_STORE_US - KAFKA_CONSUME_US - ARROW_CODEC_US,
    sink_us_per_row: Annotated[
        float, typer.Option(help="sink CPU µs a row (consume, codec)")
    ] = KAFKA_CONSUME_US + ARROW_CODEC_US,
    broker_us_per_row: Annotated[float, typer.Option(help="broker CPU µs a row")] = BROKER_US,
    writer_rows_per_s: Annotated[
        float, typer.Option(help="rows/s one sink writer inserts")
    ] = ONE_WRITER_ROWS_PER_S,
    worker_records_per_core: Annotated[
        float, typer.Option(help="analytics records/s a core")
    ] = WORKER_RECORDS_PER_CORE,
    classified_flows_per_s: Annotated[
        float, typer.Option(help="new conversations classified per second, all edges")
    ] = 0.0,
    as_json: Annotated[bool, typer.Option("--json", help="print the plan as JSON")] = False,
) -> None:
    """What N edges need: shards, store nodes, sinks, partitions, workers."""
    try:
        inputs = Inputs(**{k: v for k, v in locals().items() if k in Inputs.model_fields})
    except ValidationError as exc:
        first = exc.errors()[0]
        name = "--" + str(first["loc"][0]).replace("_", "-")
        raise typer.BadParameter(first["msg"], param_hint=name) from None
    p = plan(inputs)
    if as_json:
        print(json.dumps({"inputs": inputs.model_dump(), "plan": p.model_dump()}, indent=1))
        return
    print(
        f"{inputs.edges} edges x {inputs.flows_per_probe:,} flows / {inputs.sweep_s:g} s sweep"
        f" = {p.records_per_probe:,.0f} flow records/s a probe, {p.flow_rows_per_s:,.0f} in all"
        f" (+{inputs.other_rows_per_s:,.0f} other rows/s); ~{p.bus_mb_per_s:,.0f} MB/s of"
        " flow batches on the bus"
    )
    print(
        f"store: a shard of {inputs.cores_per_node} cores at {inputs.utilisation:.0%} takes"
        f" {p.shard_rows_per_s:,.0f} rows/s ({inputs.store_us_per_row:.2f} µs a row) ->"
        f" {p.shards} shards x {inputs.replicas} replicas = {p.store_nodes} nodes"
    )
    print(
        f"sinks: {p.sink_instances} instances in one group ({inputs.sink_writers} writers,"
        f" {inputs.sink_cores} cores each); Kafka brokers: {p.broker_cores:.1f} cores"
    )
    print(
        f"partitions of the flow topic: at least {p.flow_partitions} (bound: {p.partition_bound})"
    )
    print(
        f"analytics: {p.workers} workers in one group ({inputs.worker_records_per_core:,.0f}"
        " records/s a core)"
    )


@app.command("measure-worker")
def measure_worker(
    sessions: Annotated[int, typer.Option(min=1, help="synthetic sessions per platform")] = 10,
    seconds: Annotated[float, typer.Option(min=1, help="length of each session, s")] = 20,
) -> None:
    """The analytics engine's records/s on one core (no Kafka, no classifier): the synthetic
    gaming sessions of cgloop.analytics.synthetic, 10 records a call as a worker's message."""
    from cgloop.analytics.engine import AnalyticsEngine
    from cgloop.analytics.synthetic import PROFILES, gaming_records

    records = []
    for i, platform in enumerate(sorted(PROFILES)):
        for j in range(sessions):
            client = bytes([10, 50, i, j % 256])
            records += gaming_records(platform, seconds, seed=i * 1000 + j, client=client)
    records.sort(key=lambda r: r.interval_start_ns)
    engine = AnalyticsEngine(None)
    start = time.process_time()
    for k in range(0, len(records), 10):
        engine.on_flows(records[k : k + 10])
    cpu = time.process_time() - start
    print(
        f"{len(records):,} flow records, {cpu:.2f} s of CPU: {len(records) / cpu:,.0f} records/s"
        f" a core (model default {WORKER_RECORDS_PER_CORE:,})"
    )


def _cpu_s() -> float:
    """CPU time of this process, every thread (chDB's included)."""
    import resource

    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


@app.command("measure-store")
def measure_store(
    rows: Annotated[
        int, typer.Option(min=10_000, help="flow records, the probe's shape")
    ] = 300_000,
) -> None:
    """The store's CPU per flow record (views included) and the codec's, in this process: the
    inserts the sink would make of `rows` records in the probe's shape (bench_datasets.py's
    messages and chunks) into a fresh embedded store, then until its merges settle."""
    import sys
    import tempfile
    from pathlib import Path

    import clickhouse_connect
    from cgloop.bus.topics import FLOWS
    from cgloop.datasets.records import KINDS
    from cgloop.datasets.sink.writer import StoreWriter
    from cgloop.datasets.store.migrations import migrate

    sys.path.insert(0, str(Path(__file__).parent))
    from bench_datasets import _messages, _store_chunks

    chunks = _store_chunks(_messages(rows, "probe"))
    with tempfile.TemporaryDirectory() as folder:
        client = clickhouse_connect.get_client(dsn=f"chdb://{folder}")
        migrate(client)
        writer, kind = StoreWriter(client), KINDS[FLOWS.name]
        encode_s = insert_s = 0.0
        wall = time.perf_counter()
        for i, chunk in enumerate(chunks):
            t = _cpu_s()
            encoded = writer.encode(kind, chunk)
            encode_s += _cpu_s() - t
            t = _cpu_s()
            writer.insert(kind, chunk, f"capacity/{i}", encoded)
            insert_s += _cpu_s() - t
        wall = time.perf_counter() - wall
        t = _cpu_s()
        while client.query("SELECT count() FROM system.merges").result_rows[0][0]:
            time.sleep(0.2)
        merges_s = _cpu_s() - t  # the settling merges (and this loop's few queries)
        stored = client.query("SELECT count() FROM cgloop.flow_records").result_rows[0][0]
    print(
        f"{stored:,} rows in {len(chunks)} inserts, {wall:.1f} s: codec {encode_s / rows * 1e6:.2f}"
        f" µs a row, store insert {insert_s / rows * 1e6:.2f} µs a row (views included), merges"
        f" settling after {merges_s / rows * 1e6:.2f} µs a row -> store"
        f" {(insert_s + merges_s) / rows * 1e6:.2f} µs a row (model default"
        f" {SINK_AND_STORE_US - KAFKA_CONSUME_US - ARROW_CODEC_US:.2f})"
    )


if __name__ == "__main__":
    app()
