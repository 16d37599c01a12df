"""CGLOOP_KAFKA_* client security settings → librdkafka properties, and the refusals that name
the variable at fault (the Rust twin: proto/rust/src/kafka_security.rs)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from cgloop.bus.kafka import client_config
from cgloop.config import (
    EmbeddedClient,
    KafkaClientSecurity,
    KafkaSecurityError,
    Settings,
    embedded_client_file,
)
from cgloop.testing import cgloop_cmd

SECURITY_VARS = [
    "CGLOOP_KAFKA_SECURITY_PROTOCOL",
    "CGLOOP_KAFKA_SASL_MECHANISM",
    "CGLOOP_KAFKA_SASL_USERNAME",
    "CGLOOP_KAFKA_SASL_PASSWORD",
    "CGLOOP_KAFKA_SASL_PASSWORD_FILE",
    "CGLOOP_KAFKA_SSL_CA_LOCATION",
    "CGLOOP_KAFKA_SSL_CERTIFICATE_LOCATION",
    "CGLOOP_KAFKA_SSL_KEY_LOCATION",
]


@pytest.fixture(autouse=True)
def _no_security_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in SECURITY_VARS:
        monkeypatch.delenv(var, raising=False)


def test_nothing_set_is_plaintext() -> None:
    assert KafkaClientSecurity().properties() == {}


def test_sasl_ssl_with_a_password_file(tmp_path: Path, monkeypatch) -> None:
    password, ca = tmp_path / "password", tmp_path / "ca.pem"
    password.write_text("s3cret\n")
    ca.write_text("pem")
    monkeypatch.setenv("CGLOOP_KAFKA_SECURITY_PROTOCOL", "sasl_ssl")
    monkeypatch.setenv("CGLOOP_KAFKA_SASL_USERNAME", "cgloop")
    monkeypatch.setenv("CGLOOP_KAFKA_SASL_PASSWORD_FILE", str(password))
    monkeypatch.setenv("CGLOOP_KAFKA_SSL_CA_LOCATION", str(ca))
    settings = Settings(state_dir=tmp_path)
    assert settings.kafka_config("h:1") == {
        "bootstrap.servers": "h:1",
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.username": "cgloop",
        "sasl.password": "s3cret",
        "ssl.ca.location": str(ca),
    }
    # A child gets the file's path, not the secret.
    env = settings.kafka_security().env()
    assert env["CGLOOP_KAFKA_SASL_PASSWORD_FILE"] == str(password)
    assert "s3cret" not in repr(settings) and "s3cret" not in str(env)


def test_tls_with_a_client_certificate(tmp_path: Path) -> None:
    cert, key = tmp_path / "c.pem", tmp_path / "c.key"
    cert.write_text("c")
    key.write_text("k")
    props = KafkaClientSecurity(
        security_protocol="SSL", ssl_certificate_location=cert, ssl_key_location=key
    ).properties()
    assert props == {
        "security.protocol": "SSL",
        "ssl.certificate.location": str(cert),
        "ssl.key.location": str(key),
    }


BAD = [
    ({"security_protocol": "SASL_TLS"}, "CGLOOP_KAFKA_SECURITY_PROTOCOL='SASL_TLS'"),
    ({"security_protocol": "SASL_SSL", "sasl_password": "x"}, "CGLOOP_KAFKA_SASL_USERNAME"),
    ({"security_protocol": "SASL_SSL", "sasl_username": "u"}, "CGLOOP_KAFKA_SASL_PASSWORD_FILE"),
    (
        {"security_protocol": "SASL_SSL", "sasl_username": "u", "sasl_password": "x",
         "sasl_mechanism": "GSSAPI"},
        "CGLOOP_KAFKA_SASL_MECHANISM",
    ),
    (
        {"security_protocol": "SASL_SSL", "sasl_username": "u", "sasl_password": "x",
         "sasl_password_file": "/etc/hostname"},
        "not both",
    ),
    (
        {"security_protocol": "SASL_SSL", "sasl_username": "u",
         "sasl_password_file": "/nonexistent/pw"},
        "CGLOOP_KAFKA_SASL_PASSWORD_FILE=/nonexistent/pw",
    ),
    ({"sasl_username": "u"}, "CGLOOP_KAFKA_SECURITY_PROTOCOL is not"),
    ({"security_protocol": "PLAINTEXT", "sasl_username": "u"}, "CGLOOP_KAFKA_SASL_USERNAME"),
    (
        {"security_protocol": "SASL_PLAINTEXT", "sasl_username": "u", "sasl_password": "x",
         "ssl_ca_location": "/etc/hostname"},
        "CGLOOP_KAFKA_SSL_CA_LOCATION",
    ),
    ({"security_protocol": "SSL", "ssl_ca_location": "/nonexistent"}, "no such file"),
    ({"security_protocol": "SSL", "ssl_certificate_location": "/etc/hostname"}, "both"),
]  # fmt: skip


@pytest.mark.parametrize(("fields", "message"), BAD)
def test_bad_settings_are_refused_naming_the_variable(fields: dict, message: str) -> None:
    with pytest.raises(KafkaSecurityError, match=message.replace("(", r"\(")):
        KafkaClientSecurity(**fields).properties()


def test_the_embedded_brokers_record_applies_to_its_address_only(tmp_path: Path) -> None:
    password = tmp_path / "pw"
    password.write_text("pw")
    record = EmbeddedClient(
        bootstrap="127.0.0.1:19092",
        security=KafkaClientSecurity(
            security_protocol="SASL_SSL", sasl_username="cgloop", sasl_password_file=password
        ),
    )
    path = embedded_client_file(tmp_path)
    path.parent.mkdir(parents=True)
    path.write_text(record.model_dump_json())
    settings = Settings(state_dir=tmp_path, kafka_port=19092)
    assert settings.kafka_config()["sasl.username"] == "cgloop"
    # Another broker (e.g. a test's own) is not given these credentials.
    assert settings.kafka_config("127.0.0.1:29092") == {"bootstrap.servers": "127.0.0.1:29092"}
    # Explicit settings win over the record.
    explicit = Settings(state_dir=tmp_path, kafka_port=19092, kafka_security_protocol="PLAINTEXT")
    assert explicit.kafka_config() == {
        "bootstrap.servers": "127.0.0.1:19092",
        "security.protocol": "PLAINTEXT",
    }


def test_every_client_takes_the_security_settings(monkeypatch) -> None:
    import cgloop.config

    monkeypatch.setenv("CGLOOP_KAFKA_SECURITY_PROTOCOL", "SASL_PLAINTEXT")
    monkeypatch.setenv("CGLOOP_KAFKA_SASL_USERNAME", "u")
    monkeypatch.setenv("CGLOOP_KAFKA_SASL_PASSWORD", "p")
    cgloop.config.settings.cache_clear()
    try:
        config = client_config("h:1", {"client.id": "x"})
    finally:
        cgloop.config.settings.cache_clear()
    assert config["security.protocol"] == "SASL_PLAINTEXT"
    assert config["sasl.username"] == "u" and config["client.id"] == "x"


def test_the_cli_names_a_bad_variable_without_a_traceback(tmp_path: Path) -> None:
    env = {
        **os.environ,
        "CGLOOP_STATE_DIR": str(tmp_path),
        "CGLOOP_KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
        "CGLOOP_KAFKA_SASL_USERNAME": "cgloop",
    }
    for var in ("CGLOOP_KAFKA_SASL_PASSWORD", "CGLOOP_KAFKA_SASL_PASSWORD_FILE"):
        env.pop(var, None)
    result = subprocess.run(cgloop_cmd("up"), capture_output=True, text=True, env=env, timeout=120)
    assert result.returncode != 0
    assert "CGLOOP_KAFKA_SASL_PASSWORD_FILE" in result.stderr + result.stdout
    assert "Traceback" not in result.stderr


def test_empty_variables_count_as_unset(monkeypatch) -> None:
    # compose passes `${CGLOOP_KAFKA_SASL_USERNAME:-}` through as an empty string
    monkeypatch.setenv("CGLOOP_KAFKA_SECURITY_PROTOCOL", "PLAINTEXT")
    monkeypatch.setenv("CGLOOP_KAFKA_SASL_USERNAME", "")
    monkeypatch.setenv("CGLOOP_KAFKA_SSL_CA_LOCATION", "")
    assert Settings().kafka_config("h:1") == {
        "bootstrap.servers": "h:1",
        "security.protocol": "PLAINTEXT",
    }


def test_a_bad_broker_security_names_the_variable() -> None:
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="CGLOOP_KAFKA_BROKER_SECURITY='tls'"):
        Settings(kafka_broker_security="tls")
    assert Settings(kafka_broker_security="SASL_SSL").kafka_broker_security == "sasl_ssl"


def test_credentials_of_another_user_are_named_not_ignored(tmp_path: Path, monkeypatch) -> None:
    path = embedded_client_file(tmp_path)
    path.parent.mkdir(parents=True)
    path.write_text("{}")
    path.chmod(0)
    if os.geteuid() == 0:  # root reads every file: refuse as the kernel would another user
        real = Path.read_bytes

        def read_bytes(self: Path) -> bytes:
            if self == path:
                raise PermissionError(13, "Permission denied", str(self))
            return real(self)

        monkeypatch.setattr(Path, "read_bytes", read_bytes)
    # Another broker is not this record's business.
    assert Settings(state_dir=tmp_path).kafka_config("h:1") == {"bootstrap.servers": "h:1"}
    with pytest.raises(KafkaSecurityError, match="readable only by the user who ran"):
        Settings(state_dir=tmp_path, kafka_port=19092).kafka_config()


def test_a_child_gets_every_variable_so_none_is_inherited_stale(tmp_path: Path) -> None:
    env = KafkaClientSecurity().env()
    assert set(env) == set(SECURITY_VARS) and not any(env.values())
    # A state folder of its own: the developer's may record a secure broker's login.
    assert Settings(state_dir=tmp_path).kafka_security().properties() == {}
