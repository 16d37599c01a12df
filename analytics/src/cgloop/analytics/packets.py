"""Packets described in Python (synthetic sessions, expanded dataset rows) as a capture.

Generated traffic takes the same path as a real capture: its packets are written as a pcap
(raw IP link type, nanosecond timestamps, headers only: the record length keeps each packet's
real size) and read by the probe's pcap twin (`records.read_capture`). Nothing is accounted
here; this only writes headers.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable
from dataclasses import dataclass

from cgloop.analytics.records import DEFAULT_INTERVAL_NS, TupleKey, read_capture
from cgloop.v1.flow_pb2 import FlowRecord

# pcap global header: nanosecond magic, version 2.4, snaplen 65535, LINKTYPE_RAW (101).
_PCAP_HEADER = struct.pack("<IHHiIII", 0xA1B23C4D, 2, 4, 0, 0, 65535, 101)
_RECORD = struct.Struct("<IIII")
_IPV4 = struct.Struct("!BBHHHBBH4s4s")
_IPV6 = struct.Struct("!IHBB16s16s")
_UDP = struct.Struct("!HHHH")
_TCP = struct.Struct("!HHIIBBHHH")
_RTP = struct.Struct("!BBHII")


@dataclass(slots=True)
class Packet:
    """One packet to generate: its flow, layer-3 length, IP ToS bits and TCP flags, and an RTP
    header when it carries one."""

    ts_ns: int
    key: TupleKey  # (src addr, dst addr, src port, dst port, IP protocol); 4- or 16-byte addrs
    length: int  # layer 3 bytes
    ecn: int = 0
    dscp: int = 0
    tcp_flags: int = 0
    rtp_ssrc: int | None = None
    rtp_pt: int = 0
    rtp_seq: int = 0
    rtp_ts: int = 0
    rtp_marker: bool = False


def _headers(p: Packet) -> tuple[bytes, int]:
    """The packet's headers and its layer-3 length, raised to what the headers need (a dataset
    row's mean size can be below a TCP header)."""
    src, dst, sport, dport, proto = p.key
    if proto == 6:
        l4 = _TCP.pack(sport, dport, 0, 0, 5 << 4, p.tcp_flags & 0xFF, 65535, 0, 0)
    elif proto == 17:
        rtp = b""
        if p.rtp_ssrc is not None:
            rtp = _RTP.pack(
                0x80, (0x80 if p.rtp_marker else 0) | (p.rtp_pt & 0x7F), p.rtp_seq & 0xFFFF,
                p.rtp_ts & 0xFFFFFFFF, p.rtp_ssrc & 0xFFFFFFFF,
            )
        l4 = _UDP.pack(sport, dport, 0, 0) + rtp  # length filled below
    else:
        l4 = b""
    tos = ((p.dscp & 0x3F) << 2) | (p.ecn & 3)
    ip_len = 20 if len(src) == 4 else 40
    length = max(p.length, ip_len + len(l4))
    if proto == 17:
        l4 = l4[:4] + struct.pack("!H", length - ip_len) + l4[6:]
    if len(src) == 4:
        ip = _IPV4.pack(0x45, tos, length, 0, 0, 64, proto, 0, src, dst)
    else:
        ip = _IPV6.pack((6 << 28) | (tos << 20), length - 40, proto, 64, src, dst)
    return ip + l4, length


def to_pcap(packets: Iterable[Packet]) -> bytes:
    """A pcap of the packets in time order (headers captured, real lengths on the wire)."""
    out = [_PCAP_HEADER]
    for p in sorted(packets, key=lambda p: p.ts_ns):
        head, length = _headers(p)
        sec, ns = divmod(p.ts_ns, 1_000_000_000)
        out.append(_RECORD.pack(sec, ns, len(head), length))
        out.append(head)
    return b"".join(out)


def records_from_packets(
    packets: Iterable[Packet], source_id: str, interval_ns: int = DEFAULT_INTERVAL_NS
) -> list[FlowRecord]:
    """The records the probe would export had it seen these packets."""
    return read_capture(to_pcap(packets), interval_ns, source_id=source_id, name=source_id)[0]
