"""Kafka going away under a running sink: the daemon stays up, says so on /metrics, and stores
every record produced before and after exactly once when the broker is back."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest
from cgloop.bus.kafka import BatchProducer
from cgloop.bus.topics import PROBES
from cgloop.config import Settings
from cgloop.testing import free_port, scrape_metrics

from .conftest import SinkStore, sample

pytestmark = pytest.mark.kafka

BATCHES = 10  # each way: before the outage, and during it (delivered once the broker is back)


def dependency_up(metrics_addr: str) -> dict[str, float]:
    """cgloop_dependency_up by dependency, as the sink's /metrics serves it now."""
    series = scrape_metrics(metrics_addr).get("cgloop_dependency_up", {})
    return {dict(labels)["dependency"]: value for labels, value in series.items()}


def wait_until(what: str, ok: Callable[[], bool], timeout_s: float, why: Callable[[], str]) -> None:
    deadline = time.monotonic() + timeout_s
    while not ok():
        assert time.monotonic() < deadline, f"{what} not within {timeout_s} s: {why()}"
        time.sleep(0.2)


def test_the_sink_outlives_kafka_going_away_reports_it_and_loses_nothing(
    stack_settings: Settings, tmp_path: Path
) -> None:
    from cgloop.stack.kafka_broker import KafkaBroker

    s = stack_settings
    # The module's broker (datasets/tests/conftest.py), reached through its state folder.
    broker = KafkaBroker(s.state_dir, s.cache_dir, s.host, s.kafka_port, s.kafka_controller_port)
    source = f"sink-outage-{uuid.uuid4()}"
    metrics_addr = f"127.0.0.1:{free_port()}"
    store = SinkStore(
        tmp_path / "store", s.bootstrap_servers, f"t-{uuid.uuid4()}",
        "--metrics-addr", metrics_addr, "--close-minutes-every", "0",
    )  # fmt: skip
    count = (
        "SELECT count(), uniqExact(sequence), min(sequence), max(sequence)"
        " FROM cgloop.probe_records WHERE source_id = {s:String}"
    )
    log = lambda: Path(store.log.name).read_text()[-3000:]  # noqa: E731
    try:
        producer = BatchProducer(s.bootstrap_servers)
        for i in range(BATCHES):
            producer.send(PROBES.name, sample(PROBES.name, source, i + 1), key=source)
        producer.flush()
        rows = store.wait_for(count, lambda r: r[0][0] == str(BATCHES), timeout_s=30, s=source)
        assert rows == [[str(BATCHES), str(BATCHES), "1", str(BATCHES)]], log()
        assert dependency_up(metrics_addr) == {"kafka": 1.0, "store": 1.0}

        started = time.monotonic()
        assert broker.stop()
        wait_until(
            "kafka reported down", lambda: dependency_up(metrics_addr).get("kafka") == 0.0, 20,
            lambda: f"{dependency_up(metrics_addr)}\n{log()}",
        )  # fmt: skip
        assert store.proc.poll() is None, log()
        # Records produced while the broker is away wait in the producer; none may be lost.
        for i in range(BATCHES, 2 * BATCHES):
            producer.send(PROBES.name, sample(PROBES.name, source, i + 1), key=source)
        time.sleep(1)
        assert store.proc.poll() is None, log()
        assert dependency_up(metrics_addr).get("kafka") == 0.0

        broker.start()
        producer.flush(30)
        wait_until(
            "kafka reported up again", lambda: dependency_up(metrics_addr).get("kafka") == 1.0,
            20, lambda: f"{dependency_up(metrics_addr)}\n{log()}",
        )  # fmt: skip
        want = [[str(2 * BATCHES), str(2 * BATCHES), "1", str(2 * BATCHES)]]
        rows = store.wait_for(count, lambda r: r == want, timeout_s=30, s=source)
        assert rows == want, log()
        assert store.proc.poll() is None, log()
        assert time.monotonic() - started < 60
        # One line each way, not one per retry.
        text = Path(store.log.name).read_text()
        assert text.count("kafka: unreachable") == 1, text[-3000:]
        assert text.count("kafka: reachable again") == 1, text[-3000:]
        # librdkafka's own line per reconnect attempt is left out (several a second otherwise).
        assert text.count("Connection refused") <= 2, text[-3000:]
    finally:
        broker.start()  # whatever failed, the module's broker is left running
        store.stop()
