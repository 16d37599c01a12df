"""The embedded stack from the command line: status, idempotent up, queries while the store is
held by its server process, and start-up refusals that say what is wrong."""

from __future__ import annotations

import json
import socket
import subprocess
from pathlib import Path

import clickhouse_connect
import pytest
from cgloop.testing import ROOT, free_port

MIGRATIONS = ROOT / "datasets/src/cgloop/datasets/migrations"

pytestmark = pytest.mark.kafka


def _env(settings, **extra: str) -> dict[str, str]:
    return {
        "CGLOOP_STATE_DIR": str(settings.state_dir),
        "CGLOOP_CACHE_DIR": str(settings.cache_dir),
        "CGLOOP_KAFKA_PORT": str(settings.kafka_port),
        "CGLOOP_KAFKA_CONTROLLER_PORT": str(settings.kafka_controller_port),
        "CGLOOP_STORE_PORT": str(settings.store_port),
        **extra,
    }


def _fresh_env(settings, tmp_path: Path, **extra: str) -> dict[str, str]:
    """A second stack that borrows the session's broker and owns a store of its own."""
    return _env(
        settings,
        CGLOOP_STATE_DIR=str(tmp_path / "state"),
        CGLOOP_KAFKA_BOOTSTRAP=settings.bootstrap_servers,
        CGLOOP_STORE_PORT=str(free_port()),
        **extra,
    )


def test_status_reports_a_healthy_stack(stack_settings, run_cgloop) -> None:
    result = run_cgloop("status", "--json", env=_env(stack_settings))
    assert result.returncode == 0, result.stderr
    status = json.loads(result.stdout)
    assert status["healthy"] is True
    assert {c["name"]: c["healthy"] for c in status["components"]} == {"kafka": True, "store": True}


def test_second_up_reports_the_running_stack(stack_settings, run_cgloop) -> None:
    before = json.loads(run_cgloop("status", "--json", env=_env(stack_settings)).stdout)
    result = run_cgloop("up", env=_env(stack_settings))
    assert result.returncode == 0, result.stderr
    assert "already running" in result.stdout
    after = json.loads(run_cgloop("status", "--json", env=_env(stack_settings)).stdout)
    assert [c["pid"] for c in after["components"]] == [c["pid"] for c in before["components"]]


def test_query_over_http_while_the_server_holds_the_store(stack_settings, run_cgloop) -> None:
    result = run_cgloop(
        "query",
        "SELECT name FROM system.databases ORDER BY name",
        "--format",
        "TSV",
        env=_env(stack_settings),
    )
    assert result.returncode == 0, result.stderr
    assert {"cgloop", "cgloop_meta"} <= set(result.stdout.split())
    client = clickhouse_connect.get_client(dsn=stack_settings.store_http_url)
    shipped = sorted(MIGRATIONS.glob("[0-9][0-9][0-9][0-9]_*.sql"))
    newest = int(shipped[-1].name[:4])
    assert client.query("SELECT max(version) FROM cgloop_meta.schema_migrations").result_rows == [
        (newest,)
    ]
    failed = run_cgloop("query", "SELECT * FROM nowhere", env=_env(stack_settings))
    assert failed.returncode == 1 and "UNKNOWN_TABLE" in failed.stderr


def test_migrations_reapply_as_a_no_op(stack_settings, run_cgloop, tmp_path: Path) -> None:
    path = str(tmp_path / "store")
    first = run_cgloop("store", "migrate", "--path", path)
    assert first.returncode == 0, first.stderr
    shipped = sorted(p.name for p in MIGRATIONS.glob("[0-9][0-9][0-9][0-9]_*.sql"))
    assert f"applied {len(shipped)} migration(s): {', '.join(shipped)}" in first.stdout
    again = run_cgloop("store", "migrate", "--path", path)
    assert again.returncode == 0 and "applied 0 migration(s)" in again.stdout


def test_a_changed_migration_is_refused(run_cgloop, tmp_path: Path) -> None:
    migrations = tmp_path / "migrations"
    migrations.mkdir()
    (migrations / "0001_first.sql").write_text("CREATE DATABASE IF NOT EXISTS m1;")
    path = str(tmp_path / "store")
    assert (
        run_cgloop("store", "migrate", "--path", path, "--migrations", str(migrations)).returncode
        == 0
    )
    (migrations / "0001_first.sql").write_text("CREATE DATABASE IF NOT EXISTS m2;")
    result = run_cgloop("store", "migrate", "--path", path, "--migrations", str(migrations))
    assert result.returncode == 2
    assert "0001_first.sql" in result.stderr and "changed after it was applied" in result.stderr


def test_a_broken_migration_stops_start_up_naming_file_and_error(
    stack_settings, run_cgloop, tmp_path
) -> None:
    migrations = tmp_path / "migrations"
    migrations.mkdir()
    (migrations / "0001_ok.sql").write_text("CREATE DATABASE IF NOT EXISTS cgloop;")
    (migrations / "0002_broken_table.sql").write_text(
        "CREATE TABLE cgloop.t (a UInt8) ENGIN = Memory;"
    )
    env = _fresh_env(stack_settings, tmp_path, CGLOOP_MIGRATIONS_DIR=str(migrations))
    result = run_cgloop("up", env=env)
    assert result.returncode == 1
    assert "0002_broken_table.sql" in result.stderr
    assert "Code: 62" in result.stderr and "Syntax error" in result.stderr
    # Nothing was left running, and the good migration before it was kept.
    status = json.loads(run_cgloop("status", "--json", env=env).stdout)
    store = next(c for c in status["components"] if c["name"] == "store")
    assert store["running"] is False
    migrate = run_cgloop(
        "store",
        "migrate",
        "--path",
        str(tmp_path / "state" / "store"),
        "--migrations",
        str(migrations),
    )
    assert "0002_broken_table.sql" in migrate.stderr and "0001_ok" not in migrate.stderr


def test_a_taken_port_is_named(stack_settings, run_cgloop, tmp_path: Path) -> None:
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        port = squatter.getsockname()[1]
        result = run_cgloop(
            "up", env=_fresh_env(stack_settings, tmp_path) | {"CGLOOP_STORE_PORT": str(port)}
        )
    assert result.returncode == 1
    assert f"port 127.0.0.1:{port} for the store is taken" in result.stderr
    assert "CGLOOP_STORE_PORT" in result.stderr


def test_a_full_disk_is_named(stack_settings, run_cgloop, tmp_path: Path) -> None:
    result = run_cgloop(
        "up", env=_fresh_env(stack_settings, tmp_path, CGLOOP_MIN_FREE_DISK_MB=str(1 << 40))
    )
    assert result.returncode == 1
    assert "disk full" in result.stderr and str(tmp_path / "state") in result.stderr


def test_missing_java_is_named(run_cgloop, tmp_path: Path) -> None:
    env = {
        "PATH": str(tmp_path / "empty-bin"),
        "CGLOOP_KAFKA_PORT": str(free_port()),
        "CGLOOP_KAFKA_CONTROLLER_PORT": str(free_port()),
        "CGLOOP_STORE_PORT": str(free_port()),
    }
    result = run_cgloop("up", env=env)
    assert result.returncode == 1
    assert "Java is missing" in result.stderr


def test_cli_lists_every_component_command() -> None:
    from cgloop.testing import cgloop_cmd

    result = subprocess.run([*cgloop_cmd("--help")], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0
    for command in ("up", "down", "status", "query", "store"):
        assert command in result.stdout
    assert "failed to load" not in result.stderr
