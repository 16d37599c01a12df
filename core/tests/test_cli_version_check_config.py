"""`cgloop --version` and `cgloop --check-config COMMAND ...` on the real command tree: the
check parses the command, its options and the CGLOOP_* settings as running it would, names what
is wrong, and never runs the command."""

from __future__ import annotations

from importlib.metadata import version

import pytest
import typer
from cgloop.cli.main import DISTRIBUTION, app, load_components
from typer.testing import CliRunner


@pytest.fixture(scope="module")
def cli() -> typer.Typer:
    load_components(app)
    return app


def run(cli: typer.Typer, *args: str, env: dict[str, str] | None = None):
    return CliRunner().invoke(cli, list(args), env=env, prog_name="cgloop", terminal_width=200)


def test_version_is_the_package_version(cli: typer.Typer) -> None:
    result = run(cli, "--version")
    assert result.exit_code == 0, result.output
    assert result.output.strip() == f"cgloop {version(DISTRIBUTION)}"


def test_check_config_accepts_a_valid_command_without_running_it(
    cli: typer.Typer, tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # `sink` would connect to Kafka and a store: the check must return at once, touching neither.
    monkeypatch.setenv("CGLOOP_STATE_DIR", str(tmp_path / "state"))
    result = run(cli, "--check-config", "sink", "--group", "g1", env={"CGLOOP_KAFKA_PORT": "1"})
    assert result.exit_code == 0, result.output
    assert "cgloop sink: configuration OK" in result.output
    assert not (tmp_path / "state").exists()


def test_check_config_resolves_nested_commands(cli: typer.Typer) -> None:
    result = run(cli, "--check-config", "policy", "run", "--agent", "n1=127.0.0.1:7443")
    assert result.exit_code == 0, result.output
    assert "cgloop policy run: configuration OK" in result.output


@pytest.mark.parametrize(
    ("args", "env", "named"),
    [
        (["sink", "--no-such-option"], {}, "--no-such-option"),
        (["sink", "--max-chunk-messages", "zero"], {}, "--max-chunk-messages"),
        (["sink"], {"CGLOOP_KAFKA_PORT": "not-a-port"}, "CGLOOP_KAFKA_PORT"),
        (["sink"], {"CGLOOP_KAFKA_BROKER_SECURITY": "open"}, "CGLOOP_KAFKA_BROKER_SECURITY"),
        (["no-such-command"], {}, "no-such-command"),
        ([], {}, "--check-config"),
    ],
    ids=["unknown-option", "bad-option-value", "bad-setting", "bad-choice", "command", "none"],
)
def test_check_config_names_what_is_wrong(
    cli: typer.Typer, args: list[str], env: dict[str, str], named: str
) -> None:
    result = run(cli, "--check-config", *args, env=env)
    assert result.exit_code == 2, result.output
    assert "No such option: --check-config" not in result.output
    assert named in result.output


def test_check_config_names_a_bad_kafka_security_setting(cli: typer.Typer) -> None:
    from cgloop.config import KafkaSecurityError

    result = run(cli, "--check-config", "sink", env={"CGLOOP_KAFKA_SECURITY_PROTOCOL": "FOO"})
    # main() turns this into one line and exit 2; CliRunner sees the exception itself.
    assert isinstance(result.exception, KafkaSecurityError), result.output
    assert "CGLOOP_KAFKA_SECURITY_PROTOCOL" in str(result.exception)
