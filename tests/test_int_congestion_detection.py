"""INT queue congestion across components: the INT collector's own generator sends Telemetry
Report v2.0 per-switch reports (INT-MX, one report per switch and packet, as postcards) with a
congestion episode planted on one switch; the real collector turns the crossing report into an
IntQueueRecord with `congested` set; an analytics worker reading the INT topic fires
queue_congestion in that record, labelled for the policies. Event time: the detection's is the
crossing record's (issue 20's 100 ms target leaves the pipeline the whole budget); the wall
time from the collector's receipt to the detection on Kafka is printed (the lab benchmark
measures it under load)."""

from __future__ import annotations

import os
import socket
import subprocess
import threading
import time
import uuid

import pytest
from cgloop.analytics.engine import AnalyticsEngine, EngineConfig
from cgloop.analytics.worker import Worker
from cgloop.bus.kafka import BatchConsumer
from cgloop.bus.topics import DETECTIONS, INT
from cgloop.telemetry.int_cli import collector_binary, collector_command
from cgloop.v1.detection_pb2 import DetectionKind as K

pytestmark = pytest.mark.kafka

# switch 2 (hop 1 of 3) congested from each flow's 40th packet to its 80th
GEN = ["--format", "v2.0", "--mode", "mx", "--flows", "2", "--hops", "3", "--no-jitter",
       "--congestion", "1:40:80", "--count", "0", "--duration", "3", "--rate", "600"]


def free_udp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def read(bootstrap: str, topic: str, keep, want: int, timeout_s: float = 60) -> list:
    """(Kafka timestamp ms, record) of `topic`'s records `keep` accepts."""
    cons = BatchConsumer(bootstrap, f"read-{uuid.uuid4().hex}", [topic])
    out, deadline = [], time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline and len(out) < want:
            item = cons.poll(0.5)
            if item is None:
                continue
            _, batch, msg = item
            out += [(msg.timestamp()[1], r) for r in batch.records if keep(r)]
    finally:
        cons.close()
    return out


def test_the_collectors_crossing_record_fires_queue_congestion(stack_settings, tmp_path):
    bootstrap = stack_settings.bootstrap_servers
    run = uuid.uuid4().hex[:8]
    start_ns = time.time_ns()
    worker = Worker(
        AnalyticsEngine(None, config=EngineConfig(
            int_switch_nodes={2: "core"}, int_switch_ports={(2, 3): "edge1"})),
        bootstrap, tmp_path / "w.json", f"int-congestion-{run}",
    )
    stop = threading.Event()

    def loop() -> None:
        while not stop.is_set():
            worker.step(0.1)
        worker.close()

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not worker.assigned and time.monotonic() < deadline:  # in its group: reading
        time.sleep(0.1)
    assert worker.assigned, "the worker never joined its group"
    port = free_udp_port()
    cmd = collector_command(f"127.0.0.1:{port}", bootstrap, 1, 8.0, [])
    collector = subprocess.Popen([*cmd, "--source-id", f"int-{run}"], stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True)
    try:
        line = collector.stderr.readline()
        assert '"listening"' in line, line + collector.stderr.read()
        gen = subprocess.run([str(collector_binary()), "gen", "--target", f"127.0.0.1:{port}",
                              *GEN], capture_output=True, text=True, timeout=60)
        assert gen.returncode == 0, gen.stderr
        _, err = collector.communicate(timeout=60)
        assert collector.returncode == 0, err
        crossings = read(bootstrap, INT.name, lambda r: r.WhichOneof("record") == "queue"
                         and r.queue.header.source_id.startswith(f"int-{run}/"), want=2)
        dets = read(bootstrap, DETECTIONS.name,
                    lambda d: d.kind == K.DETECTION_KIND_QUEUE_CONGESTION
                    and d.window_end_ns >= start_ns, want=1)
    finally:
        stop.set()
        thread.join(30)
        if collector.poll() is None:
            collector.kill()
    on = [r.queue for _, r in crossings if r.queue.congested]
    on_ms = [ts for ts, r in crossings if r.queue.congested]
    assert len(on) == 1 and [r.queue.congested for _, r in crossings] == [True, False], crossings
    assert (on[0].switch_id, on[0].egress_port) == (2, 3)
    ((acked_ms, d),) = dets
    assert d.window_end_ns == on[0].header.timestamp_ns, "fired in the crossing record itself"
    assert dict(d.labels) == {"switch_id": "2", "egress_port": "3",
                              "queue_id": str(on[0].queue_id), "node_id": "core",
                              "interface": "edge1", "trigger": "congested",
                              "episode": str(on[0].header.timestamp_ns)}
    wall_ms = acked_ms - on[0].header.timestamp_ns / 1e6
    print(f"collector receipt of the crossing report -> detection on Kafka: {wall_ms:.1f} ms "
          f"(collector {on_ms[0] - on[0].header.timestamp_ns / 1e6:.1f} ms, analytics "
          f"{acked_ms - on_ms[0]:.1f} ms; load average {os.getloadavg()[0]:.1f})")
    # a bound for a stall, not the target: a 2-core machine shared by builds runs at load 30+
    assert wall_ms < 10_000, "the worker polls continuously: this long is a stall"
