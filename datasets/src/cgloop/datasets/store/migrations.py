"""Versioned schema migrations: plain SQL files applied once, in order, recorded in a table.

Files are named `NNNN_description.sql`. ClickHouse has no transactional DDL, so a migration is
recorded only after all its statements succeeded, and statements should be idempotent
(`IF NOT EXISTS`) so a migration interrupted halfway can simply run again. A file changed after
it was applied is refused: write a new migration instead.

Cluster mode (`cluster=`, the setting CGLOOP_STORE_CLUSTER): the same files rendered for a
ClickHouse cluster by `cgloop.datasets.store.cluster` (replicated local tables, Distributed
tables, ON CLUSTER DDL), run through any one node. The record is then a table every node holds
whole (one replication group across the cluster), read after syncing with the other replicas
and written with an insert token per migration, so every node answers the same and two
migrators racing record a migration once. It keeps the file's checksum, as single-node mode.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from importlib.resources import files
from pathlib import Path

from cgloop.datasets.store.cluster import (
    ClusterRenderer,
    ClusterRenderError,
    cluster_wide_table,
)
from cgloop.datasets.store.sql import split_statements
from clickhouse_connect.driver.client import Client

META_DB = "cgloop_meta"
MIGRATIONS_TABLE = f"{META_DB}.schema_migrations"
_NAME = re.compile(r"^(\d{4})_[a-z0-9_]+\.sql$")


class MigrationError(RuntimeError):
    """A migration could not be applied; the message names the file and the ClickHouse error."""


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    sql: str

    @property
    def checksum(self) -> str:
        return hashlib.sha256(self.sql.encode()).hexdigest()


def default_migrations_dir() -> Path:
    return Path(str(files("cgloop.datasets").joinpath("migrations")))


def discover(directory: Path) -> list[Migration]:
    migrations: list[Migration] = []
    for path in sorted(directory.glob("*.sql")):
        match = _NAME.match(path.name)
        if not match:
            raise MigrationError(f"{path}: migration files are named NNNN_lowercase_words.sql")
        migrations.append(Migration(int(match.group(1)), path.name, path.read_text()))
    versions = [m.version for m in migrations]
    if len(set(versions)) != len(versions):
        raise MigrationError(f"{directory}: two migrations share a version number: {versions}")
    return migrations


_RECORD_COLUMNS = (
    "version UInt32, name String, checksum String, applied_at DateTime64(3) DEFAULT now64(3)"
)


def _ensure_table(client: Client, cluster: str | None = None) -> None:
    if cluster:
        for statement in cluster_wide_table(cluster, MIGRATIONS_TABLE, _RECORD_COLUMNS, "version"):
            client.command(statement)
        return
    client.command(f"CREATE DATABASE IF NOT EXISTS {META_DB}")
    client.command(
        f"CREATE TABLE IF NOT EXISTS {MIGRATIONS_TABLE} ("
        " version UInt32, name String, checksum String,"
        " applied_at DateTime64(3) DEFAULT now64(3)"
        ") ENGINE = MergeTree ORDER BY version"
    )


def applied(client: Client, cluster: str | None = None) -> dict[int, tuple[str, str]]:
    """version -> (name, checksum) of every applied migration."""
    _ensure_table(client, cluster)
    final = ""
    if cluster:  # what the other replicas recorded first, then one row a version
        client.command(f"SYSTEM SYNC REPLICA {MIGRATIONS_TABLE}")
        final = " FINAL"
    query = f"SELECT version, name, checksum FROM {MIGRATIONS_TABLE}{final}"
    rows = client.query(query).result_rows
    return {int(v): (n, c) for v, n, c in rows}


def migrate(client: Client, directory: Path | None = None, cluster: str | None = None) -> list[str]:
    """Apply every pending migration in order; return the names applied (empty: nothing to do).
    `cluster`: render them for that ClickHouse cluster (see the module's docstring)."""
    directory = directory or default_migrations_dir()
    try:
        renderer = ClusterRenderer(cluster) if cluster else None
    except ClusterRenderError as exc:
        raise MigrationError(str(exc)) from exc
    done = applied(client, cluster)
    newly: list[str] = []
    for m in discover(directory):
        # Every migration goes through the renderer, applied or not: it learns the tables.
        try:
            statements = (
                [r.sql for r in renderer.render_script(m.sql, m.name)]
                if renderer
                else split_statements(m.sql)
            )
        except ClusterRenderError as exc:
            raise MigrationError(f"{directory / m.name}: cluster {cluster}: {exc}") from exc
        if m.version in done:
            name, checksum = done[m.version]
            if checksum != m.checksum:
                raise MigrationError(
                    f"{directory / m.name}: changed after it was applied as {name} "
                    f"(checksum {checksum[:12]} -> {m.checksum[:12]}); add a new migration instead"
                )
            continue
        for i, statement in enumerate(statements, start=1):
            try:
                client.command(statement)
            except Exception as exc:
                raise MigrationError(
                    f"migration {directory / m.name} failed at statement {i}: {exc}"
                ) from exc
        client.insert(
            MIGRATIONS_TABLE,
            [[m.version, m.name, m.checksum]],
            column_names=["version", "name", "checksum"],
            settings={"insert_deduplication_token": f"migration/{m.version}/{m.checksum}"}
            if cluster
            else None,
        )
        newly.append(m.name)
    return newly
