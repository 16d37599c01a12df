"""`cgloop actuators …` commands."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console


def _client():  # imported lazily so `cgloop --help` stays fast
    from cgloop.actuators.onos import OnosClient, OnosSettings

    return OnosClient(OnosSettings())


def _print(obj: object) -> None:
    Console().print_json(json.dumps(obj, default=str))


def register(app: typer.Typer) -> None:
    sub = typer.Typer(
        help="Actuators: the ONOS driver and node-agent clients", no_args_is_help=True
    )
    onos = typer.Typer(
        help="ONOS REST driver (settings from CGLOOP_ONOS_URL, _USERNAME, _PASSWORD, _APP_NAME)",
        no_args_is_help=True,
    )
    sub.add_typer(onos, name="onos")
    app.add_typer(sub, name="actuators")

    @onos.command("devices")
    def devices() -> None:
        """List devices."""
        with _client() as c:
            _print([d.model_dump(by_alias=True) for d in c.devices()])

    @onos.command("ports")
    def ports(device: str) -> None:
        """List the ports of DEVICE."""
        with _client() as c:
            _print([p.model_dump(by_alias=True) for p in c.ports(device)])

    @onos.command("hosts")
    def hosts() -> None:
        """List hosts."""
        with _client() as c:
            _print([h.model_dump(by_alias=True) for h in c.hosts()])

    @onos.command("links")
    def links() -> None:
        """List links."""
        with _client() as c:
            _print([lk.model_dump(by_alias=True) for lk in c.links()])

    @onos.command("register")
    def register_app() -> None:
        """Register the configured application name and print its id."""
        with _client() as c:
            _print(c.register_app().model_dump())

    @onos.command("flows")
    def flows() -> None:
        """List the flows of the configured application."""
        with _client() as c:
            _print(c.flows())

    @onos.command("install-flows")
    def install_flows(
        file: Annotated[Path, typer.Argument(help="JSON: one flow rule or a list (ONOS names)")],
    ) -> None:
        """Validate and install flow rules (batch, retry-safe)."""
        from cgloop.actuators.onos import FlowRule
        from pydantic import ValidationError

        try:
            data = json.loads(file.read_text())
            items = data if isinstance(data, list) else [data]
            rules = [FlowRule.model_validate(r) for r in items]
        except (OSError, ValueError, ValidationError) as e:
            raise typer.BadParameter(f"{file}: {e}") from e
        with _client() as c:
            _print([r.model_dump() for r in c.install_flows(rules)])
