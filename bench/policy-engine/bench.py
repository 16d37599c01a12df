"""Policy engine benchmark: decision latency at 10 k detections/s, and planner runtimes.

    uv run python bench/policy-engine/bench.py            # everything (starts its own Kafka)
    uv run python bench/policy-engine/bench.py planners   # Natif only, no Kafka
    uv run python bench/policy-engine/bench.py decide     # in-process decision latency only

Figures and the baselines they are compared with, side by side in the same run:
* planners: Natif (Algorithm 1 + 2) at DS1/DS2/DS3 (100/200/300 functions, 30/60/90 chains,
  1 k/2 k/3 k flows, Hajji §7.3) against the throughput-only baseline (StratosB) and Greedy
  run on the same data, and against the published Natif mapping runtimes 1 / 2.3 / 3.3 s;
* decide: detection -> action event inside the engine (guards, journal with fsync, a real
  gRPC call to an in-memory node agent for every applied action) at 10 k detections/s,
  against the same engine with the notify-only actuator and no journal (pure decision cost);
* kafka: detection produced -> action record consumed, through the real broker at
  10 k detections/s, the engine being `cgloop policy run` in its own process (as deployed,
  with an in-memory node agent in a third process), after a 1 s warm-up and a 2 s pause,
  against a pass-through process that turns every detection into an action record with no
  policy logic (the bus's own latency).
"""

from __future__ import annotations

import math
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

from cgloop.bus.topics import ACTIONS, DETECTIONS
from cgloop.policy import model
from cgloop.policy.actuators import NodeAgentActuator, NotifyActuator, Router
from cgloop.policy.engine import Engine
from cgloop.policy.guards import Budget
from cgloop.policy.journal import Journal
from cgloop.policy.planners import natif
from cgloop.policy.testing import detection
from cgloop.v1 import detection_pb2 as dpb

AGENT_SCRIPT = """
import sys
from cgloop.policy.testing import AgentServer, MemoryNodeAgent
with AgentServer(MemoryNodeAgent("node-a"), workers=8) as server:
    print(server.address, flush=True)
    sys.stdin.read()
"""
RATE = 10_000  # detections per second
BATCH = 50  # detections per Kafka message / per engine call (5 ms of detections)
PUBLISHED_NATIF_S = {1000: 1.0, 2000: 2.3, 3000: 3.3}  # Hajji Fig. 7.6b, flow mapping


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, max(0, math.ceil(q * len(s)) - 1))]


def dist(values_ns: list[float]) -> str:
    ms = [v / 1e6 for v in values_ns]
    return (
        f"p50 {pct(ms, 0.5):7.3f} ms  p99 {pct(ms, 0.99):7.3f} ms  "
        f"p99.9 {pct(ms, 0.999):7.3f} ms  max {max(ms):7.3f} ms  (n={len(ms)})"
    )


# --- planners ---------------------------------------------------------------------------------


def dataset(n_functions: int, n_chains: int, n_flows: int, seed: int = 7):
    rng = random.Random(seed)
    functions = {}
    for i in range(n_functions):
        cat = natif.Category.IO_BOUND if rng.random() < 0.6 else natif.Category.CPU_BOUND
        functions[f"nf{i}"] = natif.NetworkFunction(
            f"nf{i}",
            cat,
            capacity_pps=rng.choice([50_000, 100_000, 200_000]),
            capacity_bps=rng.choice([1e9, 2e9, 5e9]),
            multithreaded=rng.random() < 0.3,
            gain_pps=1.0,
            gain_bps=rng.choice([1.0, 1.0, 0.7]),
        )
    names = list(functions)
    rng.shuffle(names)
    per_chain = [names[i::n_chains] for i in range(n_chains)]  # each function in one chain
    flows = {}
    chain_flows: list[list[str]] = [[] for _ in range(n_chains)]
    for j in range(n_flows):
        # Profiles P1/P2 of §7.1: high packet rate and low throughput, or the reverse.
        if rng.random() < 0.5:
            f = natif.Flow(f"f{j}", rng.uniform(5_000, 20_000), rng.uniform(1e6, 20e6))
        else:
            f = natif.Flow(f"f{j}", rng.uniform(500, 3_000), rng.uniform(100e6, 400e6))
        flows[f.name] = f
        chain_flows[j % n_chains].append(f.name)
    branches = [
        natif.Branch(f"ch{i}", tuple(per_chain[i]), tuple(chain_flows[i])) for i in range(n_chains)
    ]
    return functions, branches, flows


def timed(fn, *args: object, repeat: int = 3) -> float:
    best = math.inf
    for _ in range(repeat):
        t = time.perf_counter()
        fn(*args)
        best = min(best, time.perf_counter() - t)
    return best


def bench_planners() -> None:
    print("\n== Planner runtimes (Natif, Hajji §7.3 data-set sizes; best of 3)")
    print(
        f"{'data set':<22}{'Natif':>10}{'thr-only':>10}{'Greedy':>10}"
        f"{'published':>11}{'vs pub.':>9}{'vs thr-only':>13}  flows through an overloaded instance"
        " (rho>=1): Natif / thr-only / Greedy"
    )
    for n_f, n_c, n_flows in [(100, 30, 1000), (200, 60, 2000), (300, 90, 3000)]:
        functions, branches, flows = dataset(n_f, n_c, n_flows)
        t_natif = timed(natif.natif, functions, branches, flows)
        t_thr = timed(natif.throughput_only, functions, branches, flows)
        t_greedy = timed(natif.greedy, functions, branches, flows, 64)
        plan = natif.natif(functions, branches, flows)
        thr = natif.throughput_only(functions, branches, flows)
        scaled, greedy = natif.greedy(functions, branches, flows, cores=64)

        def overloaded(fns, d, n: int = len(flows)) -> str:
            delays = natif.flow_delays_s(fns, d.distribution).values()
            return f"{sum(math.isinf(x) for x in delays) / n:.1%}"

        pub = PUBLISHED_NATIF_S[n_flows]
        print(
            f"{n_f} NF/{n_c} ch/{n_flows} flows".ljust(22)
            + f"{t_natif:9.3f}s{t_thr:9.3f}s{t_greedy:9.3f}s{pub:10.1f}s"
            + f"{t_natif / pub:8.3f}x{t_natif / t_thr:12.2f}x  "
            + f"{overloaded(functions, plan)} / {overloaded(functions, thr)} / "
            + f"{overloaded(scaled, greedy)}"
        )


# --- decision latency in process ----------------------------------------------------------------


def policies() -> list[model.Policy]:
    return [p for p in model.default_policies() if p.id != "function-overload-calvin-chain"]


def workload(n: int, seed: int = 1) -> list[dpb.Detection]:
    """Detections about 2 000 gaming flows (latency, jitter, L4S abuse) and a few nodes."""
    rng = random.Random(seed)
    labels = {"node_id": "node-a", "interface": "veth0", "platform": "GFN"}
    kinds = [
        dpb.DETECTION_KIND_SLO_LATENCY,
        dpb.DETECTION_KIND_SLO_JITTER,
        dpb.DETECTION_KIND_L4S_MICROBURST,
        dpb.DETECTION_KIND_GAMING_FLOW_CLASSIFIED,
    ]
    out = []
    for _ in range(n):
        client = f"10.{rng.randrange(1, 3)}.{rng.randrange(0, 40)}.{rng.randrange(1, 26)}"
        out.append(
            detection(
                time.time_ns(),
                kind=rng.choice(kinds),
                severity=rng.choice(
                    [dpb.SEVERITY_MINOR, dpb.SEVERITY_MAJOR, dpb.SEVERITY_CRITICAL]
                ),
                client=client,
                labels=labels,
            )
        )
    return out


def paced_engine_run(
    engine: Engine, dets: list[dpb.Detection], wait: bool = True
) -> list[float]:
    """Feed batches on a 10 k/s schedule; latency = event emitted - batch's scheduled arrival.

    wait=False (group commit, applies off the decision thread): a batch's events are out when
    the journal rows recorded while handling it are durable (checked between batches, as the
    service would before publishing).
    """
    latencies: list[float] = []
    waiting: list[tuple[int, list[int]]] = []  # (journal seq after the batch, arrivals)

    def release() -> None:
        durable = engine.journal.durable_seq
        done = time.perf_counter_ns()
        while waiting and waiting[0][0] <= durable:
            latencies.extend(done - a for a in waiting.pop(0)[1])

    start = time.perf_counter_ns() + 10_000_000
    for i in range(0, len(dets), BATCH):
        n = min(BATCH, len(dets) - i)
        arrivals = [start + (i + k) * 1_000_000_000 // RATE for k in range(n)]
        due = arrivals[-1]  # a batch is complete when its last detection has arrived
        while (now := time.perf_counter_ns()) < due:
            if not wait:
                release()
            if due - now > 200_000:
                time.sleep(min(due - now - 100_000, 500_000) / 1e9)
        batch = dpb.DetectionBatch(records=dets[i : i + n])
        t_wall = time.time_ns()
        for d in batch.records:
            d.header.timestamp_ns = t_wall
            d.window_end_ns = t_wall
        if not wait:
            engine.handle(batch, wait=False)
            waiting.append((engine.journal.seq, arrivals))
            release()
            continue
        engine.handle(batch)
        done = time.perf_counter_ns()
        # Each detection waited from its own arrival until its batch's events were out.
        latencies += [done - a for a in arrivals]
    if not wait:
        engine.finish_applies()
        while waiting:
            engine.journal.wait_durable(waiting[0][0], timeout=10)
            release()
    return latencies


def bench_decide(seconds: float = 5.0) -> None:
    n = int(RATE * seconds)
    dets = workload(n)
    warm = int(RATE * 1.0)  # drop the first second (Gallenmüller: warm-up)
    print(
        f"\n== Decision latency in process at {RATE} detections/s "
        f"({seconds:g} s, first 1 s dropped)"
    )
    # The in-memory agent runs in its own process, like a real agent: it must not share the
    # engine's interpreter lock.
    agent = subprocess.Popen(
        [sys.executable, "-c", AGENT_SCRIPT],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    address = agent.stdout.readline().strip()
    with tempfile.TemporaryDirectory() as tmp:
        node = NodeAgentActuator({"node-a": address})

        def engine(name: str, fsync: bool, **kw) -> Engine:
            """An engine on the agent with its own journal; fresh detection ids, so earlier
            runs' decisions do not make the detections duplicates."""
            for d in dets:
                d.id = str(uuid.uuid4())
            return Engine(
                policies(),
                Router(node),
                journal=Journal(Path(tmp) / f"{name}.jsonl", fsync=fsync),
                budget=Budget(limit=1_000_000, window_s=1),
                source_id=name,
                **kw,
            )

        full = engine("bench", fsync=True)
        lat = paced_engine_run(full, dets)[warm:]
        s = full.stats
        print(f"engine (guards, fsync journal, gRPC apply): {dist(lat)}")
        print("  (previous mode: fsync per batch and every apply awaited on the decision thread)")
        print(
            f"  decisions: {s.detections} detections, {s.applied} applied over gRPC, "
            f"{s.refused} refused by guards, {s.pending_trigger} waiting for hysteresis, "
            f"{s.unmatched} matched no policy"
        )
        # Same engine, journal written but not fsynced: how much of the cost is durability.
        nosync = engine("bench2", fsync=False)
        lat_nosync = paced_engine_run(nosync, dets)[warm:]
        print(f"engine, journal without fsync:              {dist(lat_nosync)}")
        # New mode: group-committed fsync journal on its writer thread, applies in the pool.
        gc = engine("bench3", fsync=True, apply_async=True)
        lat_gc = paced_engine_run(gc, dets, wait=False)[warm:]
        print(f"engine, group commit + async applies:       {dist(lat_gc)}")
        print(
            f"  {gc.stats.applied} applied over gRPC, {gc.journal.commits} journal commits "
            f"(fsync each) for {gc.journal.seq} rows, {gc.journal.compactions} compactions"
        )
        print(
            f"  ratio group commit/previous mode: p50 {pct(lat_gc, 0.5) / pct(lat, 0.5):.3f}x, "
            f"p99 {pct(lat_gc, 0.99) / pct(lat, 0.99):.3f}x"
        )
        gc.journal.close()
        node.close()
    agent.stdin.close()
    agent.wait(10)
    bare = Engine(policies(), NotifyActuator(), journal=Journal(None), budget=Budget(1_000_000, 1))
    for d in dets:
        d.id = str(uuid.uuid4())
    lat_bare = paced_engine_run(bare, dets)[warm:]
    print(f"baseline (notify actuator, no journal):     {dist(lat_bare)}")
    print(
        f"  ratio engine/baseline: p50 {pct(lat, 0.5) / pct(lat_bare, 0.5):.2f}x, "
        f"p99 {pct(lat, 0.99) / pct(lat_bare, 0.99):.2f}x"
    )


# --- decision latency through Kafka -------------------------------------------------------------


def passthrough(bootstrap: str, group: str) -> None:
    """Baseline worker (own process): every detection labelled `passthrough` becomes a NOTIFY
    action at once, no policy logic, no journal; the same draining and commits as the
    engine's service loop (up to 64 messages per flush)."""
    from cgloop.bus.kafka import BatchConsumer, BatchProducer
    from cgloop.contracts import SCHEMA_VERSION
    from cgloop.v1 import action_pb2 as apb
    from cgloop.v1.common_pb2 import RecordHeader

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    consumer = BatchConsumer(bootstrap, group, [DETECTIONS.name])
    producer = BatchProducer(bootstrap, client_id="bench-pass")
    print("passthrough: ready", flush=True)
    seq = 0
    while not stop.is_set():
        items = []
        item = consumer.poll(0.05)
        while item is not None:
            items.append(item)
            item = consumer.poll(0.001) if len(items) < 64 else None
        if not items:
            continue
        out = apb.ActionBatch()
        for d in (r for it in items for r in it[1].records):
            if d.labels.get("bench") != "passthrough":
                continue
            seq += 1
            out.events.add().action.CopyFrom(
                apb.Action(
                    header=RecordHeader(
                        schema_version=SCHEMA_VERSION,
                        source_id="bench-passthrough",
                        sequence=seq,
                        timestamp_ns=time.time_ns(),
                    ),
                    id=str(uuid.uuid4()),
                    reason_detection_ids=[d.id],
                    operation=apb.ACTION_OPERATION_NOTIFY,
                    state=apb.ACTION_STATE_PROPOSED,
                )
            )
        if out.events:
            producer.send(ACTIONS.name, out, key="pass")
            producer.flush()
        for msg in {it[2].partition(): it[2] for it in items}.values():
            consumer.commit(msg)
    consumer.close()


def bench_kafka(seconds: float = 5.0) -> None:
    """Detections produced -> action records consumed, the engine being `cgloop policy run`
    (its own process, as deployed: pipelined service, group-committed fsync journal, applies
    over gRPC to an in-memory node agent in a third process, verification feed on)."""
    import yaml
    from cgloop.bus.kafka import BatchConsumer, BatchProducer
    from cgloop.config import Settings
    from cgloop.stack.stack import Stack

    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from cgloop.testing import free_port  # the project's own free-port helper

    print(
        f"\n== Detection -> action through Kafka at {RATE} detections/s "
        f"({seconds:g} s after a 1 s warm-up and a 2 s pause)"
    )
    tmp = Path(tempfile.mkdtemp(prefix="cgloop-bench-policy-"))
    settings = Settings(
        state_dir=tmp,
        kafka_port=free_port(),
        kafka_controller_port=free_port(),
        store_port=free_port(),
        kafka_broker_security="plaintext",  # the recorded baselines had no TLS
    )
    stack = Stack(settings, sink=False)  # the store is not measured here
    status = stack.up()
    if not status.healthy:
        raise SystemExit(f"stack did not come up: {status.as_dict()}")
    bootstrap = settings.bootstrap_servers
    env = {**os.environ, "CGLOOP_STATE_DIR": str(tmp), "CGLOOP_KAFKA_BOOTSTRAP": bootstrap}
    # The shipped policies, matching only this benchmark's engine detections.
    policy_dir = tmp / "policies"
    policy_dir.mkdir()
    for p in policies():
        data = p.model_dump(mode="json", exclude_defaults=True)
        data["match"].setdefault("labels", {})["bench"] = "engine"
        (policy_dir / f"{p.id}.yaml").write_text(yaml.safe_dump(data))
    try:
        run = uuid.uuid4().hex
        n = int(RATE * (seconds + 1))  # one warm-up second, then `seconds` measured

        def start(cmd: list[str], ready: str) -> tuple[subprocess.Popen, str]:
            """Start a worker process; returns it and its first output line containing `ready`."""
            proc = subprocess.Popen(
                cmd, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
            )
            assert proc.stdout is not None
            for line in proc.stdout:
                if ready in line:
                    break
            else:
                raise SystemExit(f"{cmd[:3]} exited before it was ready")
            threading.Thread(target=proc.stdout.read, daemon=True).start()  # drain its output
            return proc, line.strip()

        def wait_assigned(group: str, timeout_s: float = 60) -> None:
            """Until the worker's consumer group is stable with partitions assigned."""
            from confluent_kafka import ConsumerGroupState
            from confluent_kafka.admin import AdminClient

            admin = AdminClient({"bootstrap.servers": bootstrap})
            deadline = time.monotonic() + timeout_s
            while time.monotonic() < deadline:
                (future,) = admin.describe_consumer_groups([group]).values()
                desc = future.result(10)
                if desc.state == ConsumerGroupState.STABLE and any(
                    m.assignment.topic_partitions for m in desc.members
                ):
                    return
                time.sleep(0.2)
            raise SystemExit(f"consumer group {group} not stable after {timeout_s} s")

        def measure(proc: subprocess.Popen, label: str, group: str) -> list[float]:
            dets = workload(n, seed=hash(label) & 0xFFFF)
            wait_assigned(group)
            audit = BatchConsumer(
                bootstrap,
                f"bench-audit-{label}-{run}",
                [ACTIONS.name],
                **{"auto.offset.reset": "latest"},
            )
            audit.poll(3)
            sent: dict[str, int] = {}
            received: list[tuple[int, str]] = []
            producing = threading.Event()
            producing.set()

            def collect() -> None:  # reads the actions topic while detections are produced
                quiet = 0
                while producing.is_set() or quiet < 3:
                    item = audit.poll(1.0)
                    if item is None:
                        quiet += 1
                        continue
                    quiet = 0
                    now = time.time_ns()
                    for ev in item[1].events:
                        if ev.HasField("action") and ev.action.header.source_id == f"bench-{label}":
                            received.extend((now, d) for d in ev.action.reason_detection_ids)

            collector = threading.Thread(target=collect, daemon=True)
            collector.start()
            # The bus table's settings; each batch is flushed, as the analytics worker flushes
            # its detections every step (a flush sends at once, whatever linger.ms says).
            producer = BatchProducer(bootstrap, client_id=f"bench-{label}")
            begin = time.perf_counter_ns()
            for i in range(0, n, BATCH):
                if i == RATE:
                    # Warm-up second done (first fetches, connections, lazy imports): let the
                    # worker drain it, then measure the steady state from a fresh schedule.
                    time.sleep(2)
                    begin = time.perf_counter_ns() - i * 1_000_000_000 // RATE
                due = begin + i * 1_000_000_000 // RATE
                while (now := time.perf_counter_ns()) < due:
                    time.sleep(max(0, (due - now) / 1e9 - 0.0001))
                batch = dpb.DetectionBatch(records=dets[i : i + BATCH])
                t = time.time_ns()
                for d in batch.records:
                    d.header.timestamp_ns = t
                    d.window_end_ns = t
                    d.labels["bench"] = label
                    sent[d.id] = t
                producer.send(DETECTIONS.name, batch, key=str(i))
                producer.flush()
            producer.flush()
            producing.clear()
            collector.join(60)
            proc.send_signal(signal.SIGTERM)
            proc.wait(30)
            audit.close()
            warm = {d.id for d in dets[:RATE]}  # the warm-up second is not measured
            return [t - sent[d] for t, d in received if d in sent and d not in warm]

        agent, agent_address = start([sys.executable, "-c", AGENT_SCRIPT], ":")  # its address
        profile = os.environ.get("BENCH_PROFILE")  # FILE: cProfile the engine's main thread
        engine, _ = start(
            [
                *([sys.executable, "-m", "cProfile", "-o", profile] if profile else []),
                str(Path(sys.executable).parent / "cgloop"),
                "policy",
                "run",
                str(policy_dir),
                "--agent",
                f"node-a={agent_address}",
                "--journal",
                str(tmp / "journal.jsonl"),
                "--budget",
                "1000000",
                "--budget-window",
                "1",
                "--group",
                f"bench-engine-{run}",
                "--source-id",
                "bench-engine",
            ],
            "policy engine:",
        )
        lat_engine = measure(engine, "engine", f"bench-engine-{run}")
        assert agent.stdin is not None
        agent.stdin.close()
        agent.wait(10)
        pass_proc, _ = start(
            [sys.executable, __file__, "_passthrough", bootstrap, f"bench-pass-{run}"],
            "passthrough: ready",
        )
        lat_pass = measure(pass_proc, "passthrough", f"bench-pass-{run}")
        print(f"engine, cgloop policy run (decisions with an action record): {dist(lat_engine)}")
        print(f"pass-through baseline (every detection):                     {dist(lat_pass)}")
        print(
            f"  ratio engine/pass-through: p50 {pct(lat_engine, 0.5) / pct(lat_pass, 0.5):.2f}x, "
            f"p99 {pct(lat_engine, 0.99) / pct(lat_pass, 0.99):.2f}x"
        )
    finally:
        stack.down()


def main() -> None:
    if sys.argv[1:2] == ["_passthrough"]:
        passthrough(*sys.argv[2:4])
        return
    which = sys.argv[1:] or ["planners", "decide", "kafka"]
    if "planners" in which:
        bench_planners()
    if "decide" in which:
        bench_decide()
    if "kafka" in which:
        bench_kafka()


if __name__ == "__main__":
    main()
