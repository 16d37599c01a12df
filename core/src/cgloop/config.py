"""Settings shared by every cgloop process, from the environment (CGLOOP_*) or defaults.

The embedded stack keeps everything it writes (Kafka log dirs, the store, logs, pid files) in
one project-local state folder, so a checkout never scatters files over the machine.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


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

    @property
    def bootstrap_servers(self) -> str:
        return self.kafka_bootstrap or f"{self.host}:{self.kafka_port}"

    @property
    def store_http_url(self) -> str:
        return self.store_url or f"http://{self.host}:{self.store_port}"


@cache
def settings() -> Settings:
    return Settings()
