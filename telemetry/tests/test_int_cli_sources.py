"""`cgloop telemetry int-collector` listens on loopback unless told, and listening beyond it
needs the report sources named (issue 17, finding 3: it bound 0.0.0.0:32766 for anyone)."""

from __future__ import annotations

from pathlib import Path

from cgloop.telemetry.int_cli import collector_command


def test_the_wrapper_listens_on_loopback_by_default(run_cgloop) -> None:
    out = run_cgloop("telemetry", "int-collector", "--help", env={"COLUMNS": "200"})
    assert out.returncode == 0, out.stderr
    assert "127.0.0.1:32766" in out.stdout and "0.0.0.0" not in out.stdout, out.stdout
    assert "--allow-source" in out.stdout and "--allow-any-source" in out.stdout


def test_allowed_sources_reach_the_collector_command() -> None:
    cmd = collector_command(
        "0.0.0.0:32766", None, None, None, [], binary=Path("c"),
        allow_sources=["10.0.0.0/24", "192.0.2.7"],
    )
    assert cmd == [
        "c", "run", "--listen", "0.0.0.0:32766",
        "--allow-source", "10.0.0.0/24", "--allow-source", "192.0.2.7",
    ]
    cmd = collector_command("0.0.0.0:1", None, None, None, [], binary=Path("c"),
                            allow_any_source=True)
    assert cmd[-1] == "--allow-any-source"


def test_a_public_listener_without_sources_is_refused_with_the_flag_to_use(run_cgloop) -> None:
    out = run_cgloop(
        "telemetry", "int-collector", "--no-kafka", "--duration", "0",
        env={"CGLOOP_INT_LISTEN": "0.0.0.0:0"}, timeout=60,
    )
    assert out.returncode != 0
    assert "--allow-source" in out.stderr and "0.0.0.0:0" in out.stderr, out.stderr
    out = run_cgloop(
        "telemetry", "int-collector", "--no-kafka", "--duration", "0", "--workers", "1",
        env={
            "CGLOOP_INT_LISTEN": "0.0.0.0:0",
            "CGLOOP_INT_ALLOW_SOURCE": "192.0.2.0/24 10.1.0.0/16",
        },
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert '"allow_sources":["192.0.2.0/24","10.1.0.0/16"]' in out.stderr, out.stderr
