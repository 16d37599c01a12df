"""Analytics benchmark (see run.sh). Starts its own embedded stack in a temporary folder."""

from __future__ import annotations

import argparse
import tempfile
import threading
import time
import uuid
from pathlib import Path

import numpy as np
from cgloop.analytics.datasets import build_examples, load_all
from cgloop.analytics.engine import AnalyticsEngine
from cgloop.analytics.evaluate import train
from cgloop.analytics.features import window_features
from cgloop.analytics.records import conversation_key
from cgloop.analytics.synthetic import PROFILES, Degradation, gaming_records
from cgloop.analytics.worker import Worker
from cgloop.bus.kafka import BatchConsumer, BatchProducer, ensure_topics
from cgloop.bus.topics import FLOWS
from cgloop.config import Settings, find_project_root
from cgloop.v1.flow_pb2 import FlowRecordBatch


def pct(xs, q) -> float:
    return float(np.percentile(np.array(xs) * 1000, q))


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def sessions(n: int, seconds: float) -> list[list]:
    out = []
    for i in range(n):
        platform = sorted(PROFILES)[i % 4]
        degr = (Degradation(seconds / 2, seconds, jitter_ms=15),) if i % 3 == 0 else ()
        out.append(gaming_records(platform, seconds, seed=100 + i, degradations=degr,
                                  client=bytes([10, 50, i >> 8 & 255, i & 255])))
    return out


def bench_classification(model, n_flows: int) -> None:
    flows = load_all(max_background=None, synthetic_per_platform=0, include=("xbox", "ndpi"))
    flows = (flows * (n_flows // len(flows) + 1))[:n_flows]
    windows = [f.records[: min(len(f.records), 100)] for f in flows]
    # ours: features per flow, one batched predict for all (what the engine does per message)
    t = time.perf_counter()
    X = np.vstack([window_features(w) for w in windows])
    model.predict_proba(X)
    ours = time.perf_counter() - t
    # baseline: one predict call per flow (a naive per-record classifier)
    k = min(300, n_flows)
    t = time.perf_counter()
    for w in windows[:k]:
        model.predict_proba(window_features(w)[None, :])
    naive = (time.perf_counter() - t) / k * n_flows
    print(f"classification: {n_flows / ours:,.0f} flows/s (features + batched predict), "
          f"baseline one-predict-per-flow {n_flows / naive:,.0f} flows/s, ratio "
          f"{naive / ours:.1f}x")


def bench_worker(model, version, n_records: int, rate: float) -> None:
    from cgloop.stack.stack import Stack

    root = find_project_root()
    tmp = Path(tempfile.mkdtemp(prefix="cgloop-bench-analytics-"))
    settings = Settings(state_dir=tmp / "state", cache_dir=(root / ".cache") if root else None,
                        kafka_port=free_port(), kafka_controller_port=free_port(),
                        store_port=free_port(), kafka_broker_security="plaintext")
    stack = Stack(settings)
    try:
        assert stack.up().healthy
        bootstrap = settings.bootstrap_servers
        ensure_topics(bootstrap)
        per_session = 300  # 30 s of a two-direction session at 100 ms intervals
        recs = [r for s in sessions(max(1, n_records // per_session), 15) for r in s]
        recs.sort(key=lambda r: r.interval_end_ns)
        recs = recs[:n_records]
        batches = [recs[i:i + 10] for i in range(0, len(recs), 10)]

        def produce() -> None:
            # the bus table's settings, as the probe that sends flows in operation has them
            prod = BatchProducer(bootstrap)
            gap = 10 / rate
            t0 = time.perf_counter()
            for i, b in enumerate(batches):
                key = repr(conversation_key(b[0].five_tuple)).encode()
                prod.send(FLOWS.name, FlowRecordBatch(records=b), key=key)
                prod._producer.poll(0)
                sleep = t0 + (i + 1) * gap - time.perf_counter()
                if sleep > 0:
                    time.sleep(sleep)
            prod.flush()

        # baseline: bare consume + commit of the same traffic (no analytics)
        run = uuid.uuid4().hex[:6]
        base = BatchConsumer(bootstrap, f"bench-bare-{run}", [FLOWS.name])
        worker = Worker(AnalyticsEngine(model, version), bootstrap, tmp / "w.json",
                        f"bench-worker-{run}")
        # wait for both group joins before producing, so latencies are not join times
        for _ in range(20):
            base.poll(0.2)
            worker.step(0.2)
        bare_lat: list[float] = []

        def bare() -> None:
            seen, idle = 0, 0
            while idle < 6:
                item = base.poll(0.5)
                if item is None:
                    idle += 1
                    continue
                idle = 0
                t = time.perf_counter()
                base.commit(item[2])
                bare_lat.append(time.perf_counter() - t)
                seen += len(item[1].records)
            base.close()

        th = threading.Thread(target=bare)
        th.start()
        prod_th = threading.Thread(target=produce)
        t0 = time.perf_counter()
        prod_th.start()
        idle_since, last_work = time.monotonic(), time.perf_counter()
        while time.monotonic() - idle_since < 3:
            if worker.step(0.2):
                idle_since, last_work = time.monotonic(), time.perf_counter()
        elapsed = last_work - t0
        prod_th.join()
        th.join()
        worker.close()
        s = worker.stats
        per_rec = [x / 10 for x in s.latencies_s]  # 10 records per message
        print(f"detection latency per message (arrival -> detections handed to the producer): "
              f"p50 {pct(s.handled_s, 50):.2f} ms, p99 {pct(s.handled_s, 99):.2f} ms")
        print(f"worker: {s.records:,} records in {s.messages:,} messages "
              f"({s.records / elapsed:,.0f} records/s offered at {rate:,.0f}/s), "
              f"{s.detections} detections, state {worker.engine.state_size()}")
        print(f"detection latency per message (arrival -> detections acked by Kafka): "
              f"p50 {pct(s.latencies_s, 50):.2f} ms, p99 {pct(s.latencies_s, 99):.2f} ms, "
              f"max {pct(s.latencies_s, 100):.2f} ms; per record (÷10) p50 "
              f"{pct(per_rec, 50):.3f} ms, p99 {pct(per_rec, 99):.3f} ms")
        print(f"end to end (producer timestamp -> detections acked): p50 "
              f"{pct(s.end_to_end_s, 50):.1f} ms, p99 {pct(s.end_to_end_s, 99):.1f} ms")
        print(f"target p99 <= 20 ms: ratio target/p99 = {20 / pct(s.latencies_s, 99):.1f}x")
        if bare_lat:
            print(f"baseline bare consume+commit per message: p50 {pct(bare_lat, 50):.2f} ms, "
                  f"p99 {pct(bare_lat, 99):.2f} ms; worker/bare p99 ratio "
                  f"{pct(s.latencies_s, 99) / pct(bare_lat, 99):.1f}x")
    finally:
        stack.down()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--flows", type=int, default=2000)
    ap.add_argument("--records", type=int, default=20000)
    ap.add_argument("--rate", type=float, default=2000, help="records/s offered to the worker")
    args = ap.parse_args()
    flows = load_all(max_background=150)
    model, card = train(build_examples(flows))
    bench_classification(model, args.flows)
    bench_worker(model, card.version, args.records, args.rate)


if __name__ == "__main__":
    main()
