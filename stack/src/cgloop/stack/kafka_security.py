"""The embedded broker requiring authentication (CGLOOP_KAFKA_BROKER_SECURITY=sasl_ssl).

The client listener speaks SASL_SSL: TLS with a certificate made by the JRE's own `keytool`
(self-signed, for the broker's address; clients trust exactly it), and SCRAM-SHA-512 for the
`cgloop` user every service logs in as. The broker's own user (`broker`, inter-broker traffic
and `cgloop up`'s credential set-up) logs in with PLAIN over the same TLS listener: its password
lives only in the broker's 0600 configuration, which lets `up` (re)create the SCRAM user on any
log dir, including one formatted before security was turned on. The controller listener takes
only TLS clients holding the broker's own key, so nothing reaches the metadata quorum
unauthenticated either.

Secrets are random, generated once, and kept in `<state>/kafka/secrets` (0700, files 0600);
what clients need (user, password file, CA) is recorded in `<state>/kafka/client`, where
`Settings.kafka_security` finds it.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import secrets
import shutil
import subprocess
from pathlib import Path

from cgloop.config import EmbeddedClient, KafkaClientSecurity, embedded_client_file

CLIENT_USER = "cgloop"
BROKER_USER = "broker"
MECHANISM = "SCRAM-SHA-512"
SCRAM_ITERATIONS = 8192
CERT_DAYS = 3650


def _write_secret(path: Path, text: str) -> None:
    """Create `path` readable by its owner only (created 0600, never briefly wider)."""
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)


def _private_dir(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    path.chmod(0o700)
    return path


class BrokerSecurity:
    """Credentials, certificate and listener settings of a broker that requires SASL_SSL."""

    def __init__(self, home: Path, host: str, port: int, controller_port: int) -> None:
        self.home, self.host, self.port = home, host, port
        self.controller_port = controller_port
        self.secrets = home / "secrets"
        self.client_dir = home / "client"

    @property
    def keystore(self) -> Path:
        return self.secrets / "broker.p12"

    @property
    def ca_file(self) -> Path:
        return self.client_dir / "ca.pem"

    @property
    def client_password_file(self) -> Path:
        return self.client_dir / "password"

    def _secret(self, name: str) -> str:
        path = self.secrets / name
        if not path.is_file():
            _write_secret(path, secrets.token_urlsafe(32))
        return path.read_text().strip()

    def ensure(self) -> None:
        """Generate what is missing: passwords, the broker's key and certificate."""
        _private_dir(self.home)
        _private_dir(self.secrets)
        _private_dir(self.client_dir)
        self._secret("broker.password")
        self._secret("keystore.password")
        if not self.client_password_file.is_file():
            _write_secret(self.client_password_file, secrets.token_urlsafe(32))
        # A certificate for another address would fail every client's hostname check.
        names_file = self.secrets / "certificate.names"
        if (
            not (self.keystore.is_file() and self.ca_file.is_file())
            or (names_file.read_text() if names_file.is_file() else "") != self._san()
        ):
            self._make_certificate()
            _write_secret(names_file, self._san())

    def _san(self) -> str:
        names = {"dns:localhost", "ip:127.0.0.1"}
        try:
            ipaddress.ip_address(self.host)
            names.add(f"ip:{self.host}")
        except ValueError:
            names.add(f"dns:{self.host}")
        return ",".join(sorted(names))

    def _make_certificate(self) -> None:
        keytool = _keytool()
        # Passwords go through the environment (`:env`), never the command line that other
        # local users can read in /proc.
        env = {**os.environ, "CGLOOP_KEYSTORE_PASSWORD": self._secret("keystore.password")}
        self.keystore.unlink(missing_ok=True)
        for cmd in (
            [
                keytool, "-genkeypair", "-alias", "kafka", "-keyalg", "EC", "-groupname",
                "secp256r1", "-dname", "CN=cgloop-kafka", "-ext", f"SAN={self._san()}",
                "-validity", str(CERT_DAYS), "-storetype", "PKCS12",
                "-keystore", str(self.keystore), "-storepass:env", "CGLOOP_KEYSTORE_PASSWORD",
            ],
            [
                keytool, "-exportcert", "-rfc", "-alias", "kafka", "-keystore",
                str(self.keystore), "-storepass:env", "CGLOOP_KEYSTORE_PASSWORD",
                "-file", str(self.ca_file),
            ],
        ):  # fmt: skip
            result = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=60)
            if result.returncode != 0:
                raise RuntimeError(
                    f"making the Kafka broker's TLS certificate failed: "
                    f"{(result.stderr or result.stdout).strip()}"
                )
        self.keystore.chmod(0o600)

    def server_properties(self) -> list[str]:
        """The listener lines of server.properties (which holds secrets: written 0600)."""
        h, broker_pw = self.host, self._secret("broker.password")
        store_pw = self._secret("keystore.password")
        return [
            f"listeners=SASL_SSL://{h}:{self.port},CONTROLLER://{h}:{self.controller_port}",
            f"advertised.listeners=SASL_SSL://{h}:{self.port}",
            "inter.broker.listener.name=SASL_SSL",
            "listener.security.protocol.map=SASL_SSL:SASL_SSL,CONTROLLER:SSL",
            f"sasl.enabled.mechanisms={MECHANISM},PLAIN",
            "sasl.mechanism.inter.broker.protocol=PLAIN",
            # PLAIN knows only the broker's own user; services log in with SCRAM.
            "listener.name.sasl_ssl.plain.sasl.jaas.config="
            "org.apache.kafka.common.security.plain.PlainLoginModule required "
            f'username="{BROKER_USER}" password="{broker_pw}" '
            f'user_{BROKER_USER}="{broker_pw}";',
            f"listener.name.sasl_ssl.{MECHANISM.lower()}.sasl.jaas.config="
            "org.apache.kafka.common.security.scram.ScramLoginModule required;",
            "ssl.keystore.type=PKCS12",
            f"ssl.keystore.location={self.keystore}",
            f"ssl.keystore.password={store_pw}",
            f"ssl.key.password={store_pw}",
            "ssl.truststore.type=PEM",
            f"ssl.truststore.location={self.ca_file}",
            # The controller listener: only the holder of the broker's key gets in.
            "listener.name.controller.ssl.client.auth=required",
        ]

    def admin_config(self) -> dict[str, str]:
        """librdkafka properties for the broker's own user (credential set-up only)."""
        return {
            "security.protocol": "SASL_SSL",
            "sasl.mechanism": "PLAIN",
            "sasl.username": BROKER_USER,
            "sasl.password": self._secret("broker.password"),
            "ssl.ca.location": str(self.ca_file),
        }

    def client_security(self) -> KafkaClientSecurity:
        return KafkaClientSecurity(
            security_protocol="SASL_SSL",
            sasl_mechanism=MECHANISM,
            sasl_username=CLIENT_USER,
            sasl_password_file=self.client_password_file,
            ssl_ca_location=self.ca_file,
        )

    def create_client_user(self, timeout_s: float = 30) -> None:
        """(Re)create the SCRAM user the services log in as; idempotent."""
        from confluent_kafka.admin import (
            AdminClient,
            ScramCredentialInfo,
            ScramMechanism,
            UserScramCredentialUpsertion,
        )

        admin = AdminClient(
            {
                "bootstrap.servers": f"{self.host}:{self.port}",
                **self.admin_config(),
                "logger": _quiet,
            }
        )
        upsert = UserScramCredentialUpsertion(
            CLIENT_USER,
            ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, SCRAM_ITERATIONS),
            self.client_password_file.read_text().strip().encode(),
        )
        for user, future in admin.alter_user_scram_credentials(
            [upsert], request_timeout=timeout_s
        ).items():
            try:
                future.result(timeout_s)
            except Exception as exc:
                raise RuntimeError(f"creating the Kafka user {user!r} failed: {exc}") from exc

    def record_for_clients(self, bootstrap: str) -> None:
        """Tell clients of this state folder how to log in (`Settings.kafka_security`)."""
        record = EmbeddedClient(bootstrap=bootstrap, security=self.client_security())
        _write_secret(embedded_client_file(self.home.parent), record.model_dump_json(indent=2))


def forget_client_record(state_dir: Path) -> None:
    """A broker started without security: clients must not try to log in to it."""
    embedded_client_file(state_dir).unlink(missing_ok=True)


# The admin client's own log lines (queue purges at close) are noise here.
_quiet = logging.getLogger("cgloop.stack.kafka_security.librdkafka")
_quiet.addHandler(logging.NullHandler())
_quiet.propagate = False


def _keytool() -> str:
    java = shutil.which("java")
    candidates = [Path(java).resolve().parent / "keytool"] if java else []
    found = shutil.which("keytool")
    for path in [*candidates, *([Path(found)] if found else [])]:
        if path.is_file():
            return str(path)
    raise RuntimeError(
        "keytool (part of the Java runtime) is missing: it makes the broker's TLS certificate"
    )
