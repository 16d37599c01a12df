"""`cgloop telemetry int-collector` and `cgloop telemetry int-gen`: thin wrappers around the Rust
`cgloop-int-collector` binary (`run` and `gen`), with the Kafka bootstrap taken from cgloop's
settings. Options not listed here are passed through to the binary unchanged (see
`cgloop-int-collector run --help` / `gen --help`)."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated

import typer
from cgloop.binaries import BinaryNotFound, find_binary

BINARY = "cgloop-int-collector"
PASSTHROUGH = {"allow_extra_args": True, "ignore_unknown_options": True}


def collector_binary() -> Path:
    try:
        return find_binary(BINARY)
    except BinaryNotFound as exc:
        raise typer.BadParameter(str(exc)) from None


def collector_command(
    listen: str,
    kafka: str | None,
    workers: int | None,
    duration: float | None,
    extra: list[str],
    binary: Path | None = None,
    allow_sources: Sequence[str] = (),
    allow_any_source: bool = False,
) -> list[str]:
    """The `run` command line for the Rust collector."""
    cmd = [str(binary or collector_binary()), "run", "--listen", listen]
    for source in allow_sources:
        cmd += ["--allow-source", source]
    if allow_any_source:
        cmd.append("--allow-any-source")
    if kafka:
        cmd += ["--kafka", kafka]
    if workers:
        cmd += ["--workers", str(workers)]
    if duration is not None:
        cmd += ["--duration", str(duration)]
    return cmd + extra


def _exec(cmd: list[str]) -> None:
    # Replace this process when possible so signals reach the collector directly.
    if hasattr(os, "execv"):
        os.execv(cmd[0], cmd)
    raise typer.Exit(subprocess.call(cmd))


def register(app: typer.Typer) -> None:
    @app.command("int-collector", context_settings=PASSTHROUGH)
    def int_collector(
        ctx: typer.Context,
        listen: Annotated[
            str,
            typer.Option(
                envvar="CGLOOP_INT_LISTEN",
                help="UDP address for telemetry reports: loopback unless set; any other address "
                "needs --allow-source or --allow-any-source.",
            ),
        ] = "127.0.0.1:32766",
        allow_source: Annotated[
            list[str] | None,
            typer.Option(
                envvar="CGLOOP_INT_ALLOW_SOURCE",
                help="Accept reports only from this address or CIDR (repeatable; the variable "
                "takes a space-separated list); others are dropped unparsed and counted.",
            ),
        ] = None,
        allow_any_source: Annotated[
            bool,
            typer.Option(
                envvar="CGLOOP_INT_ALLOW_ANY_SOURCE",
                help="Accept reports from anyone who can reach a non-loopback --listen (INT "
                "reports carry no integrity check).",
            ),
        ] = False,
        kafka: Annotated[
            bool, typer.Option(help="Export to the stack's Kafka (cgloop.int.v1).")
        ] = True,
        workers: Annotated[
            int | None, typer.Option(help="Workers (default: one per core).")
        ] = None,
        duration: Annotated[float | None, typer.Option(help="Stop after N seconds.")] = None,
    ) -> None:
        """Collect INT telemetry reports (v0.5, v1.0, v2.0) and export changes to Kafka."""
        bootstrap = None
        if kafka:
            from cgloop.config import settings

            bootstrap = settings().bootstrap_servers
        _exec(
            collector_command(
                listen, bootstrap, workers, duration, list(ctx.args),
                allow_sources=allow_source or (), allow_any_source=allow_any_source,
            )
        )

    @app.command("int-gen", context_settings=PASSTHROUGH)
    def int_gen(ctx: typer.Context) -> None:
        """Send a spec-conformant INT report stream (options: `cgloop-int-collector gen --help`),
        e.g. `--target 127.0.0.1:32766 --format v2.0 --flows 8 --hops 4 --rate 1000`."""
        _exec([str(collector_binary()), "gen", *ctx.args])
