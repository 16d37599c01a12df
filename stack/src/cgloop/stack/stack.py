"""The embedded stack as a whole: bring it up, report on it, take it down.

`up` is idempotent: components already running are left alone and reported. If a component
fails to start, what this call started is stopped again and the error names the cause.
"""

from __future__ import annotations

import logging
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import httpx
from cgloop.bus.kafka import ensure_topics
from cgloop.bus.topics import TOPICS
from cgloop.config import Settings
from cgloop.stack import kafka_install, preflight
from cgloop.stack.kafka_broker import KafkaBroker
from cgloop.stack.processes import ManagedProcess

KAFKA_READY_TIMEOUT_S = 90
STORE_READY_TIMEOUT_S = 60


class StackError(RuntimeError):
    pass


@dataclass
class ComponentStatus:
    name: str
    running: bool
    healthy: bool
    pid: int | None
    endpoint: str
    detail: str = ""


@dataclass
class StackStatus:
    components: list[ComponentStatus] = field(default_factory=list)

    @property
    def healthy(self) -> bool:
        return all(c.healthy for c in self.components)

    @property
    def running(self) -> bool:
        return any(c.running for c in self.components)

    def as_dict(self) -> dict:
        return {"healthy": self.healthy, "components": [asdict(c) for c in self.components]}


class Stack:
    def __init__(self, settings: Settings, *, sink: bool = True) -> None:
        self.settings = settings
        # The Kafka→store sink inside the store process. Tests that read the product's topics
        # turn it off, so that its consumer group and dead letters are not mixed with theirs.
        self.sink = sink
        self.migrations_dir = settings.migrations_dir
        self.min_free_disk_mb = settings.min_free_disk_mb
        run_dir = settings.state_dir / "run"
        self.kafka = KafkaBroker(
            settings.state_dir,
            settings.cache_dir,
            settings.host,
            settings.kafka_port,
            settings.kafka_controller_port,
            settings.kafka_broker_security,
        )
        self.store = ManagedProcess("store", run_dir)
        self.store_path = settings.state_dir / "store"
        # With CGLOOP_KAFKA_BOOTSTRAP set, the stack uses that broker and starts none of its own.
        self.external_kafka = settings.kafka_bootstrap is not None
        self.bootstrap = settings.bootstrap_servers

    # --- up ---------------------------------------------------------------------------------
    def up(self, progress: Callable[[str], None] = lambda msg: None) -> StackStatus:
        s = self.settings
        # Bad CGLOOP_KAFKA_* client settings are refused before anything starts.
        s.kafka_security(self.bootstrap).properties()
        started: list[ManagedProcess] = []
        try:
            if self.external_kafka:
                progress(f"using the external Kafka broker at {s.kafka_bootstrap}")
            elif self.kafka.process.pid() is None:
                preflight.check_java()
                preflight.check_disk(s.state_dir, self.min_free_disk_mb)
                preflight.check_port_free(s.host, s.kafka_port, "Kafka", "CGLOOP_KAFKA_PORT")
                preflight.check_port_free(
                    s.host,
                    s.kafka_controller_port,
                    "the Kafka controller",
                    "CGLOOP_KAFKA_CONTROLLER_PORT",
                )
                if not kafka_install.is_installed(s.cache_dir):
                    progress("fetching Kafka broker jars (once)")
                    kafka_install.install(s.cache_dir)
                secure = " (SASL_SSL, SCRAM)" if self.kafka.security else ""
                progress(f"starting Kafka on {self.kafka.bootstrap}{secure}")
                self.kafka.start()
                started.append(self.kafka.process)
                if self.kafka.security:
                    self._wait_kafka(self.kafka.security.admin_config())
                    self.kafka.security.create_client_user()
                    self.kafka.security.record_for_clients(self.bootstrap)
            self._wait_kafka(self.client_config())
            created = ensure_topics(self.bootstrap, config=self.client_config())
            if created:
                progress(f"created topics: {', '.join(created)}")
            if self.store.pid() is None:
                preflight.check_disk(s.state_dir, self.min_free_disk_mb)
                preflight.check_port_free(s.host, s.store_port, "the store", "CGLOOP_STORE_PORT")
                progress("applying store migrations")
                self._migrate()
                progress(f"starting the store on http://{s.host}:{s.store_port}")
                self.store.start(
                    # The sink runs inside the store process: chDB lets only the process that
                    # owns the data folder write it (docs/datasets.md).
                    self._store_cmd(
                        "serve",
                        "--host",
                        s.host,
                        "--port",
                        str(s.store_port),
                        *(("--sink", "--bootstrap", self.bootstrap) if self.sink else ()),
                    ),
                    # The sink logs in to the broker as this stack's clients do.
                    env=self.settings.kafka_security(self.bootstrap).env(),
                )
                started.append(self.store)
            self._wait_store()
        except BaseException:
            for proc in reversed(started):
                proc.stop()
            raise
        return self.status()

    def client_config(self) -> dict[str, str]:
        """librdkafka properties for a client of this stack's broker (with its credentials)."""
        return self.settings.kafka_config(self.bootstrap)

    def _store_cmd(self, *args: str) -> list[str]:
        cmd = [
            sys.executable,
            "-m",
            "cgloop.cli.main",
            "store",
            args[0],
            "--path",
            str(self.store_path),
        ]
        if self.migrations_dir:
            cmd += ["--migrations", str(self.migrations_dir)]
        return cmd + list(args[1:])

    def _migrate(self) -> None:
        result = subprocess.run(
            self._store_cmd("migrate"), capture_output=True, text=True, timeout=300
        )
        if result.returncode != 0:
            message = (result.stderr.strip() or result.stdout.strip()).replace("\n", " ")
            raise StackError(message or f"store migrate exited with {result.returncode}")

    def _wait_kafka(self, config: dict[str, str]) -> None:
        from confluent_kafka.admin import AdminClient

        deadline = time.monotonic() + KAFKA_READY_TIMEOUT_S
        admin = AdminClient({"bootstrap.servers": self.bootstrap, **config, "logger": _silent})
        while time.monotonic() < deadline:
            if not self.external_kafka and (
                self.kafka.process.exited() or self.kafka.process.pid() is None
            ):
                raise StackError(
                    "Kafka exited during start-up; last log lines:\n"
                    + self.kafka.process.log_tail()
                )
            try:
                admin.list_topics(timeout=2)
                return
            except Exception:
                time.sleep(0.5)
        raise StackError(
            f"Kafka did not answer on {self.bootstrap} within {KAFKA_READY_TIMEOUT_S}s; "
            f"see {self.kafka.process.log_file}"
        )

    def _wait_store(self) -> None:
        url = f"http://{self.settings.host}:{self.settings.store_port}/ping"
        deadline = time.monotonic() + STORE_READY_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.store.exited() or self.store.pid() is None:
                raise StackError(
                    f"the store exited during start-up; last log lines:\n{self.store.log_tail()}"
                )
            try:
                if httpx.get(url, timeout=1).text == "Ok.\n":
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise StackError(
            f"the store did not answer on {url} within {STORE_READY_TIMEOUT_S}s; "
            f"see {self.store.log_file}"
        )

    # --- down -------------------------------------------------------------------------------
    def down(self) -> list[str]:
        stopped = []
        owned = [("store", self.store)] + (
            [] if self.external_kafka else [("kafka", self.kafka.process)]
        )
        for name, proc in owned:
            if proc.stop():
                stopped.append(name)
        return stopped

    # --- status -----------------------------------------------------------------------------
    def status(self) -> StackStatus:
        return StackStatus([self._kafka_status(), self._store_status()])

    def _kafka_status(self) -> ComponentStatus:
        pid = None if self.external_kafka else self.kafka.process.pid()
        status = ComponentStatus(
            "kafka", self.external_kafka or pid is not None, False, pid, self.bootstrap
        )
        if not status.running:
            status.detail = "not running"
            return status
        from confluent_kafka.admin import AdminClient

        try:
            admin = AdminClient({**self.client_config(), "logger": _silent})
            topics = admin.list_topics(timeout=5).topics
        except Exception as exc:
            status.detail = f"not answering: {exc}"
            return status
        missing = [t for t in TOPICS if t not in topics]
        status.healthy = not missing
        status.detail = (
            f"missing topics: {', '.join(missing)}"
            if missing
            else f"{len(TOPICS)} cgloop topics, "
            f"{sum(len(topics[t].partitions) for t in TOPICS)} partitions"
        )
        return status

    def _store_status(self) -> ComponentStatus:
        pid = self.store.pid()
        url = f"http://{self.settings.host}:{self.settings.store_port}"
        status = ComponentStatus("store", pid is not None, False, pid, url)
        if pid is None:
            status.detail = "not running"
            return status
        try:
            reply = httpx.post(
                url,
                params={"default_format": "TSV"},
                timeout=5,
                content="SELECT count(), max(version) FROM cgloop_meta.schema_migrations",
            )
        except httpx.HTTPError as exc:
            status.detail = f"not answering: {exc}"
            return status
        if reply.status_code != 200:
            status.detail = reply.text.strip()[:200]
            return status
        count, version = reply.text.split()
        status.healthy = True
        status.detail = f"chDB at {self.store_path}, {count} migrations (schema version {version})"
        return status


# librdkafka's log while polling a broker that is still starting is noise: keep it quiet.
_silent = logging.getLogger("cgloop.stack.librdkafka")
_silent.addHandler(logging.NullHandler())
_silent.propagate = False
