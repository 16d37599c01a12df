"""Every service the closed loop starts logs in to a broker that requires SASL_SSL + SCRAM: the
flow probe and the node agent inside the lab's edge namespace (Rust, through the loopback
bridge), the analytics worker and the policy engine on the host, the sink inside the store.
Their records arrive; nothing falls back to plaintext. Needs root (the lab); ~1-2 min."""

from __future__ import annotations

import os
import time
import uuid
from pathlib import Path

import pytest

pytestmark = [
    pytest.mark.root,
    pytest.mark.kafka,
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root (network namespaces, XDP, tc)"),
    pytest.mark.timeout(300),
]

import cgloop.config  # noqa: E402
from cgloop.bus.kafka import BatchConsumer  # noqa: E402
from cgloop.config import Settings  # noqa: E402
from cgloop.lab.lab import Lab  # noqa: E402
from cgloop.lab.scenario import Scenario  # noqa: E402
from cgloop.lab.topology import load_topology  # noqa: E402
from cgloop.loop.closed_loop import ClosedLoop, LoopOptions  # noqa: E402
from cgloop.testing import private_settings  # noqa: E402

SCENARIO = {
    "duration": 10,
    "traffic": [
        {"kind": "gaming", "platform": "gfn", "server": "gs1", "client": "cl1", "port": 49004},
    ],
    "faults": [],
}


def test_every_loop_service_logs_in_to_a_secure_broker(
    tmp_path_factory: pytest.TempPathFactory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from cgloop.stack.stack import Stack

    model = Settings().state_dir / "analytics" / "flow-classifier.skops"
    if not model.is_file():
        pytest.skip(f"no trained classifier at {model} (make setup trains it)")
    settings = private_settings(tmp_path_factory.mktemp("secure-loop")).model_copy(
        update={"kafka_broker_security": "sasl_ssl"}
    )
    stack = Stack(settings, sink=True)
    lab = Lab(load_topology(name=f"cgl-auth-{os.getpid()}"), state_dir=tmp_path / "lab")
    closed = None
    try:
        assert stack.up().healthy
        config = stack.client_config()
        assert config["security.protocol"] == "SASL_SSL"
        # As `cgloop run` does after `up` (export_kafka_security): what it starts logs in too.
        for var, value in settings.kafka_security().env().items():
            monkeypatch.setenv(var, value)
        cgloop.config.settings.cache_clear()  # this process's clients (readiness checks) too
        closed = ClosedLoop(
            lab, Scenario.model_validate(SCENARIO), settings, tmp_path / "run", LoopOptions()
        )
        lab.up()
        closed.start()  # waits for the analytics and policy groups: they logged in
        sources = _sources_seen(
            settings.bootstrap_servers,
            {k: v for k, v in config.items() if k != "bootstrap.servers"},
            want={"cgloop.flows.v1", "cgloop.probes.v1"},
        )
        node = closed.plan.node
        assert any(s.startswith(f"{node}/") for s in sources["cgloop.flows.v1"]), sources
        assert sources["cgloop.probes.v1"], sources
        assert not closed.services.check(), closed.services.check()
    finally:
        if closed is not None:
            closed.stop()
        lab.down()
        stack.down()
        cgloop.config.settings.cache_clear()


def _sources_seen(bootstrap: str, security: dict, want: set[str]) -> dict[str, set[str]]:
    """Source ids of the records on each topic in `want`, until every topic has one (≤ 60 s)."""
    seen: dict[str, set[str]] = {t: set() for t in want}
    consumer = BatchConsumer(bootstrap, f"auth-loop-{uuid.uuid4().hex}", sorted(want), **security)
    deadline = time.monotonic() + 60
    try:
        while not all(seen.values()) and time.monotonic() < deadline:
            item = consumer.poll(0.5)
            if item is None:
                continue
            topic, batch, _ = item
            for rec in batch.records:
                seen[topic.name].add(rec.header.source_id)
    finally:
        consumer.close()
    return seen
