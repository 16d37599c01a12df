"""Every Python daemon serves /metrics as started by its command: `cgloop analytics run`,
`cgloop policy run`, `cgloop sink` (each on a free port given by --metrics-addr or its
CGLOOP_<DAEMON>_METRICS_ADDR variable) against one real broker, with a good and an undecodable
message on each one's input: records in, dead letters, lag and the daemon's own histograms are
served, and logs are JSON lines when CGLOOP_LOG_FORMAT=json."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest
from cgloop.bus.kafka import BatchProducer, ensure_topics
from cgloop.bus.topics import DETECTIONS, FLOWS
from cgloop.contracts.samples import SAMPLES
from cgloop.policy.testing import detection
from cgloop.testing import cgloop_cmd, free_port, scrape_metrics
from cgloop.v1 import detection_pb2 as dpb

pytestmark = pytest.mark.kafka


def _until(port: int, proc: subprocess.Popen, ready, timeout_s: float = 60) -> dict:
    """Scrape until `ready(series)`; the process's output in the error if it never is."""
    deadline, last = time.monotonic() + timeout_s, {}
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            break
        try:
            last = scrape_metrics(f"127.0.0.1:{port}")
        except OSError:
            last = {}
        if last and ready(last):
            return last
        time.sleep(0.3)
    proc.terminate()
    out = proc.communicate(timeout=20)[0]
    raise AssertionError(f"metrics never ready on :{port}: {sorted(last)}\n{out[-3000:]}")


def _value(series: dict, name: str, **labels: str) -> float:
    return series.get(name, {}).get(tuple(sorted(labels.items())), 0.0)


def test_the_python_daemons_serve_their_metrics(stack_settings, tmp_path: Path) -> None:
    bootstrap = stack_settings.bootstrap_servers
    ensure_topics(bootstrap)
    producer = BatchProducer(bootstrap)
    producer.send(FLOWS.name, SAMPLES["flow_record_batch"](), key="m")
    producer.send_raw(FLOWS.name, b"\x0a\x40\x01", key="m", headers=None)  # undecodable
    det = detection(time.time_ns())
    producer.send(DETECTIONS.name, dpb.DetectionBatch(records=[det]), key="m")
    producer.send_raw(DETECTIONS.name, b"\x0a\x40\x01", key="m", headers=None)
    producer.flush()

    env = {
        **os.environ,
        "CGLOOP_STATE_DIR": str(tmp_path / "state"),
        "CGLOOP_KAFKA_BOOTSTRAP": bootstrap,
        "CGLOOP_KAFKA_BROKER_SECURITY": "plaintext",
        "CGLOOP_LOG_FORMAT": "json",
    }
    ports = {name: free_port() for name in ("analytics", "policy", "sink")}
    commands = {
        "analytics": (["analytics", "run", "--metrics-addr", f"127.0.0.1:{ports['analytics']}"],
                      {}),
        # the variable instead of the option
        "policy": (["policy", "run"],
                   {"CGLOOP_POLICY_ENGINE_METRICS_ADDR": f"127.0.0.1:{ports['policy']}"}),
        "sink": (["sink", "--path", str(tmp_path / "store"),
                  "--metrics-addr", f"127.0.0.1:{ports['sink']}"], {}),
    }  # fmt: skip
    procs = {
        name: subprocess.Popen(
            cgloop_cmd(*args),
            env={**env, **more},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for name, (args, more) in commands.items()
    }
    try:
        flows = FLOWS.name
        got = _until(
            ports["analytics"],
            procs["analytics"],
            lambda s: (
                _value(s, "cgloop_dead_letters_total", topic=flows) >= 1
                and _value(s, "cgloop_records_in_total", topic=flows) >= 1
            ),
        )
        assert _value(got, "cgloop_daemon", daemon="analytics") == 1
        assert got["cgloop_consumer_lag_messages"]  # per topic and partition consumed

        dets = DETECTIONS.name
        got = _until(
            ports["policy"],
            procs["policy"],
            lambda s: (
                _value(s, "cgloop_dead_letters_total", topic=dets) >= 1
                and _value(s, "cgloop_records_in_total", topic=dets) >= 1
            ),
        )
        assert _value(got, "cgloop_daemon", daemon="policy_engine") == 1
        assert "cgloop_policy_decision_latency_seconds_count" in got
        assert "cgloop_policy_apply_latency_seconds_count" in got
        assert got["cgloop_consumer_lag_messages"]

        got = _until(
            ports["sink"],
            procs["sink"],
            lambda s: _value(s, "cgloop_sink_messages_total", topic=flows) >= 1,
            timeout_s=120,  # the sink migrates its new store first
        )
        assert _value(got, "cgloop_sink_dead_letters_total", topic=flows) >= 1
    finally:
        for proc in procs.values():
            proc.terminate()
        outputs = {name: proc.communicate(timeout=30)[0] for name, proc in procs.items()}
    # CGLOOP_LOG_FORMAT=json: every log line the daemons wrote parses (the analytics worker
    # logs its dead letters; rich's console lines are not logs and are not JSON).
    log_lines = [
        json.loads(line)
        for out in outputs.values()
        for line in out.splitlines()
        if line.startswith('{"time"')
    ]
    assert any(r["logger"] == "cgloop.bus.kafka" and "dead-lettered" in r["message"]
               for r in log_lines), outputs  # fmt: skip
    assert any(r["message"].startswith("metrics: http://127.0.0.1:") for r in log_lines)
