"""Settings shared by every cgloop process, from the environment (CGLOOP_*) or defaults.

The embedded stack keeps everything it writes (Kafka log dirs, the store, logs, pid files) in
one project-local state folder, so a checkout never scatters files over the machine.
"""

from __future__ import annotations

import json
import os
import re
from functools import cache
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

KAFKA_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
SASL_MECHANISMS = ("SCRAM-SHA-512", "SCRAM-SHA-256", "PLAIN")
DEFAULT_SASL_MECHANISM = "SCRAM-SHA-512"


class KafkaSecurityError(ValueError):
    """A Kafka client security setting is wrong; the message names the variable."""


def _none_if_blank(value: object) -> object:
    return None if isinstance(value, str) and not value.strip() else value


def _var(field: str) -> str:
    return f"CGLOOP_KAFKA_{field.upper()}"


class KafkaClientSecurity(BaseModel):
    """How a Kafka client authenticates and encrypts: the CGLOOP_KAFKA_SECURITY_PROTOCOL,
    CGLOOP_KAFKA_SASL_* and CGLOOP_KAFKA_SSL_* settings, turned into librdkafka properties by
    `properties()`. The Rust producers read the same variables (cgloop_proto::kafka_security)."""

    model_config = ConfigDict(frozen=True)

    security_protocol: str | None = None
    sasl_mechanism: str | None = None
    sasl_username: str | None = None
    sasl_password: SecretStr | None = None
    # Preferred over sasl_password: a file (mode 0600) keeps the secret out of the environment.
    sasl_password_file: Path | None = None
    ssl_ca_location: Path | None = None
    ssl_certificate_location: Path | None = None
    ssl_key_location: Path | None = None

    # An empty variable (e.g. `${VAR:-}` in compose) counts as unset, as on the Rust side.
    _empty_is_unset = field_validator("*", mode="before")(_none_if_blank)

    def is_set(self) -> bool:
        return any(getattr(self, name) is not None for name in type(self).model_fields)

    def _set_fields(self, prefix: str) -> list[str]:
        return [
            name
            for name in type(self).model_fields
            if name.startswith(prefix) and getattr(self, name) is not None
        ]

    def properties(self) -> dict[str, str]:
        """librdkafka properties; KafkaSecurityError (naming the variable) on a bad value."""
        if not (self.security_protocol or "").strip():
            if others := self._set_fields("s"):
                raise KafkaSecurityError(
                    f"{_var(others[0])} is set but CGLOOP_KAFKA_SECURITY_PROTOCOL is not; "
                    f"set it to one of {', '.join(KAFKA_PROTOCOLS)}"
                )
            return {}
        protocol = self.security_protocol.strip().upper()
        if protocol not in KAFKA_PROTOCOLS:
            raise KafkaSecurityError(
                f"CGLOOP_KAFKA_SECURITY_PROTOCOL={self.security_protocol!r} is not one of "
                f"{', '.join(KAFKA_PROTOCOLS)}"
            )
        props = {"security.protocol": protocol}
        if protocol.startswith("SASL_"):
            props.update(self._sasl(protocol))
        elif sasl := self._set_fields("sasl_"):
            raise KafkaSecurityError(
                f"{_var(sasl[0])} is set but CGLOOP_KAFKA_SECURITY_PROTOCOL={protocol} does not "
                "use SASL (use SASL_SSL)"
            )
        if protocol.endswith("SSL"):
            props.update(self._ssl())
        elif ssl := self._set_fields("ssl_"):
            raise KafkaSecurityError(
                f"{_var(ssl[0])} is set but CGLOOP_KAFKA_SECURITY_PROTOCOL={protocol} does not "
                "use TLS (use SSL or SASL_SSL)"
            )
        return props

    def _sasl(self, protocol: str) -> dict[str, str]:
        mechanism = (self.sasl_mechanism or DEFAULT_SASL_MECHANISM).strip().upper()
        if mechanism not in SASL_MECHANISMS:
            raise KafkaSecurityError(
                f"CGLOOP_KAFKA_SASL_MECHANISM={self.sasl_mechanism!r} is not one of "
                f"{', '.join(SASL_MECHANISMS)}"
            )
        if not (self.sasl_username or "").strip():
            raise KafkaSecurityError(
                f"CGLOOP_KAFKA_SASL_USERNAME is required with "
                f"CGLOOP_KAFKA_SECURITY_PROTOCOL={protocol}"
            )
        if self.sasl_password is not None and self.sasl_password_file is not None:
            raise KafkaSecurityError(
                "set CGLOOP_KAFKA_SASL_PASSWORD_FILE or CGLOOP_KAFKA_SASL_PASSWORD, not both"
            )
        if self.sasl_password_file is not None:
            password = _read_secret(self.sasl_password_file, _var("sasl_password_file"))
        elif self.sasl_password is not None:
            password = self.sasl_password.get_secret_value()
        else:
            raise KafkaSecurityError(
                f"CGLOOP_KAFKA_SECURITY_PROTOCOL={protocol} needs a password: set "
                "CGLOOP_KAFKA_SASL_PASSWORD_FILE (a file holding it) or CGLOOP_KAFKA_SASL_PASSWORD"
            )
        if not password:
            raise KafkaSecurityError("the Kafka SASL password is empty")
        return {
            "sasl.mechanism": mechanism,
            "sasl.username": self.sasl_username.strip(),
            "sasl.password": password,
        }

    def _ssl(self) -> dict[str, str]:
        props = {}
        for name in ("ssl_ca_location", "ssl_certificate_location", "ssl_key_location"):
            path = getattr(self, name)
            if path is None:
                continue
            if not path.is_file():
                raise KafkaSecurityError(f"{_var(name)}={path}: no such file")
            props[name.replace("_", ".")] = str(path)
        if (self.ssl_certificate_location is None) != (self.ssl_key_location is None):
            raise KafkaSecurityError(
                "a client certificate needs both CGLOOP_KAFKA_SSL_CERTIFICATE_LOCATION and "
                "CGLOOP_KAFKA_SSL_KEY_LOCATION"
            )
        return props

    def env(self) -> dict[str, str]:
        """Every CGLOOP_KAFKA_* variable, giving a child process (Python or Rust) exactly these
        settings: unset ones empty (= unset), so none is inherited from this process; an inline
        password is passed as it came, a password file by its path."""
        env = {}
        for name in type(self).model_fields:
            value = getattr(self, name)
            env[_var(name)] = (
                "" if value is None
                else value.get_secret_value() if isinstance(value, SecretStr)
                else str(value)
            )  # fmt: skip
        return env


def _read_secret(path: Path, var: str) -> str:
    try:
        return path.read_text().rstrip("\r\n")
    except OSError as exc:
        raise KafkaSecurityError(f"{var}={path}: cannot read it ({exc.strerror})") from None
    except UnicodeDecodeError:
        raise KafkaSecurityError(f"{var}={path}: not a UTF-8 text file") from None


class EmbeddedClient(BaseModel):
    """What `cgloop up` records for clients of a broker it started requiring authentication."""

    bootstrap: str
    security: KafkaClientSecurity


def embedded_client_file(state_dir: Path) -> Path:
    return state_dir / "kafka" / "client" / "client.json"


def find_project_root(start: Path | None = None) -> Path | None:
    """The checkout this code runs from (the folder holding Makefile and proto/), if any."""
    here = (start or Path(__file__)).resolve()
    for parent in [here, *here.parents]:
        if (parent / "Makefile").is_file() and (parent / "proto" / "cgloop").is_dir():
            return parent
    return None


def _default_state_dir() -> Path:
    root = find_project_root()
    return root / ".state" if root else Path.home() / ".local" / "state" / "cgloop"


def _default_cache_dir() -> Path:
    root = find_project_root()
    return root / ".cache" if root else Path.home() / ".cache" / "cgloop"


class Settings(BaseSettings):
    """Where things live and which loopback ports the embedded stack uses."""

    model_config = SettingsConfigDict(env_prefix="CGLOOP_", extra="ignore")

    state_dir: Path = Field(default_factory=_default_state_dir)
    cache_dir: Path = Field(default_factory=_default_cache_dir)
    host: str = "127.0.0.1"
    kafka_port: int = Field(default=19092, ge=1, le=65535)
    kafka_controller_port: int = Field(default=19093, ge=1, le=65535)
    store_port: int = Field(default=18123, ge=1, le=65535)
    # Extra or replacement schema migrations (a folder of NNNN_name.sql); default: the shipped ones.
    migrations_dir: Path | None = None
    # Start-up refuses to run with less free disk than this under state_dir.
    min_free_disk_mb: int = Field(default=1024, ge=0)
    # Set to use an existing broker or ClickHouse server instead of the embedded ones.
    kafka_bootstrap: str | None = None
    store_url: str | None = None
    # The ClickHouse cluster (its name in the servers' remote_servers) the store at store_url
    # is: migrations are rendered for it (replicated local tables, Distributed tables, ON
    # CLUSTER) and the sink's bookkeeping is replicated across it. Unset: one server or chDB.
    store_cluster: str | None = None
    # The embedded broker: `sasl_ssl` (default) makes `cgloop up` require TLS + SCRAM on its
    # client listener (credentials generated into state_dir/kafka; clients find them there);
    # `plaintext` lets any local process read and write its topics.
    kafka_broker_security: Literal["plaintext", "sasl_ssl"] = "sasl_ssl"
    # Kafka client security (every producer, consumer and admin client; see KafkaClientSecurity).
    kafka_security_protocol: str | None = None
    kafka_sasl_mechanism: str | None = None
    kafka_sasl_username: str | None = None
    kafka_sasl_password: SecretStr | None = None
    kafka_sasl_password_file: Path | None = None
    kafka_ssl_ca_location: Path | None = None
    kafka_ssl_certificate_location: Path | None = None
    kafka_ssl_key_location: Path | None = None

    @field_validator("kafka_broker_security", mode="before")
    @classmethod
    def _broker_security(cls, value: object) -> object:
        choices = ("plaintext", "sasl_ssl")
        if isinstance(value, str) and value.strip().lower() in choices:
            return value.strip().lower()
        raise ValueError(
            f"CGLOOP_KAFKA_BROKER_SECURITY={value!r} is not one of {', '.join(choices)}"
        )

    @field_validator("store_cluster", mode="before")
    @classmethod
    def _cluster_name(cls, value: object) -> object:
        value = _none_if_blank(value)
        if value is not None and not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", str(value)):
            raise ValueError(
                f"CGLOOP_STORE_CLUSTER={value!r} is not a cluster name: letters, digits and _, "
                "as in the servers' remote_servers"
            )
        return value

    _kafka_empty_is_unset = field_validator(
        *(f"kafka_{name}" for name in KafkaClientSecurity.model_fields), mode="before"
    )(_none_if_blank)

    @property
    def bootstrap_servers(self) -> str:
        return self.kafka_bootstrap or f"{self.host}:{self.kafka_port}"

    @property
    def store_http_url(self) -> str:
        return self.store_url or f"http://{self.host}:{self.store_port}"

    def kafka_security(self, bootstrap: str | None = None) -> KafkaClientSecurity:
        """The client security for `bootstrap` (default: this broker): the CGLOOP_KAFKA_*
        settings if any is set, else what `cgloop up` recorded for the embedded broker at
        exactly that address, else none (PLAINTEXT)."""
        explicit = KafkaClientSecurity(
            **{name: getattr(self, f"kafka_{name}") for name in KafkaClientSecurity.model_fields}
        )
        if explicit.is_set():
            return explicit
        record = embedded_client_file(self.state_dir)
        try:
            recorded = EmbeddedClient.model_validate_json(record.read_bytes())
        except PermissionError:
            embedded = f"{self.host}:{self.kafka_port}"
            if self.kafka_bootstrap is None and (bootstrap or embedded) == embedded:
                raise KafkaSecurityError(
                    f"the broker at {embedded} requires a login, and its credentials ({record}) "
                    "are readable only by the user who ran `cgloop up`"
                ) from None
            return explicit
        except (OSError, ValidationError, json.JSONDecodeError):
            return explicit
        if recorded.bootstrap == (bootstrap or self.bootstrap_servers):
            return recorded.security
        return explicit

    def kafka_config(self, bootstrap: str | None = None) -> dict[str, str]:
        """librdkafka properties for a client of `bootstrap`: the address and its security."""
        bootstrap = bootstrap or self.bootstrap_servers
        return {"bootstrap.servers": bootstrap, **self.kafka_security(bootstrap).properties()}


@cache
def settings() -> Settings:
    return Settings()


def kafka_client_config(bootstrap: str) -> dict[str, str]:
    """librdkafka properties for any cgloop client of `bootstrap` in this process."""
    return settings().kafka_config(bootstrap)


def export_kafka_security(s: Settings | None = None) -> None:
    """Put the Kafka client security of `s` (default: this process's settings, including the
    embedded broker's recorded credentials) into os.environ, so that every process started from
    now on, Rust producers included, logs in as this one does."""
    os.environ.update((s or settings()).kafka_security().env())
