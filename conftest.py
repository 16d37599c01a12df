"""Fixtures shared by every test folder: free loopback ports, a store server, the real stack.

The stack fixture starts the real Kafka broker (KRaft) and the store once per test module, in
a temporary state folder on free ports, so tests never touch a stack a developer has running.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from cgloop.config import Settings
from cgloop.testing import StoreServer, cgloop_cmd, free_port, private_settings


@pytest.fixture
def run_cgloop(tmp_path: Path):
    """Run the cgloop CLI in a subprocess with a private state folder; returns CompletedProcess."""

    def run(
        *args: str, env: dict[str, str] | None = None, timeout: float = 180
    ) -> subprocess.CompletedProcess:
        full_env = {**os.environ, "CGLOOP_STATE_DIR": str(tmp_path / "state"), **(env or {})}
        return subprocess.run(
            cgloop_cmd(*args), capture_output=True, text=True, env=full_env, timeout=timeout
        )

    return run


@pytest.fixture(scope="module")
def store_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StoreServer]:
    server = StoreServer(tmp_path_factory.mktemp("store") / "data", free_port())
    yield server
    server.stop()


# Module scope: every test module gets a broker and topics of its own. The topic names are the
# product's, so modules sharing one broker would read each other's records (and dead letters).
@pytest.fixture(scope="module")
def stack_settings(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Settings]:
    """The real embedded stack (Kafka + store, without the sink), up for one test module."""
    from cgloop.stack.stack import Stack

    settings = private_settings(tmp_path_factory.mktemp("stack"))
    stack = Stack(settings, sink=False)  # the sink has tests of its own (datasets/tests)
    try:
        status = stack.up()
        assert status.healthy, status.as_dict()
        yield settings
    finally:
        stack.down()
