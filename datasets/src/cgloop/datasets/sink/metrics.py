"""The sink's Prometheus metrics (rows/s is `rate(cgloop_sink_rows_total[1m])`)."""

from __future__ import annotations

from cgloop.metrics import DependencyHealth
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server


class SinkMetrics:
    """Counters and gauges in their own registry (several sinks may live in one test process)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.messages = Counter(
            "cgloop_sink_messages", "Kafka messages read", ["topic"], registry=r
        )
        self.rows = Counter("cgloop_sink_rows", "rows written to the store", ["table"], registry=r)
        self.dead_letters = Counter(
            "cgloop_sink_dead_letters",
            "messages sent to the dead-letter topic",
            ["topic"],
            registry=r,
        )
        self.store_errors = Counter(
            "cgloop_sink_store_errors", "failed store writes (retried)", registry=r
        )
        self.batch_seconds = Histogram(
            "cgloop_sink_batch_seconds",
            "time to write one chunk",
            ["topic"],
            registry=r,
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
        )
        self.lag = Gauge(
            "cgloop_sink_lag_messages",
            "messages behind the partition end",
            ["topic", "partition"],
            registry=r,
        )

        # Kafka (the sink's consumer) and the store (its writes): cgloop_dependency_up.
        self.dependencies = DependencyHealth(r)

    def serve(self, port: int, host: str = "127.0.0.1") -> None:
        start_http_server(port, addr=host, registry=self.registry)
