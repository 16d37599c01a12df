"""`cgloop run`'s refusals, before anything starts."""

from __future__ import annotations

import os

import pytest
import typer
from cgloop.loop.commands import register
from typer.testing import CliRunner


@pytest.mark.skipif(os.geteuid() != 0, reason="cgloop run refuses non-root first (needs root)")
def test_an_out_directory_holding_an_earlier_run_is_refused_by_name(tmp_path):
    (tmp_path / "agent-journal-edge2.pb").write_bytes(b"")
    app = typer.Typer()
    register(app)

    @app.command("other")
    def other() -> None:  # a second command keeps `run` a subcommand
        pass

    got = CliRunner().invoke(app, ["run", "--out", str(tmp_path)])
    assert got.exit_code == 2, got.output
    assert "an earlier run (agent-journal-edge2.pb)" in " ".join(got.output.split())
