"""`cgloop telemetry int-gen|int-collector` reach the Rust binary and pass options through;
bad options are rejected with a message naming them."""

from __future__ import annotations

import json

from cgloop.telemetry.int_cli import collector_binary, collector_command


def test_int_gen_describe_through_the_cli(run_cgloop) -> None:
    out = run_cgloop("telemetry", "int-gen", "--describe", "--flows", "2", "--hops", "3")
    assert out.returncode == 0, out.stderr
    described = json.loads(out.stdout)
    assert [f["path"] for f in described["flows"]] == [[1, 2, 3], [1, 2, 3]]
    assert described["config"]["format"] == "V20"


def test_bad_generator_option_is_named(run_cgloop) -> None:
    out = run_cgloop("telemetry", "int-gen", "--describe", "--format", "v9")
    assert out.returncode != 0
    assert "unknown report format" in out.stderr and "v9" in out.stderr


def test_collector_command_line() -> None:
    cmd = collector_command("127.0.0.1:9", "k:1", 2, 1.5, ["--hop-records"])
    assert cmd[0] == str(collector_binary())
    assert cmd[1:] == [
        *("run", "--listen", "127.0.0.1:9", "--kafka", "k:1"),
        *("--workers", "2", "--duration", "1.5", "--hop-records"),
    ]
