"""FlowRecords from captures, and the keys analytics groups them by.

Packets become records in ONE place, the probe's Rust pcap twin (telemetry/probe; the Python
module `cgloop.pcaprecords`): the records analytics trains on, reads from pcaps and imports are
exactly those the deployed probe exports (same parser, RTP probation and 64-bit sequence window,
burst gap, idle timeouts, sweeps). Nothing here accounts packets.
"""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Iterable, Iterator
from pathlib import Path

from cgloop import pcaprecords
from cgloop.v1.common_pb2 import FiveTuple
from cgloop.v1.flow_pb2 import FlowRecord, FlowRecordBatch

NS = 1_000_000_000
DEFAULT_INTERVAL_NS = pcaprecords.DEFAULT_INTERVAL_MS * 1_000_000

TupleKey = tuple[bytes, bytes, int, int, int]

# A damaged capture (packet index and byte offset in `.packet` / `.offset` and the text); a
# ValueError, as is a file that is no capture at all.
CaptureError = pcaprecords.CaptureError


def addr_text(raw: bytes) -> str:
    try:
        return str(ipaddress.ip_address(raw))
    except ValueError:
        return raw.hex()


def tuple_key(ft: FiveTuple) -> TupleKey:
    return (ft.src_addr, ft.dst_addr, ft.src_port, ft.dst_port, ft.ip_protocol)


def conversation_key(ft: FiveTuple) -> TupleKey:
    """The same key for both directions of a flow: the smaller endpoint first."""
    a, b = (ft.src_addr, ft.src_port), (ft.dst_addr, ft.dst_port)
    (sa, sp), (da, dp) = (a, b) if a <= b else (b, a)
    return (sa, da, sp, dp, ft.ip_protocol)


def node_of(source_id: str) -> str:
    """The node a record was observed on, from its producer id `<node>/<daemon>` (the loop
    starts the probe as `<node>/flow-probe`, the node agent as `<node>/node-agent`); "" for an
    id without a node part."""
    node, sep, _ = source_id.partition("/")
    return node if sep else ""


def observation_labels(r: FlowRecord) -> dict[str, str]:
    """Where a flow record was observed: `node_id` (from the header's source id) and
    `interface` (the probe's interface), the labels per-edge policies match and fill targets
    from. Empty values are left out."""
    out = {"node_id": node_of(r.header.source_id), "interface": r.interface_name}
    return {k: v for k, v in out.items() if v}


def flow_label(ft: FiveTuple) -> str:
    proto = {6: "tcp", 17: "udp", 1: "icmp", 58: "icmpv6"}.get(ft.ip_protocol, str(ft.ip_protocol))
    return (
        f"{proto} {addr_text(ft.src_addr)}:{ft.src_port} -> {addr_text(ft.dst_addr)}:{ft.dst_port}"
    )


def read_capture(
    capture: str | os.PathLike[str] | bytes,
    interval_ns: int = DEFAULT_INTERVAL_NS,
    source_id: str | None = None,
    name: str | None = None,
) -> tuple[list[FlowRecord], dict[str, int]]:
    """Every FlowRecord the probe would export for a capture (path or bytes; pcap, pcapng,
    gzip), in export order, and the twin's counters. The probe's settings otherwise.

    Raises CaptureError (a ValueError naming the packet and byte offset) for a damaged capture,
    ValueError for what is no capture, OSError when the file cannot be read."""
    if isinstance(capture, str):
        capture = Path(capture)
    if interval_ns % 1_000_000:
        raise ValueError(f"interval {interval_ns} ns: the probe sweeps in whole milliseconds")
    batch, counters = pcaprecords.read(
        capture, interval_ms=interval_ns // 1_000_000, source_id=source_id, name=name
    )
    return list(FlowRecordBatch.FromString(batch).records), counters


def records_from_pcap(
    capture: str | os.PathLike[str] | bytes,
    interval_ns: int = DEFAULT_INTERVAL_NS,
    source_id: str | None = None,
) -> list[FlowRecord]:
    """`read_capture` without the counters."""
    return read_capture(capture, interval_ns, source_id)[0]


def sweeps(records: Iterable[FlowRecord]) -> Iterator[list[FlowRecord]]:
    """Records (in export order) in the batches the probe exports: one per sweep, whose records
    share the header timestamp. Feed the engine these, as the worker gets them from Kafka: a
    conversation classified between the records of one sweep sees one direction's last interval
    and not the other's."""
    batch: list[FlowRecord] = []
    for r in records:
        if batch and r.header.timestamp_ns != batch[0].header.timestamp_ns:
            yield batch
            batch = []
        batch.append(r)
    if batch:
        yield batch
