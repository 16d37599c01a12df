"""Generator processes, started inside a lab namespace: `python -m cgloop.lab.traffic …`."""

from __future__ import annotations

import signal
import threading
from pathlib import Path
from typing import Annotated

import typer
from cgloop.lab.traffic import media, web
from cgloop.lab.traffic.profiles import StreamSpec

app = typer.Typer(no_args_is_help=True, pretty_exceptions_show_locals=False)


def _stop_on_signals() -> threading.Event:
    """SIGTERM (lab down, end of a fault) and SIGINT end a generator cleanly: results written."""
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    return stop


def _addr(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit():
        raise typer.BadParameter(f"{text!r} is not HOST:PORT")
    return host, int(port)


@app.command("media")
def media_cmd(
    bind: str = typer.Option(..., help="HOST:PORT to receive on (and send from)"),
    peer: str = typer.Option(..., help="HOST:PORT to send to"),
    send: str = typer.Option("", help="StreamSpec as JSON; empty: receive only"),
    duration: float = typer.Option(10.0, min=0.1),
    out: Annotated[Path | None, typer.Option(help="write OUT.npz and OUT.json")] = None,
    start_at_ns: Annotated[
        int | None, typer.Option(help="CLOCK_REALTIME ns at which to start sending")
    ] = None,
    start_file: Annotated[
        Path | None,
        typer.Option(help="wait (socket bound, OUT.ready created) until this file holds the "
                          "start, CLOCK_REALTIME ns; instead of --start-at-ns"),
    ] = None,
    start_offset_s: Annotated[
        float, typer.Option(min=0.0, help="with --start-file: begin this long after the start")
    ] = 0.0,
) -> None:
    if start_file is not None and start_at_ns is not None:
        raise typer.BadParameter("give --start-at-ns or --start-file, not both")
    spec = StreamSpec.model_validate_json(send) if send else None
    media.run_peer(
        _addr(bind),
        _addr(peer),
        spec,
        duration,
        out,
        start_at_ns=start_at_ns,
        stop=_stop_on_signals(),
        start_file=start_file,
        start_offset_s=start_offset_s,
    )


@app.command("web-server")
def web_server(bind: str = typer.Option(...)) -> None:
    web.serve(_addr(bind))


@app.command("web-client")
def web_client(
    server: str = typer.Option(...),
    duration: float = typer.Option(10.0, min=0.1),
    out: Annotated[Path | None, typer.Option(help="write OUT.json")] = None,
) -> None:
    web.fetch_loop(_addr(server), duration, out, stop=_stop_on_signals())


if __name__ == "__main__":
    app()
