"""`cgloop telemetry probe` (the live XDP/tc flow probe) and `cgloop telemetry pcap` (its
offline twin), wrapping the Rust `cgloop-probe` binary.

Both produce `cgloop.v1.FlowRecordBatch` messages. The binary writes them length-delimited
(varint length, then the message) to a file or stdout; this module reads that stream and
renders it as a table (per-flow totals), JSON lines (one FlowRecord per line, proto field names,
bytes as base64, as `google.protobuf.json_format` maps them) or the raw stream (`proto`).
"""

from __future__ import annotations

import ipaddress
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import IO, Annotated

import typer
from cgloop.binaries import BinaryNotFound, find_binary
from cgloop.v1.flow_pb2 import FlowRecord, FlowRecordBatch
from google.protobuf import json_format
from rich.console import Console
from rich.table import Table

BINARY = "cgloop-probe"
PASSTHROUGH = {"allow_extra_args": True, "ignore_unknown_options": True}
PROTOCOLS = {1: "icmp", 6: "tcp", 17: "udp", 58: "icmp6"}


class OutputFormat(StrEnum):
    table = "table"
    json = "json"
    proto = "proto"


class ProbeError(RuntimeError):
    """The binary failed; the message is its own error text."""


def probe_binary() -> Path:
    try:
        return find_binary(BINARY)
    except BinaryNotFound as exc:
        raise typer.BadParameter(str(exc)) from None


def read_batches(stream: IO[bytes]) -> Iterator[FlowRecordBatch]:
    """Length-delimited FlowRecordBatch messages from a binary stream, until EOF."""
    while True:
        length, shift = 0, 0
        while True:
            byte = stream.read(1)
            if not byte:
                if shift:
                    raise ProbeError("record stream ends inside a length prefix")
                return
            length |= (byte[0] & 0x7F) << shift
            shift += 7
            if not byte[0] & 0x80:
                break
            if shift > 63:
                raise ProbeError("record stream has a malformed length prefix")
        payload = stream.read(length)
        if len(payload) != length:
            raise ProbeError(f"record stream truncated: {len(payload)} of {length} bytes")
        yield FlowRecordBatch.FromString(payload)


def record_to_dict(record: FlowRecord) -> dict:
    """A FlowRecord as proto3 JSON with the .proto field names and zero values kept."""
    return json_format.MessageToDict(
        record, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
    )


@dataclass
class PcapResult:
    records: list[FlowRecord] = field(default_factory=list)
    summary: dict[str, int] = field(default_factory=dict)


def pcap_command(path: Path, extra: list[str], binary: Path | None = None) -> list[str]:
    return [str(binary or find_binary(BINARY)), "pcap", str(path), "--output", "-", *extra]


def run_pcap(path: Path, *extra: str, binary: Path | None = None) -> PcapResult:
    """Flow records of a capture, computed by the probe's twin (see `cgloop-probe pcap --help`)."""
    proc = subprocess.run(pcap_command(path, list(extra), binary), capture_output=True, check=False)
    if proc.returncode != 0:
        raise ProbeError(proc.stderr.decode(errors="replace").strip())
    import io

    result = PcapResult()
    for batch in read_batches(io.BytesIO(proc.stdout)):
        result.records.extend(batch.records)
    result.summary = _summary(proc.stderr.decode(errors="replace"))
    return result


def _summary(stderr: str) -> dict[str, int]:
    """The binary's last stderr line is a JSON object of counters."""
    for line in reversed(stderr.strip().splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    return {}


def address(raw: bytes) -> str:
    return str(ipaddress.ip_address(raw)) if len(raw) in (4, 16) else raw.hex()


@dataclass
class FlowTotal:
    packets: int = 0
    bytes: int = 0
    records: int = 0
    ce: int = 0
    ect1: int = 0
    lost: int = 0
    jitter_ns: int = 0
    first_ns: int = 0
    last_ns: int = 0


def flow_totals(records: list[FlowRecord]) -> dict[tuple, FlowTotal]:
    """Per-flow sums over interval records, keyed by five-tuple, direction, VLAN, interface."""
    totals: dict[tuple, FlowTotal] = {}
    for r in records:
        t = r.five_tuple
        key = (
            address(t.src_addr),
            t.src_port,
            address(t.dst_addr),
            t.dst_port,
            t.ip_protocol,
            r.direction,
            r.vlan_id,
            r.interface_name,
        )
        total = totals.setdefault(key, FlowTotal(first_ns=r.first_seen_ns))
        total.packets += r.packets
        total.bytes += r.bytes
        total.records += 1
        total.ce += r.ecn_ce_packets
        total.ect1 += r.ecn_ect1_packets
        total.last_ns = max(total.last_ns, r.last_seen_ns)
        if r.HasField("rtp"):
            total.lost += r.rtp.lost_packets
            total.jitter_ns = r.rtp.jitter_ns
    return totals


def render_table(records: list[FlowRecord], console: Console, limit: int) -> None:
    totals = sorted(flow_totals(records).items(), key=lambda kv: -kv[1].bytes)
    table = Table(title=f"{len(totals)} flows, {len(records)} records (largest first)")
    for col in ("source", "destination", "proto", "packets", "bytes", "seconds", "ECT(1)", "CE"):
        table.add_column(col, justify="right" if col not in ("source", "destination") else "left")
    table.add_column("RTP lost", justify="right")
    table.add_column("jitter ms", justify="right")
    for key, t in totals[:limit]:
        src, sport, dst, dport, proto = key[:5]
        rtp = t.lost or t.jitter_ns
        table.add_row(
            f"{src}:{sport}",
            f"{dst}:{dport}",
            PROTOCOLS.get(proto, str(proto)),
            str(t.packets),
            str(t.bytes),
            f"{(t.last_ns - t.first_ns) / 1e9:.3f}",
            str(t.ect1),
            str(t.ce),
            str(t.lost) if rtp else "",
            f"{t.jitter_ns / 1e6:.3f}" if rtp else "",
        )
    console.print(table)


def register(app: typer.Typer) -> None:
    @app.command("pcap", context_settings=PASSTHROUGH)
    def pcap(
        ctx: typer.Context,
        file: Annotated[Path, typer.Argument(help="pcap or pcapng capture (.gz accepted).")],
        format: Annotated[
            OutputFormat, typer.Option("--format", "-f", help="table, json (lines) or proto.")
        ] = OutputFormat.table,
        interval_ms: Annotated[
            int, typer.Option(help="Record interval on the capture clock; 0 = one per flow.")
        ] = 100,
        kafka: Annotated[
            str | None, typer.Option(help="Also produce the records to cgloop.flows.v1 here.")
        ] = None,
        limit: Annotated[int, typer.Option(help="Rows of the table.")] = 40,
    ) -> None:
        """Flow records from a capture, exactly as the XDP probe would export them.

        Other options go to `cgloop-probe pcap` unchanged (--burst-gap-us, --no-rtp,
        --idle-timeout-ms, --direction, --source-id ...)."""
        if not file.is_file():
            raise typer.BadParameter(f"{file}: no such file")
        extra = ["--interval-ms", str(interval_ms), *ctx.args]
        if kafka:
            extra += ["--kafka", kafka]
        cmd = pcap_command(file, extra, probe_binary())
        if format is OutputFormat.proto:
            raise typer.Exit(subprocess.call(cmd))
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        assert proc.stdout is not None and proc.stderr is not None
        records: list[FlowRecord] = []
        for batch in read_batches(proc.stdout):
            if format is OutputFormat.json:
                for r in batch.records:
                    sys.stdout.write(json.dumps(record_to_dict(r)) + "\n")
            else:
                records.extend(batch.records)
        stderr = proc.stderr.read().decode(errors="replace")
        if proc.wait() != 0:
            Console(stderr=True).print(f"[red]{stderr.strip()}[/]")
            raise typer.Exit(1)
        if format is OutputFormat.table:
            console = Console()
            render_table(records, console, limit)
            summary = _summary(stderr)
            skipped = {k: v for k, v in summary.items() if v and k not in _FATES}
            console.print(
                f"packets {summary.get('packets', 0)}, accounted {summary.get('accounted', 0)}"
                + (f", not accounted: {skipped}" if skipped else "")
            )

    @app.command("probe", context_settings=PASSTHROUGH)
    def probe(
        ctx: typer.Context,
        iface: Annotated[list[str], typer.Option("--iface", "-i", help="Interface(s).")],
        kafka: Annotated[
            str | None, typer.Option(help="Kafka bootstrap; default: cgloop's settings.")
        ] = None,
        no_kafka: Annotated[bool, typer.Option(help="Do not produce to Kafka.")] = False,
    ) -> None:
        """Run the XDP/tc flow probe on interfaces (needs root; see `cgloop-probe run --help`
        for --function, --interval-ms, --max-flows, --metrics-addr, --pin-dir ...)."""
        cmd = [str(probe_binary()), "run"]
        for name in iface:
            cmd += ["--iface", name]
        if not no_kafka:
            if kafka is None:
                from cgloop.config import settings

                kafka = settings().bootstrap_servers
            cmd += ["--kafka", kafka]
        cmd += ctx.args
        # Replace this process so SIGTERM reaches the probe, which then detaches cleanly.
        os.execv(cmd[0], cmd)


_FATES = {"packets", "accounted", "flows_created", "records", "rtp_confirmed"}
