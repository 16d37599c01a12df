"""The embedded broker requiring SASL_SSL + SCRAM (CGLOOP_KAFKA_BROKER_SECURITY=sasl_ssl):
cgloop's clients, Python and Rust, log in with the credentials `up` generated; a client without
them, with a wrong password or without TLS delivers nothing; the sink inside the store logs in
too. Real broker, real TLS, real SCRAM."""

from __future__ import annotations

import json
import os
import shutil
import socket
import stat
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from cgloop.bus.kafka import BatchConsumer, BatchProducer
from cgloop.config import Settings, embedded_client_file
from cgloop.contracts.samples import SAMPLE_FOR_TOPIC, SAMPLES
from cgloop.testing import private_settings

pytestmark = [
    pytest.mark.kafka,
    pytest.mark.skipif(shutil.which("java") is None, reason="the Kafka broker needs Java"),
]

TOPIC = "cgloop.detections.v1"
SYSTEM_CAS = "/etc/ssl/certs/ca-certificates.crt"


@pytest.fixture(scope="module")
def secure(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Settings, dict]]:
    """A stack whose broker requires SASL_SSL, and the librdkafka properties of its clients."""
    from cgloop.stack.stack import Stack

    settings = private_settings(tmp_path_factory.mktemp("secure")).model_copy(
        update={"kafka_broker_security": "sasl_ssl"}
    )
    stack = Stack(settings)  # with the sink: it must log in as well
    try:
        status = stack.up()
        assert status.healthy, status.as_dict()
        yield settings, stack.client_config()
    finally:
        stack.down()


def _security(config: dict) -> dict:
    return {k: v for k, v in config.items() if k != "bootstrap.servers"}


def _send(bootstrap: str, marker: str, **config) -> None:
    producer = BatchProducer(bootstrap, **{"message.timeout.ms": 5000, **config})
    producer.send(TOPIC, SAMPLES[SAMPLE_FOR_TOPIC[TOPIC]](), key=marker)
    producer.flush(20)


def _keys_on_topic(bootstrap: str, security: dict, want: set[str], timeout_s: float) -> set[str]:
    consumer = BatchConsumer(bootstrap, f"auth-{uuid.uuid4().hex}", [TOPIC], **security)
    seen: set[str] = set()
    deadline = time.monotonic() + timeout_s
    try:
        while not want <= seen and time.monotonic() < deadline:
            item = consumer.poll(0.5)
            if item is not None:
                seen.add((item[2].key() or b"").decode())
    finally:
        consumer.close()
    return seen


def test_the_client_listener_requires_tls_and_scram(secure) -> None:
    settings, config = secure
    lines = (settings.state_dir / "kafka" / "server.properties").read_text().splitlines()
    listeners = next(line for line in lines if line.startswith("listeners="))
    assert "PLAINTEXT" not in listeners and "SASL_SSL://" in listeners
    assert "listener.name.controller.ssl.client.auth=required" in lines
    assert config["security.protocol"] == "SASL_SSL"
    assert config["sasl.mechanism"] == "SCRAM-SHA-512"
    # Secrets are the owner's only.
    kafka = settings.state_dir / "kafka"
    for path in [
        kafka / "server.properties",
        kafka / "client" / "password",
        embedded_client_file(settings.state_dir),
        *(kafka / "secrets").iterdir(),
    ]:
        assert stat.S_IMODE(path.stat().st_mode) & 0o077 == 0, path
    record = json.loads(embedded_client_file(settings.state_dir).read_text())
    assert record["bootstrap"] == settings.bootstrap_servers
    assert config["sasl.password"] not in json.dumps(record)  # the record names a file


def test_clients_with_the_credentials_round_trip_and_others_deliver_nothing(secure) -> None:
    settings, config = secure
    bootstrap, security = settings.bootstrap_servers, _security(config)
    good = f"good-{uuid.uuid4().hex}"
    _send(bootstrap, good, **security)

    refused = {
        "no credentials": {"security.protocol": "PLAINTEXT"},
        "no TLS": {**security, "security.protocol": "SASL_PLAINTEXT"},
        "wrong password": {**security, "sasl.password": "not-the-password"},
        "unknown user": {**security, "sasl.username": "mallory"},
    }
    if Path(SYSTEM_CAS).is_file():  # real CAs, none of which signed the broker's certificate
        refused["untrusted broker certificate"] = {**security, "ssl.ca.location": SYSTEM_CAS}
    bad_keys = {}
    for case, props in refused.items():
        marker = f"bad-{uuid.uuid4().hex}"
        bad_keys[marker] = case
        with pytest.raises(RuntimeError):  # undelivered or failed: flush says so
            _send(bootstrap, marker, **props)

    seen = _keys_on_topic(bootstrap, security, {good}, timeout_s=30)
    assert good in seen
    leaked = [case for marker, case in bad_keys.items() if marker in seen]
    assert not leaked, f"delivered without valid credentials: {leaked}"


def test_the_sink_inside_the_store_logs_in(secure) -> None:
    from confluent_kafka import ConsumerGroupState
    from confluent_kafka.admin import AdminClient

    _, config = secure
    admin = AdminClient(config)
    deadline = time.monotonic() + 60
    state = None
    while time.monotonic() < deadline:
        groups = admin.list_consumer_groups(request_timeout=10).result().valid
        sink = [g.group_id for g in groups if "sink" in g.group_id]
        if sink:
            desc = admin.describe_consumer_groups(sink, request_timeout=10)[sink[0]].result(10)
            state = desc.state
            if state == ConsumerGroupState.STABLE:
                return
        time.sleep(0.5)
    pytest.fail(f"the store's sink never joined its consumer group (last state {state})")


def _free_udp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_rust_int_collector_delivers_with_the_settings(secure) -> None:
    from cgloop.telemetry.int_cli import collector_binary, collector_command

    settings, config = secure
    bootstrap = settings.bootstrap_servers
    env = {**os.environ, **settings.kafka_security().env()}
    assert "CGLOOP_KAFKA_SASL_PASSWORD" not in env or "CGLOOP_KAFKA_SASL_PASSWORD_FILE" in env
    source = f"int-auth-{uuid.uuid4().hex[:8]}"
    port = _free_udp_port()
    cmd = collector_command(f"127.0.0.1:{port}", bootstrap, 1, 5.0, [])
    cmd += ["--source-id", source, "--summary-interval", "1"]
    collector = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                 env=env)  # fmt: skip
    try:
        line = collector.stderr.readline()
        assert '"listening"' in line, line + collector.stderr.read()
        gen = subprocess.run(
            [str(collector_binary()), "gen", "--target", f"127.0.0.1:{port}", "--format",
             "v2.0", "--flows", "2", "--hops", "2", "--count", "200", "--rate", "500"],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert gen.returncode == 0, gen.stderr
        out, err = collector.communicate(timeout=60)
    finally:
        if collector.poll() is None:
            collector.kill()
            collector.wait(10)
    assert collector.returncode == 0, err
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["records"] > 0, summary

    consumer = BatchConsumer(bootstrap, f"int-auth-{source}", ["cgloop.int.v1"],
                             **_security(config))  # fmt: skip
    got = 0
    deadline = time.monotonic() + 60
    try:
        while got < summary["records"] and time.monotonic() < deadline:
            item = consumer.poll(0.5)
            if item is None:
                continue
            for rec in item[1].records:
                r = getattr(rec, rec.WhichOneof("record"))
                got += r.header.source_id.startswith(source)
    finally:
        consumer.close()
    assert got == summary["records"]


def test_the_rust_producers_refuse_a_bad_setting_naming_it() -> None:
    from cgloop.telemetry.int_cli import collector_binary

    env = {**os.environ, "CGLOOP_KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
           "CGLOOP_KAFKA_SASL_USERNAME": "cgloop"}  # fmt: skip
    env.pop("CGLOOP_KAFKA_SASL_PASSWORD", None)
    env.pop("CGLOOP_KAFKA_SASL_PASSWORD_FILE", None)
    result = subprocess.run(
        [str(collector_binary()), "run", "--listen", f"127.0.0.1:{_free_udp_port()}",
         "--kafka", "127.0.0.1:9", "--duration", "1"],
        capture_output=True, text=True, timeout=30, env=env,
    )  # fmt: skip
    assert result.returncode != 0
    assert "CGLOOP_KAFKA_SASL_PASSWORD_FILE" in result.stderr
