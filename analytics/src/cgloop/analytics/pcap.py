"""Pcap/pcapng file → FlowRecord interval records (offline stand-in for the probe).

This is the ONE place analytics turns packets into records. The Rust pcap twin of the probe
(`cgloop telemetry pcap FILE`) produces the same FlowRecord shape; when it is available,
`records_from_pcap` can delegate to it without any change downstream (features, datasets,
detectors only ever see FlowRecords). Packets are decoded with dpkt; a malformed packet
(bad headers inside a sound record) is counted and skipped. A damaged *file* is refused, as the
Rust twin refuses it: bad magic, a truncated record header or record, a record longer than the
capture's snaplen, a broken pcapng block or gzip stream; the error names the packet index and
the byte offset of its record (in the uncompressed stream for .gz).
"""

from __future__ import annotations

import gzip
import logging
import struct
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import dpkt
from cgloop.analytics.records import (
    DEFAULT_INTERVAL_NS,
    IntervalAccumulator,
    Packet,
)
from cgloop.v1.flow_pb2 import FlowRecord

log = logging.getLogger(__name__)

DLT_EN10MB, DLT_RAW, DLT_LINUX_SLL, DLT_RAW_ALT = 1, 101, 113, 12


class PcapError(ValueError):
    """The file is not a readable pcap/pcapng capture."""


@dataclass
class PcapStats:
    packets: int = 0
    parsed: int = 0
    skipped_non_ip: int = 0
    malformed: int = 0


def _open(path: Path):
    raw = path.open("rb")
    magic = raw.read(2)
    raw.seek(0)
    return gzip.open(raw) if magic == b"\x1f\x8b" else raw


# Classic pcap: magic -> (byte order, ns per ts_frac unit).
_PCAP_MAGIC = {
    b"\xd4\xc3\xb2\xa1": ("<", 1000),
    b"\xa1\xb2\xc3\xd4": (">", 1000),
    b"\x4d\x3c\xb2\xa1": ("<", 1),
    b"\xa1\xb2\x3c\x4d": (">", 1),
}
_PCAPNG_MAGIC = b"\x0a\x0d\x0d\x0a"


def _damaged(path: Path, index: int, offset: int, what: str) -> PcapError:
    return PcapError(f"{path}: packet {index} at byte offset {offset}: {what}")


def _classic_records(path: Path, fh, head: bytes) -> Iterator[tuple[int, int, bytes]]:
    """(index, ts_ns, data) of each record; refuses what libpcap and the Rust twin refuse."""
    order, frac_ns = _PCAP_MAGIC[head[:4]]
    (snaplen,) = struct.unpack(order + "I", head[16:20])
    record = struct.Struct(order + "IIII")
    offset, index = 24, 0
    while True:
        hdr = fh.read(record.size)
        if not hdr:
            return
        index += 1
        if len(hdr) < record.size:
            raise _damaged(path, index, offset, f"truncated record header ({len(hdr)} of 16 bytes)")
        ts_sec, ts_frac, incl_len, _orig_len = record.unpack(hdr)
        if snaplen and incl_len > snaplen:
            raise _damaged(
                path, index, offset, f"record length {incl_len} is beyond the snaplen {snaplen}"
            )
        data = fh.read(incl_len)
        if len(data) < incl_len:
            raise _damaged(
                path, index, offset,
                f"truncated record: {incl_len} bytes announced, {len(data)} left in the file",
            )
        yield index, ts_sec * 1_000_000_000 + ts_frac * frac_ns, data
        offset += record.size + incl_len


def _pcapng_records(path: Path, fh, reader) -> Iterator[tuple[int, int, bytes]]:
    it = iter(reader)
    index = 0
    while True:
        offset = fh.tell()
        try:
            ts, buf = next(it)
        except StopIteration:
            return
        except (ValueError, dpkt.dpkt.Error, struct.error, IndexError) as exc:
            detail = str(exc) or "truncated"
            raise _damaged(path, index + 1, offset, f"bad pcapng block ({detail})") from None
        index += 1
        yield index, round(float(ts) * 1e9), buf


def _open_records(path: Path, fh) -> tuple[int, Iterator[tuple[int, int, bytes]]]:
    """The capture's link type and its records as (index, ts_ns, data)."""
    head = fh.read(24)
    if head[:4] == _PCAPNG_MAGIC:
        fh.seek(0)
        try:
            reader = dpkt.pcapng.Reader(fh)
        except (ValueError, dpkt.dpkt.Error, struct.error) as exc:
            raise PcapError(f"{path}: bad pcapng header ({exc})") from None
        return reader.datalink(), _pcapng_records(path, fh, reader)
    if len(head) < 24 or head[:4] not in _PCAP_MAGIC:
        raise PcapError(
            f"{path}: not a pcap or pcapng file (starts with {head[:4].hex() or 'nothing'})"
        )
    datalink = struct.unpack(_PCAP_MAGIC[head[:4]][0] + "I", head[20:24])[0]
    return datalink, _classic_records(path, fh, head)


def _rtp_fields(payload: bytes) -> tuple[int, int, int, int, bool] | None:
    """(ssrc, payload type, sequence, timestamp, marker) when the payload looks like RTP v2."""
    if len(payload) < 12 or payload[0] >> 6 != 2:
        return None
    pt = payload[1] & 0x7F
    # 72-76 are RTCP packet types (RFC 5761 muxing); dynamic/static media types only.
    if 72 <= pt <= 76:
        return None
    seq, ts, ssrc = struct.unpack("!HII", payload[2:12])
    return ssrc, pt, seq, ts, bool(payload[1] & 0x80)


def _ip_of(datalink: int, buf: bytes):
    if datalink == DLT_EN10MB:
        eth = dpkt.ethernet.Ethernet(buf)  # dpkt strips 802.1Q / QinQ tags
        return eth.data
    if datalink == DLT_LINUX_SLL:
        return dpkt.sll.SLL(buf).data
    if datalink in (DLT_RAW, DLT_RAW_ALT):
        version = buf[0] >> 4 if buf else 0
        return dpkt.ip.IP(buf) if version == 4 else dpkt.ip6.IP6(buf)
    raise PcapError(f"unsupported link type {datalink} (Ethernet, Linux SLL and raw IP are read)")


def packets_from_pcap(path: Path, stats: PcapStats | None = None) -> Iterator[Packet]:
    stats = stats if stats is not None else PcapStats()
    fh = _open(path)
    try:
        yield from _packets(path, fh, stats)
    except (EOFError, OSError, zlib.error) as exc:
        # gzip.BadGzipFile is an OSError; a cut .gz ends in EOFError.
        where = fh.tell() if isinstance(fh, gzip.GzipFile) else None
        at = f" near uncompressed byte offset {where}" if where is not None else ""
        raise PcapError(f"{path}: damaged or unreadable capture{at}: {exc}") from None
    finally:
        fh.close()


def _packets(path: Path, fh, stats: PcapStats) -> Iterator[Packet]:
    datalink, records = _open_records(path, fh)
    for _index, ts_ns, buf in records:
        stats.packets += 1
        try:
            ip = _ip_of(datalink, buf)
        except PcapError:
            raise
        except (dpkt.dpkt.Error, IndexError, struct.error, ValueError):
            stats.malformed += 1
            continue
        if isinstance(ip, dpkt.ip.IP):
            length, tos = ip.len, ip.tos
            src, dst, proto = bytes(ip.src), bytes(ip.dst), ip.p
        elif isinstance(ip, dpkt.ip6.IP6):
            length, tos = ip.plen + 40, (ip.fc >> 20) & 0xFF
            src, dst, proto = bytes(ip.src), bytes(ip.dst), ip.nxt
        else:
            stats.skipped_non_ip += 1
            continue
        l4 = ip.data
        sport = dport = flags = 0
        rtp = None
        if isinstance(l4, dpkt.tcp.TCP):
            sport, dport, flags = l4.sport, l4.dport, l4.flags
        elif isinstance(l4, dpkt.udp.UDP):
            sport, dport = l4.sport, l4.dport
            rtp = _rtp_fields(bytes(l4.data))
        p = Packet(
            ts_ns=ts_ns,
            key=(src, dst, sport, dport, proto),
            length=length,
            ecn=tos & 3,
            dscp=tos >> 2,
            tcp_flags=flags,
        )
        if rtp is not None:
            p.rtp_ssrc, p.rtp_pt, p.rtp_seq, p.rtp_ts, p.rtp_marker = rtp
        stats.parsed += 1
        yield p


def records_from_pcap(
    path: Path | str,
    interval_ns: int = DEFAULT_INTERVAL_NS,
    source_id: str | None = None,
    stats: PcapStats | None = None,
) -> list[FlowRecord]:
    """Every FlowRecord a probe on the capture's interface would have exported, in time order."""
    path = Path(path)
    if not path.is_file():
        raise PcapError(f"{path}: no such file")
    acc = IntervalAccumulator(source_id=source_id or f"pcap/{path.name}", interval_ns=interval_ns)
    out: list[FlowRecord] = []
    for p in packets_from_pcap(path, stats):
        out.extend(acc.add(p))
    out.extend(acc.flush())
    # The probe exports each record when its interval ends; the accumulator closes an interval
    # lazily (at the flow's next packet), so put records in export order and number them so.
    out.sort(key=lambda r: (r.interval_end_ns, r.header.sequence))
    for i, r in enumerate(out, 1):
        r.header.sequence = i
    return out
