"""The secure broker's configuration, without starting it: no plaintext listener, the controller
for the broker's own key only, secrets created owner-only, a certificate for the broker's
address made once and remade when the address changes."""

from __future__ import annotations

import shutil
import ssl
import stat
from pathlib import Path

import pytest
from cgloop.config import Settings, embedded_client_file
from cgloop.stack.kafka_broker import KafkaBroker
from cgloop.stack.kafka_security import BrokerSecurity

pytestmark = pytest.mark.skipif(
    shutil.which("java") is None, reason="keytool (the Java runtime) makes the certificate"
)


def _sans(pem: Path) -> set[tuple[str, str]]:
    decoded = ssl._ssl._test_decode_cert(str(pem))  # the stdlib's own X.509 reader
    return set(decoded["subjectAltName"])


def test_secrets_are_owner_only_and_the_certificate_names_the_broker(tmp_path: Path) -> None:
    security = BrokerSecurity(tmp_path / "kafka", "127.0.0.2", 19092, 19093)
    security.ensure()
    assert ("IP Address", "127.0.0.2") in _sans(security.ca_file)
    assert ("IP Address", "127.0.0.1") in _sans(security.ca_file)
    for path in [*security.secrets.iterdir(), security.client_password_file, security.keystore]:
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
    for folder in (security.home, security.secrets, security.client_dir):
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700, folder

    # Made once: a second start keeps certificate and passwords.
    cert, password = security.ca_file.read_bytes(), security.client_password_file.read_text()
    security.ensure()
    assert security.ca_file.read_bytes() == cert
    assert security.client_password_file.read_text() == password
    # Another address: a new certificate (clients check the name), same passwords.
    moved = BrokerSecurity(tmp_path / "kafka", "localhost", 19092, 19093)
    moved.ensure()
    assert moved.ca_file.read_bytes() != cert
    assert ("DNS", "localhost") in _sans(moved.ca_file)
    assert moved.client_password_file.read_text() == password


def test_no_listener_takes_unauthenticated_clients(tmp_path: Path) -> None:
    broker = KafkaBroker(tmp_path, tmp_path, "127.0.0.1", 19092, 19093, security="sasl_ssl")
    assert broker.security is not None
    broker.security.ensure()
    props = dict(
        line.split("=", 1) for line in broker.server_properties().splitlines() if "=" in line
    )
    assert props["listeners"] == "SASL_SSL://127.0.0.1:19092,CONTROLLER://127.0.0.1:19093"
    assert props["listener.security.protocol.map"] == "SASL_SSL:SASL_SSL,CONTROLLER:SSL"
    assert props["listener.name.controller.ssl.client.auth"] == "required"
    assert props["sasl.enabled.mechanisms"] == "SCRAM-SHA-512,PLAIN"
    # PLAIN knows the broker's own user and no other.
    jaas = props["listener.name.sasl_ssl.plain.sasl.jaas.config"]
    assert jaas.count("user_") == 1 and "user_broker=" in jaas
    assert "PLAINTEXT" not in props["listeners"]


def test_a_plaintext_start_forgets_the_recorded_login(tmp_path: Path) -> None:
    security = BrokerSecurity(tmp_path / "kafka", "127.0.0.1", 19092, 19093)
    security.ensure()
    security.record_for_clients("127.0.0.1:19092")
    settings = Settings(state_dir=tmp_path, kafka_port=19092)
    assert settings.kafka_config()["security.protocol"] == "SASL_SSL"
    broker = KafkaBroker(tmp_path, tmp_path, "127.0.0.1", 19092, 19093, security="plaintext")
    assert "PLAINTEXT://127.0.0.1:19092" in broker.server_properties()
    from cgloop.stack.kafka_security import forget_client_record

    forget_client_record(tmp_path)  # what KafkaBroker.start does without security
    assert not embedded_client_file(tmp_path).exists()
    assert settings.kafka_config() == {"bootstrap.servers": "127.0.0.1:19092"}
