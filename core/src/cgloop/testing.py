"""Helpers for cgloop's tests and benchmarks: free loopback ports, the CLI as a subprocess, a
store server process. Importable from any test folder (pytest's importlib mode cannot import one
conftest from another); the root conftest.py builds its fixtures on these.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

import psutil
from cgloop.config import find_project_root

if TYPE_CHECKING:
    from cgloop.config import Settings

#: The checkout the tests run from.
ROOT = find_project_root(Path(__file__))


# Clock ticks a second: the kernel's unit of CPU time, the finest a CPU reading can resolve.
CLK_TCK = os.sysconf("SC_CLK_TCK")

T = TypeVar("T")


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process `pid` so far (benchmarks: another process's share)."""
    times = psutil.Process(pid).cpu_times()
    return times.user + times.system


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def parse_metrics(text: str) -> dict[str, dict[tuple, float]]:
    """Prometheus text, parsed by prometheus_client: sample name -> {sorted label items: value}."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, dict[tuple, float]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    return out


def scrape_metrics(addr: str) -> dict[str, dict[tuple, float]]:
    """A daemon's /metrics at `addr` (HOST:PORT), as `parse_metrics` gives it."""
    import urllib.request

    with urllib.request.urlopen(f"http://{addr}/metrics", timeout=5) as reply:
        return parse_metrics(reply.read().decode())


def private_settings(state_dir: Path) -> Settings:
    """Settings for a stack of its own: state in `state_dir`, free loopback ports, the
    project's download cache (so the Kafka jars are fetched once)."""
    from cgloop.config import Settings

    return Settings(
        state_dir=state_dir,
        cache_dir=(ROOT / ".cache") if ROOT else Settings().cache_dir,
        kafka_port=free_port(),
        kafka_controller_port=free_port(),
        store_port=free_port(),
        # Tests hand their clients a bare bootstrap address; a test of authentication asks
        # for `sasl_ssl` itself (tests/test_kafka_auth.py).
        kafka_broker_security="plaintext",
    )


def cgloop_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "cgloop.cli.main", *args]


class StoreServer:
    """`cgloop store serve` on `path`; `args` are more of its options (e.g. `--migrations`),
    `env` more environment (e.g. the endpoint's limits, set as an operator would)."""

    def __init__(
        self,
        path: Path,
        port: int,
        args: tuple[str, ...] = (),
        env: dict[str, str] | None = None,
    ) -> None:
        self.path, self.port = path, port
        self.url = f"http://127.0.0.1:{port}"
        self.proc = subprocess.Popen(
            cgloop_cmd("store", "serve", "--path", str(path), "--port", str(port), *args),
            env={**os.environ, **env} if env else None,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        try:
            wait_for_store(self.url, self.proc, lambda: self.proc.stdout.read())
        except RuntimeError:
            self.stop()
            raise

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def wait_for_store(
    url: str, proc: subprocess.Popen, output: Callable[[], str], timeout_s: float = 60
) -> None:
    """Wait until the store process answers /ping; raise with its output if it exits first."""
    import httpx  # a dev dependency: only tests and benchmarks start a store this way

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"store exited: {output()}")
        try:
            if httpx.get(f"{url}/ping", timeout=1).text == "Ok.\n":
                return
        except httpx.HTTPError:
            time.sleep(0.2)
    raise RuntimeError(f"store did not start within {timeout_s:g} s")


def kafka_answer(ask: Callable[[], T], timeout_s: float = 60) -> T:
    """`ask()`'s answer, asked again while the broker says it cannot answer yet: a group
    coordinator still loading (a broker just started, the machine busy) or moved. Tests that
    query group offsets directly need this; the loop's own wait_for retries every error."""
    from confluent_kafka import KafkaError, KafkaException

    transient = {
        KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
        KafkaError.COORDINATOR_NOT_AVAILABLE,
        KafkaError.NOT_COORDINATOR,
    }
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return ask()
        except KafkaException as exc:
            err = exc.args[0]
            if not (err.code() in transient or err.retriable()) or time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def in_ci() -> bool:
    """CI sets CI=true (.ci/run): there, what a test needs must be there."""
    return os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")


def data_missing(what: str) -> None:
    """A test's data (the lab's shared data folder, the classifier trained from it) is absent:
    a developer's machine may lack it and the test skips, saying why; in CI it must be there,
    so the test fails with the same message instead of passing as "skipped"."""
    import pytest

    message = f"{what} (the lab's data folder, ../shared/data beside the checkout)"
    if in_ci():
        pytest.fail(f"CI=true and {message} is missing: CI must run this test", pytrace=False)
    pytest.skip(message)
