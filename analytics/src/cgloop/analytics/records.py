"""Packets → FlowRecord interval records, the shape the XDP probe exports (flow.proto).

The pcap reader (`pcap.py`) and the synthetic traffic generator (`synthetic.py`) both feed
packets through `IntervalAccumulator`, so features computed downstream see exactly the record
shape the probe and the Rust pcap twin (`cgloop telemetry pcap`) produce.
"""

from __future__ import annotations

import ipaddress
import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from cgloop.contracts import SCHEMA_VERSION
from cgloop.v1.common_pb2 import Direction, FiveTuple, Log2Histogram, RecordHeader
from cgloop.v1.flow_pb2 import FlowRecord, RtpStats

NS = 1_000_000_000
# Packets closer than this belong to one burst (a probe setting in the real exporter).
DEFAULT_BURST_GAP_NS = 200_000
DEFAULT_INTERVAL_NS = 100_000_000
# A flow idle this long is final (its record gets is_final) and a new flow starts afterwards.
DEFAULT_IDLE_TIMEOUT_NS = 30 * NS
MAX_BUCKETS = 32

TupleKey = tuple[bytes, bytes, int, int, int]


def log2_bucket(value: int) -> int:
    return 0 if value <= 1 else min(MAX_BUCKETS - 1, int(value).bit_length() - 1)


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


def flow_label(ft: FiveTuple) -> str:
    proto = {6: "tcp", 17: "udp", 1: "icmp", 58: "icmpv6"}.get(ft.ip_protocol, str(ft.ip_protocol))
    return (
        f"{proto} {addr_text(ft.src_addr)}:{ft.src_port} -> {addr_text(ft.dst_addr)}:{ft.dst_port}"
    )


@dataclass(slots=True)
class Packet:
    """One observed packet, reduced to what the probe looks at."""

    ts_ns: int
    key: TupleKey
    length: int  # layer 3 bytes
    ecn: int = 0
    dscp: int = 0
    tcp_flags: int = 0
    # RTP header fields when the UDP payload parses as RTP v2 (else None).
    rtp_ssrc: int | None = None
    rtp_pt: int = 0
    rtp_seq: int = 0
    rtp_ts: int = 0
    rtp_marker: bool = False


RTP_CLOCK_HZ = 90_000  # video clock, the default until the stream's clock is known
# Common RTP clocks (RFC 3551 and dynamic audio/video types); the stream's clock is estimated from
# timestamp progress over arrival time and snapped to the nearest of these.
RTP_CLOCKS_HZ = (8_000, 16_000, 32_000, 44_100, 48_000, 90_000)
_STATIC_CLOCKS = {0: 8_000, 3: 8_000, 4: 8_000, 8: 8_000, 9: 8_000, 18: 8_000, 26: 90_000,
                  31: 90_000, 32: 90_000, 33: 90_000, 34: 90_000}


@dataclass(slots=True)
class _Rtp:
    ssrc: int
    pt: int
    max_seq: int  # extended
    base_seq: int
    received: int = 0
    jitter: float = 0.0  # in RTP timestamp units (RFC 3550 §6.4.1)
    last_transit: float | None = None
    # interval counters
    reordered: int = 0
    gaps: int = 0
    duplicates: int = 0
    markers: int = 0
    seen: set[int] = field(default_factory=set)
    clock_hz: int = 0  # 0 until known
    last_arrival_ns: int = 0
    first_arrival_ns: int = 0
    first_ts: int = 0
    expected_prior: int = 0
    received_prior: int = 0


@dataclass(slots=True)
class _Interval:
    start_ns: int
    first_seen_ns: int
    last_seen_ns: int = 0
    packets: int = 0
    size_min: int = 0
    size_max: int = 0
    size_sum: int = 0
    size_sq: int = 0
    size_hist: list[int] = field(default_factory=lambda: [0] * MAX_BUCKETS)
    iat_hist: list[int] = field(default_factory=lambda: [0] * MAX_BUCKETS)
    burst_len: int = 0
    max_burst: int = 0
    bursts: int = 0
    ecn: list[int] = field(default_factory=lambda: [0, 0, 0, 0])
    dscp: int = 0
    tcp_flags: int = 0


def _trim(hist: list[int]) -> list[int]:
    end = len(hist)
    while end and hist[end - 1] == 0:
        end -= 1
    return hist[:end]


class IntervalAccumulator:
    """Per-flow interval counters, flushed as FlowRecords every `interval_ns` of event time.

    Each direction of a conversation is its own flow (as in the probe); only intervals in which
    a flow saw packets produce a record.
    """

    def __init__(
        self,
        source_id: str = "pcap",
        interval_ns: int = DEFAULT_INTERVAL_NS,
        burst_gap_ns: int = DEFAULT_BURST_GAP_NS,
        idle_timeout_ns: int = DEFAULT_IDLE_TIMEOUT_NS,
        interface_name: str = "",
    ) -> None:
        self.source_id = source_id
        self.interval_ns = interval_ns
        self.burst_gap_ns = burst_gap_ns
        self.idle_timeout_ns = idle_timeout_ns
        self.interface_name = interface_name
        self._open: dict[TupleKey, _Interval] = {}
        self._first_seen: dict[TupleKey, int] = {}
        self._last_ts: dict[TupleKey, int] = {}
        self._rtp: dict[TupleKey, _Rtp] = {}
        self._sequence = 0

    def _record(self, key: TupleKey, iv: _Interval, final: bool) -> FlowRecord:
        self._sequence += 1
        end = iv.start_ns + self.interval_ns
        rec = FlowRecord(
            header=RecordHeader(
                schema_version=SCHEMA_VERSION,
                source_id=self.source_id,
                sequence=self._sequence,
                timestamp_ns=end,
            ),
            five_tuple=FiveTuple(
                src_addr=key[0], dst_addr=key[1], src_port=key[2], dst_port=key[3],
                ip_protocol=key[4],
            ),
            direction=Direction.DIRECTION_INGRESS,
            interface_name=self.interface_name,
            interval_start_ns=iv.start_ns,
            interval_end_ns=end,
            is_final=final,
            packets=iv.packets,
            bytes=iv.size_sum,
            first_seen_ns=self._first_seen[key],
            last_seen_ns=iv.last_seen_ns,
            size_min_bytes=iv.size_min,
            size_max_bytes=iv.size_max,
            size_sum_bytes=iv.size_sum,
            size_sum_squares_bytes2=iv.size_sq,
            size_histogram_bytes=Log2Histogram(buckets=_trim(iv.size_hist)),
            inter_arrival_histogram_ns=Log2Histogram(buckets=_trim(iv.iat_hist)),
            max_burst_packets=max(iv.max_burst, iv.burst_len),
            burst_count=iv.bursts,
            ecn_not_ect_packets=iv.ecn[0],
            ecn_ect1_packets=iv.ecn[1],
            ecn_ect0_packets=iv.ecn[2],
            ecn_ce_packets=iv.ecn[3],
            last_dscp=iv.dscp,
            tcp_flags_seen=iv.tcp_flags,
        )
        rtp = self._rtp.get(key)
        if rtp is not None and rtp.received:
            expected = rtp.max_seq - rtp.base_seq + 1
            lost_total = max(0, expected - rtp.received)
            lost_prior = max(0, rtp.expected_prior - rtp.received_prior)
            rec.rtp.CopyFrom(
                RtpStats(
                    ssrc=rtp.ssrc,
                    payload_type=rtp.pt,
                    clock_rate_hz=rtp.clock_hz,
                    jitter_ns=int(rtp.jitter * NS / rtp.clock_hz) if rtp.clock_hz else 0,
                    lost_packets=max(0, lost_total - lost_prior),
                    reordered_packets=rtp.reordered,
                    sequence_gaps=rtp.gaps,
                    duplicate_packets=rtp.duplicates,
                    marker_packets=rtp.markers,
                    extended_highest_sequence=rtp.max_seq & 0xFFFFFFFF,
                )
            )
            rtp.expected_prior, rtp.received_prior = expected, rtp.received
            rtp.reordered = rtp.gaps = rtp.duplicates = rtp.markers = 0
            rtp.seen.clear()
        return rec

    def _rtp_update(self, p: Packet) -> None:
        assert p.rtp_ssrc is not None
        st = self._rtp.get(p.key)
        if st is not None and st.ssrc != p.rtp_ssrc and p.ts_ns - st.last_arrival_ns < 2 * NS:
            return  # another stream multiplexed on the 5-tuple: follow the first one
        if st is None or st.ssrc != p.rtp_ssrc:
            st = _Rtp(ssrc=p.rtp_ssrc, pt=p.rtp_pt, max_seq=p.rtp_seq, base_seq=p.rtp_seq,
                      clock_hz=_STATIC_CLOCKS.get(p.rtp_pt, 0), first_arrival_ns=p.ts_ns,
                      first_ts=p.rtp_ts)
            self._rtp[p.key] = st
        # extend the 16-bit sequence number around the current maximum
        cycles = st.max_seq & ~0xFFFF
        ext = cycles | p.rtp_seq
        if ext < st.max_seq - 0x8000:
            ext += 0x10000
        elif ext > st.max_seq + 0x8000:
            ext -= 0x10000
        if ext in st.seen:
            st.duplicates += 1
        elif ext < st.max_seq:
            st.reordered += 1
        elif ext > st.max_seq + 1:
            st.gaps += 1
        st.seen.add(ext)
        st.max_seq = max(st.max_seq, ext)
        st.received += 1
        st.last_arrival_ns = p.ts_ns
        if p.rtp_marker:
            st.markers += 1
        if not st.clock_hz and p.ts_ns - st.first_arrival_ns >= NS // 2:
            rate = ((p.rtp_ts - st.first_ts) & 0xFFFFFFFF) / ((p.ts_ns - st.first_arrival_ns) / NS)
            st.clock_hz = min(RTP_CLOCKS_HZ, key=lambda c: abs(c - rate))
        if not st.clock_hz:
            return  # jitter needs the stream's clock
        transit = p.ts_ns * st.clock_hz / NS - p.rtp_ts
        if st.last_transit is not None:
            d = abs(transit - st.last_transit)
            if d < st.clock_hz:  # ignore timestamp jumps (new talk spurt, clock reset)
                st.jitter += (d - st.jitter) / 16
        st.last_transit = transit

    def add(self, p: Packet) -> list[FlowRecord]:
        """Account one packet (in event-time order per flow); returns records it closed."""
        out: list[FlowRecord] = []
        key = p.key
        last = self._last_ts.get(key)
        iv = self._open.get(key)
        if last is not None and p.ts_ns - last > self.idle_timeout_ns:
            if iv is not None:
                out.append(self._record(key, iv, final=True))
            iv = None
            self._open.pop(key, None)
            self._first_seen.pop(key, None)
            self._rtp.pop(key, None)
            last = None
        if iv is not None and p.ts_ns >= iv.start_ns + self.interval_ns:
            out.append(self._record(key, iv, final=False))
            iv = None
        if iv is None:
            start = p.ts_ns - p.ts_ns % self.interval_ns
            self._first_seen.setdefault(key, p.ts_ns)
            iv = _Interval(start_ns=start, first_seen_ns=self._first_seen[key])
            iv.size_min = p.length
            self._open[key] = iv
        iv.packets += 1
        iv.last_seen_ns = p.ts_ns
        iv.size_min = min(iv.size_min, p.length)
        iv.size_max = max(iv.size_max, p.length)
        iv.size_sum += p.length
        iv.size_sq += p.length * p.length
        iv.size_hist[log2_bucket(p.length)] += 1
        iv.ecn[p.ecn & 3] += 1
        iv.dscp = p.dscp
        iv.tcp_flags |= p.tcp_flags
        if last is not None:
            gap = max(0, p.ts_ns - last)
            iv.iat_hist[log2_bucket(gap)] += 1
            if gap <= self.burst_gap_ns:
                iv.burst_len += 1
            else:
                iv.max_burst = max(iv.max_burst, iv.burst_len)
                iv.burst_len = 1
                iv.bursts += 1
        else:
            iv.burst_len, iv.bursts = 1, 1
        self._last_ts[key] = p.ts_ns
        if p.rtp_ssrc is not None:
            self._rtp_update(p)
        return out

    def flush(self) -> list[FlowRecord]:
        """Close every open interval (end of capture): those records are final."""
        out = [self._record(k, iv, final=True) for k, iv in self._open.items()]
        self._open.clear()
        return out


def accumulate(packets: Iterable[Packet], **params) -> Iterator[FlowRecord]:
    acc = IntervalAccumulator(**params)
    for p in packets:
        yield from acc.add(p)
    yield from acc.flush()


def record_mean_size(rec: FlowRecord) -> float:
    return rec.size_sum_bytes / rec.packets if rec.packets else 0.0


def record_size_std(rec: FlowRecord) -> float:
    if not rec.packets:
        return 0.0
    mean = rec.size_sum_bytes / rec.packets
    return math.sqrt(max(0.0, rec.size_sum_squares_bytes2 / rec.packets - mean * mean))
