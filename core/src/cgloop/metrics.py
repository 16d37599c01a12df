"""Self-monitoring shared by every Python daemon: where its Prometheus /metrics listens and the
series every pipeline stage has.

* The address: each daemon's default is its port in the table of proto/cgloop/v1/ops.proto
  (`cgloop.contracts.ops`) on 127.0.0.1. `--metrics-addr` or the daemon's own variable
  (`CGLOOP_<DAEMON>_METRICS_ADDR`, e.g. CGLOOP_ANALYTICS_METRICS_ADDR; one per daemon so that
  daemons started from one environment never collide) moves it (`HOST:PORT`, port 0 picks a
  free one) or turns it off (`off` or empty).
* A port already in use does not stop the daemon: `serve` logs one warning naming the address
  and the setting, and the daemon runs without /metrics (its work matters more than its
  monitoring; the scrape target shows down).
* `PipelineMetrics`: records in and out per topic, dead letters, drops by reason and consumer
  lag per topic and partition, under the same names in every daemon (the Prometheus job tells
  the daemons apart), plus the daemon's own histograms made with `histogram`.
* `DependencyHealth`: whether the daemon reaches Kafka and the store,
  `cgloop_dependency_up{dependency}` (1/0) and `cgloop_dependency_errors_total{dependency,
  reason}`. Kafka's state comes from the clients of `cgloop.bus.kafka` (librdkafka's error
  callback: down; a message received or delivered, or a broker seen up: up), the store's from
  the sink's writes. Each change of state is one log line (not one per retry); the daemon
  keeps running and retrying meanwhile.
"""

from __future__ import annotations

import logging
import re
import threading
from dataclasses import dataclass
from typing import Any

from cgloop.contracts.ops import Daemon, default_metrics_addr, endpoint
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

log = logging.getLogger(__name__)

OFF = ("", "off")
# Seconds: 1 ms to 30 s, dense where the loop's budget (tens of ms) lies.
LATENCY_BUCKETS = (
    0.001, 0.0025, 0.005, 0.01, 0.02, 0.035, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5, 1, 2.5, 5, 10, 30,
)  # fmt: skip
_ADDR = re.compile(r"^(?:\[(?P<v6>[0-9A-Fa-f:.]+)\]|(?P<host>[^:\[\]]+)):(?P<port>\d{1,5})$")


def daemon_key(daemon: int) -> str:
    """`ANALYTICS` for DAEMON_ANALYTICS: the daemon's part of its setting's name."""
    return Daemon.Name(daemon).removeprefix("DAEMON_")


def env_var(daemon: int) -> str:
    """The variable that sets `daemon`'s metrics address, e.g. CGLOOP_ANALYTICS_METRICS_ADDR."""
    return f"CGLOOP_{daemon_key(daemon)}_METRICS_ADDR"


def help_text(daemon: int) -> str:
    """Help for a daemon's --metrics-addr option."""
    return (
        f"serve Prometheus /metrics on HOST:PORT (default {default_metrics_addr(daemon)}, "
        f"proto/cgloop/v1/ops.proto; port 0: any free one); 'off' or empty: no metrics; "
        f"a port in use is logged and the daemon runs without metrics"
    )


@dataclass(frozen=True)
class MetricsAddr:
    host: str
    port: int

    def __str__(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


def parse_addr(value: str | None, daemon: int) -> MetricsAddr | None:
    """The address `value` names (None: metrics off). Unset (None) is the table's default.
    ValueError naming --metrics-addr and the daemon's variable on anything else."""
    if value is None:
        value = default_metrics_addr(daemon)
    text = value.strip()
    if text.lower() in OFF:
        return None
    m = _ADDR.match(text)
    port = int(m["port"]) if m else -1
    if m is None or not 0 <= port <= 65535:
        raise ValueError(
            f"--metrics-addr / {env_var(daemon)}={value!r} is not HOST:PORT (e.g. "
            f"{default_metrics_addr(daemon)}, [::1]:{endpoint(daemon).port}), 'off' or empty"
        )
    return MetricsAddr(m["v6"] or m["host"], port)


class Server:
    """A running /metrics endpoint; `addr` is where it listens (the real port when 0 was
    asked for)."""

    def __init__(self, httpd: Any, thread: Any) -> None:
        self._httpd, self._thread = httpd, thread
        host, port = httpd.server_address[:2]
        self.addr = MetricsAddr(host, port)

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()


def serve(registry: CollectorRegistry, addr: MetricsAddr | None, daemon: int) -> Server | None:
    """Serve `registry` on `addr` (nothing when None). A port in use or an address that cannot
    be bound is one warning and None: the daemon goes on without metrics."""
    if addr is None:
        log.info("metrics: off (--metrics-addr / %s)", env_var(daemon))
        return None
    try:
        httpd, thread = start_http_server(addr.port, addr=addr.host, registry=registry)
    except OSError as exc:
        log.warning(
            "metrics: cannot listen on %s (%s); running WITHOUT /metrics (set --metrics-addr "
            "or %s to a free HOST:PORT, or 'off')",
            addr, exc.strerror or exc, env_var(daemon),
        )  # fmt: skip
        return None
    server = Server(httpd, thread)
    log.info("metrics: http://%s/metrics", server.addr)
    return server


def daemon_info(registry: CollectorRegistry, daemon: int) -> None:
    """`cgloop_daemon{daemon="analytics"} 1`: which daemon serves these metrics."""
    info = Gauge("cgloop_daemon", "1 for the daemon serving these metrics", ["daemon"],
                 registry=registry)  # fmt: skip
    info.labels(daemon_key(daemon).lower()).set(1)


def histogram(
    registry: CollectorRegistry, name: str, doc: str, labels: tuple[str, ...] = ()
) -> Histogram:
    """A latency histogram in seconds with the shared buckets."""
    return Histogram(name, doc, list(labels), registry=registry, buckets=LATENCY_BUCKETS)


def batch_size(batch: Any) -> int:
    """Records in a bus batch (`records`, or `events` for an ActionBatch)."""
    for field in ("records", "events"):
        if hasattr(batch, field):
            return len(getattr(batch, field))
    return 1


class PipelineMetrics:
    """The series every pipeline daemon has, in their own registry (several daemons may live in
    one test process). `BatchConsumer(metrics=...)` keeps records in, dead letters and lag."""

    def __init__(self, daemon: int, registry: CollectorRegistry | None = None) -> None:
        self.daemon = daemon
        self.registry = r = registry or CollectorRegistry()
        daemon_info(r, daemon)
        self.records_in = Counter(
            "cgloop_records_in", "records consumed (decoded)", ["topic"], registry=r
        )
        self.records_out = Counter("cgloop_records_out", "records produced", ["topic"], registry=r)
        self.dead_letters = Counter(
            "cgloop_dead_letters",
            "messages refused by the decoder and sent to the dead-letter topic",
            ["topic"],
            registry=r,
        )
        self.drops = Counter(
            "cgloop_drops", "records or messages dropped, by reason", ["reason"], registry=r
        )
        self.consumer_lag = Gauge(
            "cgloop_consumer_lag_messages",
            "messages behind the partition's end after the last one consumed",
            ["topic", "partition"],
            registry=r,
        )
        # Kafka (through the clients given these metrics) and the store, when the daemon has one.
        self.dependencies = DependencyHealth(r)

    def consumed(self, topic: str, partition: int, offset: int, high: int, records: int) -> None:
        self.records_in.labels(topic).inc(records)
        if high >= 0 and offset >= 0:
            self.consumer_lag.labels(topic, str(partition)).set(max(0, high - offset - 1))


KAFKA = "kafka"
STORE = "store"


class DependencyHealth:
    """Up or down per dependency (`KAFKA`, `STORE`), and its errors by reason. The series
    appears with the first news of the dependency (a client built for it says nothing yet)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.up_gauge = Gauge(
            "cgloop_dependency_up",
            "1 while the daemon reaches the dependency (kafka, store), 0 after it failed",
            ["dependency"],
            registry=registry,
        )
        self.errors = Counter(
            "cgloop_dependency_errors",
            "errors talking to a dependency, by reason (a librdkafka error name, a store step)",
            ["dependency", "reason"],
            registry=registry,
        )
        self._state: dict[str, bool] = {}
        self._lock = threading.Lock()

    def is_up(self, dependency: str) -> bool | None:
        """The last known state (None: nothing known yet)."""
        return self._state.get(dependency)

    def up(self, dependency: str) -> None:
        """`dependency` answered: up (logged once when it was down)."""
        if self._state.get(dependency) is True:  # the hot path: no lock
            return
        with self._lock:
            was = self._state.get(dependency)
            if was is True:
                return
            self._state[dependency] = True
            self.up_gauge.labels(dependency).set(1)
        if was is False:
            log.warning("%s: reachable again", dependency)

    def down(self, dependency: str, reason: str, detail: object = "") -> None:
        """`dependency` failed for `reason` (a bounded name: it is a label): counted; down,
        logged once until it is up again."""
        self.errors.labels(dependency, reason).inc()
        with self._lock:
            was = self._state.get(dependency)
            self._state[dependency] = False
            self.up_gauge.labels(dependency).set(0)
        if was is not False:
            log.error(
                "%s: unreachable (%s: %s); running on and retrying, /metrics "
                "cgloop_dependency_up{dependency=%r} is 0 until it answers again",
                dependency, reason, detail, dependency,
            )  # fmt: skip

    def error(self, dependency: str, reason: str) -> None:
        """An error that does not say the dependency is away: counted only."""
        self.errors.labels(dependency, reason).inc()


def option(daemon: int, more_help: str = "") -> Any:
    """The typer option every daemon's command takes: `--metrics-addr`, or its variable."""
    import typer

    def check(value: str | None) -> str | None:
        # At parse time, so `cgloop --check-config` refuses a bad address as running would.
        try:
            parse_addr(value, daemon)
        except ValueError as exc:
            raise typer.BadParameter(str(exc)) from None
        return value

    return typer.Option(
        "--metrics-addr",
        envvar=env_var(daemon),
        help=help_text(daemon) + more_help,
        show_default=False,
        callback=check,
    )


def start(registry: CollectorRegistry, value: str | None, daemon: int) -> Server | None:
    """Parse a daemon's --metrics-addr (ValueError naming the setting) and serve `registry`."""
    return serve(registry, parse_addr(value, daemon), daemon)
