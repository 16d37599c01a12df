"""Fixtures of the datasets tests: a store process that runs the sink, fed by the real broker."""

from __future__ import annotations

import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from cgloop.bus.codec import _records
from cgloop.config import Settings
from cgloop.contracts.samples import SAMPLES
from cgloop.testing import cgloop_cmd, free_port, wait_for_store
from google.protobuf.message import Message

SAMPLE_FOR_TOPIC = {
    "cgloop.flows.v1": "flow_record_batch",
    "cgloop.int.v1": "int_record_batch",
    "cgloop.probes.v1": "probe_record_batch",
    "cgloop.nodes.v1": "node_sample_batch",
    "cgloop.detections.v1": "detection_batch",
    "cgloop.actions.v1": "action_batch",
    "cgloop.deadletter.v1": "dead_letter",
}


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


@pytest.fixture
def sink_store(stack_settings: Settings, tmp_path: Path) -> Iterator[SinkStore]:
    store = SinkStore(tmp_path / "store", stack_settings.bootstrap_servers, f"t-{uuid.uuid4()}")
    yield store
    store.stop()
