"""cgloop.bus.kafka's dependency reporting without a broker: librdkafka's errors and statistics
as the callbacks a client given a daemon's metrics gets them."""

from __future__ import annotations

import json
import logging

import pytest
from cgloop.bus.kafka import client_config, health_callbacks, monitored_librdkafka_log
from cgloop.contracts.ops import Daemon
from cgloop.metrics import KAFKA, PipelineMetrics
from confluent_kafka import KafkaError


def _health():
    return PipelineMetrics(Daemon.DAEMON_ANALYTICS).dependencies


def test_unreachable_errors_set_kafka_down_other_errors_are_only_counted() -> None:
    health = _health()
    callbacks = health_callbacks(health)
    callbacks["error_cb"](KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED))
    assert health.is_up(KAFKA) is None
    callbacks["error_cb"](KafkaError(KafkaError._ALL_BROKERS_DOWN, "1/1 brokers are down"))
    assert health.is_up(KAFKA) is False
    assert health.errors.labels(KAFKA, "all_brokers_down")._value.get() == 1
    assert health.errors.labels(KAFKA, "topic_authorization_failed")._value.get() == 1


def test_a_broker_seen_up_in_the_statistics_sets_kafka_up() -> None:
    health = _health()
    on_stats = health_callbacks(health)["stats_cb"]
    health.down(KAFKA, "transport")
    # The bootstrap entry (nodeid -1) being up says nothing about the cluster.
    on_stats(json.dumps({"brokers": {"b/bootstrap": {"state": "UP", "nodeid": -1}}}))
    assert health.is_up(KAFKA) is False
    on_stats(json.dumps({"brokers": {"b/1": {"state": "TRY_CONNECT", "nodeid": 1}}}))
    assert health.is_up(KAFKA) is False
    on_stats("not json")
    on_stats(json.dumps({"brokers": {"b/1": {"state": "UP", "nodeid": 1}}}))
    assert health.is_up(KAFKA) is True


def test_monitored_clients_log_no_line_per_reconnect(caplog: pytest.LogCaptureFixture) -> None:
    config = client_config("127.0.0.1:9", health=_health())
    assert config["logger"] is monitored_librdkafka_log and "error_cb" in config
    assert "error_cb" not in client_config("127.0.0.1:9")
    with caplog.at_level(logging.INFO, logger=monitored_librdkafka_log.name):
        log = monitored_librdkafka_log
        log.error("%s [%s] %s", "FAIL", "rdkafka#consumer-1", "Connection refused")
        log.warning("%s [%s] %s", "SESSTMOUT", "rdkafka#consumer-1", "session timed out")
    assert [r.getMessage() for r in caplog.records] == [
        "SESSTMOUT [rdkafka#consumer-1] session timed out"
    ]
