"""Fixtures of the datasets tests: a store process that runs the sink, fed by the real broker;
one store with the shipped bundles, shared by every read-only test of the package.

Process starts dominate these tests' run time (a JVM, chDB in each store process), so each is
started once per module or package where the tests do not write to it."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from cgloop.bus.codec import _records
from cgloop.config import Settings
from cgloop.contracts.samples import SAMPLE_FOR_TOPIC, SAMPLES
from cgloop.testing import ROOT, StoreServer, cgloop_cmd, free_port, wait_for_store
from google.protobuf.message import Message


def in_own_process(script: str, *args: str, timeout_s: float = 180) -> Any:
    """Run `script` (Python source) with `args` in a child process and return the JSON its
    last line of output prints. chDB hosts one data folder per process, so a test that needs a
    private writable store runs it here."""
    done = subprocess.run(
        [sys.executable, "-c", script, *args], capture_output=True, text=True, timeout=timeout_s
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def sample(topic: str, source_id: str, first_sequence: int = 1) -> Message:
    """The canonical sample batch of `topic`, every record stamped with `source_id`."""
    batch = SAMPLES[SAMPLE_FOR_TOPIC[topic]]()
    for i, record in enumerate(_records(batch)):
        record.header.source_id = source_id
        record.header.sequence = first_sequence + i
    return batch


class SinkStore:
    """`cgloop store serve --sink` on a private folder: the embedded deployment, for real."""

    def __init__(self, path: Path, bootstrap: str, group: str, *extra: str) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.group = group
        self.log = path.with_suffix(".log").open("w")
        self.proc = subprocess.Popen(
            cgloop_cmd(
                "store",
                "serve",
                "--path",
                str(path),
                "--port",
                str(self.port),
                "--sink",
                "--bootstrap",
                bootstrap,
                "--group",
                group,
                *extra,
            ),
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        try:
            wait_for_store(self.url, self.proc, lambda: Path(self.log.name).read_text())
        except RuntimeError:
            self.stop()
            raise

    def query(self, sql: str, **params: str) -> list[list[str]]:
        reply = httpx.post(
            self.url,
            params={f"param_{k}": v for k, v in params.items()},
            content=sql,
            timeout=30,
        )
        assert reply.status_code == 200, reply.text
        return [line.split("\t") for line in reply.text.splitlines()]

    def wait_for(
        self,
        sql: str,
        want: Callable[[list[list[str]]], bool],
        timeout_s: float = 60,
        **params: str,
    ) -> list[list[str]]:
        deadline = time.monotonic() + timeout_s
        rows = self.query(sql, **params)
        while not want(rows) and time.monotonic() < deadline:
            time.sleep(0.3)
            rows = self.query(sql, **params)
        return rows

    def stop(self) -> int:
        self.proc.terminate()
        try:
            code = self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait()
        self.log.close()
        return code


BUNDLES = ROOT / "datasets" / "bundles"


def cli(*args: str, ok: bool = True) -> subprocess.CompletedProcess:
    result = subprocess.run(cgloop_cmd(*args), capture_output=True, text=True, timeout=180)
    if ok:
        assert result.returncode == 0, result.stderr
    return result


@pytest.fixture(scope="module")
def stack_settings(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Settings]:
    """The real Kafka broker (KRaft) with the product's topics, for one test module.

    Overrides the root fixture, which also migrates and serves a store: the sink tests bring
    stores of their own, so that one would be two process starts for nothing."""
    from cgloop.bus.kafka import ensure_topics
    from cgloop.stack import kafka_install
    from cgloop.stack.kafka_broker import KafkaBroker
    from confluent_kafka.admin import AdminClient

    settings = Settings(
        state_dir=tmp_path_factory.mktemp("kafka"),
        cache_dir=ROOT / ".cache",
        kafka_port=free_port(),
        kafka_controller_port=free_port(),
        store_port=free_port(),
    )
    if not kafka_install.is_installed(settings.cache_dir):
        kafka_install.install(settings.cache_dir)
    broker = KafkaBroker(
        settings.state_dir,
        settings.cache_dir,
        settings.host,
        settings.kafka_port,
        settings.kafka_controller_port,
    )
    broker.start()
    try:
        admin = AdminClient({"bootstrap.servers": settings.bootstrap_servers})
        deadline = time.monotonic() + 120
        while True:
            assert not broker.process.exited(), broker.process.log_tail()
            try:
                admin.list_topics(timeout=2)
                break
            except Exception:
                assert time.monotonic() < deadline, "Kafka did not answer within 120 s"
                time.sleep(0.3)
        ensure_topics(settings.bootstrap_servers)
        yield settings
    finally:
        broker.stop()


@pytest.fixture(scope="module")
def sink_store(
    stack_settings: Settings, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[SinkStore]:
    """One sink store per module: its tests write records with source ids of their own."""
    folder = tmp_path_factory.mktemp("sink") / "store"
    store = SinkStore(folder, stack_settings.bootstrap_servers, f"t-{uuid.uuid4()}")
    yield store
    store.stop()


@pytest.fixture(scope="package")
def bundle_store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StoreServer]:
    """The shipped bundles imported (one CLI call) into a store served read-only."""
    folder = tmp_path_factory.mktemp("cookbook") / "store"
    names = ("loop-demo", "xbox-cloud-gaming", "l4s-and-ndpi")
    cli("dataset", "import", *(str(BUNDLES / n) for n in names), "--path", str(folder))
    server = StoreServer(folder, free_port())
    yield server
    server.stop()


@pytest.fixture(scope="package")
def store_server(bundle_store: StoreServer) -> StoreServer:
    """The HTTP interface tests read, never write: the bundle store serves them too."""
    return bundle_store
