"""cgloop.metrics: a daemon's /metrics address (the ops.proto table's default, moved or turned
off by --metrics-addr or its variable, refused naming the setting), serving it, a port in use
logged without stopping the daemon, and the pipeline series every daemon has."""

from __future__ import annotations

import logging
import socket

import pytest
from cgloop import metrics
from cgloop.bus.topics import DETECTIONS, FLOWS
from cgloop.contracts.ops import Daemon, endpoint
from cgloop.metrics import MetricsAddr, PipelineMetrics, parse_addr
from cgloop.testing import parse_metrics, scrape_metrics

ANALYTICS = Daemon.DAEMON_ANALYTICS


def test_the_default_is_the_tables_port_on_loopback() -> None:
    addr = parse_addr(None, ANALYTICS)
    assert addr == MetricsAddr("127.0.0.1", endpoint(ANALYTICS).port)
    assert metrics.env_var(ANALYTICS) == "CGLOOP_ANALYTICS_METRICS_ADDR"
    assert metrics.env_var(Daemon.DAEMON_POLICY_ENGINE) == "CGLOOP_POLICY_ENGINE_METRICS_ADDR"


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("off", None),
        ("OFF", None),
        ("", None),
        ("0.0.0.0:9500", MetricsAddr("0.0.0.0", 9500)),
        ("[::1]:0", MetricsAddr("::1", 0)),
        ("localhost:9462", MetricsAddr("localhost", 9462)),
    ],
)
def test_addresses_and_off(value: str, expected: MetricsAddr | None) -> None:
    assert parse_addr(value, ANALYTICS) == expected


@pytest.mark.parametrize("value", ["9462", "127.0.0.1", "127.0.0.1:70000", "a:b", "on"])
def test_a_bad_address_is_refused_naming_the_setting(value: str) -> None:
    with pytest.raises(ValueError, match="--metrics-addr / CGLOOP_ANALYTICS_METRICS_ADDR"):
        parse_addr(value, ANALYTICS)


def test_served_series_and_a_port_in_use(caplog: pytest.LogCaptureFixture) -> None:
    m = PipelineMetrics(ANALYTICS)
    m.consumed(FLOWS.name, 2, offset=10, high=15, records=3)
    m.dead_letters.labels(FLOWS.name).inc()
    m.drops.labels("replay").inc()
    m.records_out.labels(DETECTIONS.name).inc(2)
    server = metrics.serve(m.registry, MetricsAddr("127.0.0.1", 0), ANALYTICS)
    assert server is not None and server.addr.port != 0
    try:
        got = scrape_metrics(str(server.addr))
        assert got["cgloop_daemon"] == {(("daemon", "analytics"),): 1.0}
        assert got["cgloop_records_in_total"] == {(("topic", FLOWS.name),): 3.0}
        assert got["cgloop_consumer_lag_messages"] == {
            (("partition", "2"), ("topic", FLOWS.name)): 4.0
        }
        assert got["cgloop_dead_letters_total"] == {(("topic", FLOWS.name),): 1.0}
        assert got["cgloop_drops_total"] == {(("reason", "replay"),): 1.0}
        assert got["cgloop_records_out_total"] == {(("topic", DETECTIONS.name),): 2.0}
        # A second daemon on the same port: one warning naming the setting, no exception.
        with caplog.at_level(logging.WARNING, logger="cgloop.metrics"):
            again = metrics.serve(PipelineMetrics(ANALYTICS).registry, server.addr, ANALYTICS)
        assert again is None
        (record,) = [r for r in caplog.records if r.name == "cgloop.metrics"]
        assert str(server.addr) in record.getMessage()
        assert "CGLOOP_ANALYTICS_METRICS_ADDR" in record.getMessage()
    finally:
        server.close()
    with socket.socket() as s:  # closed: the port is free again (bar TIME_WAIT)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", server.addr.port))


def test_off_serves_nothing() -> None:
    assert metrics.start(PipelineMetrics(ANALYTICS).registry, "off", ANALYTICS) is None


def test_dependency_state_changes_are_one_line_each_and_errors_are_counted(
    caplog: pytest.LogCaptureFixture,
) -> None:
    m = PipelineMetrics(ANALYTICS)
    health = m.dependencies
    assert health.is_up(metrics.KAFKA) is None
    with caplog.at_level(logging.INFO, logger="cgloop.metrics"):
        health.up(metrics.KAFKA)  # first news: up, nothing to say
        for _ in range(5):  # retries while away: one line
            health.down(metrics.KAFKA, "transport", "Connection refused")
        health.error(metrics.KAFKA, "msg_timed_out")  # counted, the state unchanged
        health.up(metrics.KAFKA)
        health.up(metrics.KAFKA)
        health.down(metrics.STORE, "insert", "Code: 210. Connection refused")
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 3, lines
    assert lines[0].startswith("kafka: unreachable (transport: Connection refused)")
    assert lines[1] == "kafka: reachable again"
    assert lines[2].startswith("store: unreachable (insert: Code: 210.")
    text = prometheus_text(m)
    series = parse_metrics(text)
    up, errors = series["cgloop_dependency_up"], series["cgloop_dependency_errors_total"]
    assert up[(("dependency", "kafka"),)] == 1.0
    assert up[(("dependency", "store"),)] == 0.0
    assert errors[(("dependency", "kafka"), ("reason", "transport"))] == 5.0
    assert errors[(("dependency", "kafka"), ("reason", "msg_timed_out"))] == 1.0
    assert errors[(("dependency", "store"), ("reason", "insert"))] == 1.0


def prometheus_text(m: PipelineMetrics) -> str:
    from prometheus_client import generate_latest

    return generate_latest(m.registry).decode()
