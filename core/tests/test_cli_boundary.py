"""The `cgloop` error boundary: bad input is one line and exit 1, a bug one line and exit 70,
and the traceback only with --debug or CGLOOP_DEBUG=1."""

from __future__ import annotations

from pathlib import Path

import pytest
import typer
from cgloop.cli.main import BUG_EXIT, DEBUG_ENV, INPUT_ERROR_EXIT, ErrorBoundary
from cgloop.errors import CgloopError
from pydantic import BaseModel
from typer.testing import CliRunner


class StackOperationError(RuntimeError):
    __module__ = "cgloop.stack.stack"  # as if raised by the stack component


class Port(BaseModel):
    port: int


def make_app() -> typer.Typer:
    app = typer.Typer(cls=ErrorBoundary)

    @app.callback()
    def root(debug: bool = typer.Option(False, "--debug", help="tracebacks")) -> None:
        """Test root."""

    @app.command()
    def read(path: Path) -> None:
        """Reads a file as text."""
        path.read_text()

    @app.command()
    def port(value: str) -> None:
        """Validates a value."""
        Port.model_validate({"port": value})

    @app.command()
    def refuse() -> None:
        """Raises the project's own error."""
        raise CgloopError("thing.yaml:3: colour: not a colour")

    @app.command()
    def down() -> None:
        """A deliberate operational failure of a cgloop module."""
        raise StackOperationError("the broker did not stop within 10 s")

    @app.command()
    def boom() -> None:
        """A bug."""
        raise RuntimeError("list index went wrong")

    @app.command()
    def fine() -> None:
        """Exits on its own terms."""
        raise typer.Exit(3)

    return app


@pytest.fixture(autouse=True)
def no_debug(monkeypatch):
    monkeypatch.delenv(DEBUG_ENV, raising=False)


def run(*args: str):
    return CliRunner().invoke(make_app(), list(args))


def test_input_errors_are_one_line_naming_the_input(tmp_path: Path) -> None:
    latin = tmp_path / "l.txt"
    latin.write_bytes(b"caf\xe9")
    for args, line in [
        (["read", str(tmp_path / "missing")], f"error {tmp_path / 'missing'}: No such file or "
         "directory"),
        (["read", str(latin)], "error input is not utf-8 text (byte e9 at offset 3)"),
        (["port", "eighty"], "error invalid Port: port: Input should be a valid integer, unable "
         "to parse string as an integer"),
        (["refuse"], "error thing.yaml:3: colour: not a colour"),
        (["down"], "error the broker did not stop within 10 s"),
    ]:
        res = run(*args)
        assert res.exit_code == INPUT_ERROR_EXIT, res.output
        assert res.stderr.splitlines() == [line]
        assert "Traceback" not in res.output


def test_a_bug_is_one_line_and_its_traceback_needs_debug(monkeypatch) -> None:
    res = run("boom")
    assert res.exit_code == BUG_EXIT
    assert res.stderr.splitlines() == [
        f"internal error RuntimeError: list index went wrong (run with --debug or {DEBUG_ENV}=1 "
        "for the traceback)"
    ]
    assert isinstance(run("--debug", "boom").exception, RuntimeError)
    monkeypatch.setenv(DEBUG_ENV, "1")
    assert isinstance(run("boom").exception, RuntimeError)
    assert isinstance(run("refuse").exception, CgloopError)


def test_a_command_s_own_exit_passes_through() -> None:
    res = run("fine")
    assert res.exit_code == 3 and res.stderr == ""
