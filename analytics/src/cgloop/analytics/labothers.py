"""Non-circular test traffic that is NOT cloud gaming, from the second generator (labcases.py).

The evaluation's false cloud-gaming alarms were counted on real captures only; these sessions
let it count them on traffic no training capture resembles too. Training never sees them (its
negatives are the real captures), and they are written in the lab cases' own terms: the same
path conditions (`labcases.path_arrivals`: Gilbert-Elliott loss, random-walk jitter, a
drop-tail rate cap), drawn sizes and rates.

* **adaptive video streaming**: segments of 2-6 s of video fetched over one TCP connection by
  HTTP requests, back to back while the player fills its buffer, then one a segment's length;
  each segment sent in congestion-window rounds an RTT apart at the server's link rate (a
  window restarts after an idle RTO), acknowledged every second packet;
* **video call**: RTP over one UDP five-tuple (bundled, as WebRTC does) in both directions: each
  side's video at 15-30 fps (log-AR(1) frame sizes, packets of at most ~1200 bytes spread by a
  pacer), Opus audio every 20 ms, RTCP reports; a side's camera may be off;
* **bulk download**: one TCP transfer filling its window rounds for the whole session.

Marked synthetic everywhere; evaluated apart, never trained on.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from cgloop.analytics.labcases import CONDITIONS, path_arrivals
from cgloop.analytics.packets import Packet, records_from_packets
from cgloop.analytics.records import NS
from cgloop.v1.flow_pb2 import FlowRecord

KINDS = ("video_streaming", "realtime_call", "bulk")
_ACK = 0x10


@dataclass(frozen=True)
class OtherCase:
    """One session of other traffic: its class (KINDS), rate, path condition and seed."""

    kind: str
    rate_mbps: float
    condition: str
    seed: int

    @property
    def name(self) -> str:
        return f"lab/{self.condition}/{self.kind}-{self.rate_mbps:.1f}Mbps-{self.seed}"


def draw_other_cases(n: int, seed: int = 0) -> list[OtherCase]:
    """`n` sessions cycling the kinds and, for each kind, the path conditions; rates drawn
    log-uniformly over what each kind uses (video 0.5-25, calls 0.3-4, bulk 2-200 Mbit/s)."""
    rng = np.random.default_rng(20_000 + seed)
    ranges = {"video_streaming": (0.5, 25.0), "realtime_call": (0.3, 4.0), "bulk": (2.0, 200.0)}
    out = []
    for i in range(n):
        kind = KINDS[i % len(KINDS)]
        lo, hi = ranges[kind]
        rate = float(np.exp(rng.uniform(np.log(lo), np.log(hi))))
        cond = CONDITIONS[(i // len(KINDS)) % len(CONDITIONS)]
        out.append(OtherCase(kind, rate, cond, seed * 1000 + 500 + i))
    return out


class _Tcp:
    """A sender's congestion window in rounds: slow start to a drawn ssthresh, then one more
    packet a round; the window restarts at 10 after an idle longer than the RTO."""

    def __init__(self, link_bps: float, rtt: float, mss: int, rng: np.random.Generator):
        self.link, self.rtt, self.mss = link_bps / 8, rtt, mss
        self.cwnd, self.ssthresh = 10, int(rng.integers(20, 300))
        self.free = 0.0  # when the sender's link is next idle

    def send(self, t0: float, nbytes: int) -> list[tuple[float, int]]:
        """(send time, bytes) of each packet of a `nbytes` transfer starting at `t0`."""
        if t0 - self.free > max(0.2, 2 * self.rtt):
            self.cwnd = 10
        out, left, t = [], nbytes, max(t0, self.free)
        while left > 0:
            start = t
            for _ in range(self.cwnd):
                size = min(self.mss, left)
                out.append((t, size + 52))
                t += (size + 52) / self.link
                left -= size
                if left <= 0:
                    break
            self.cwnd = self.cwnd * 2 if self.cwnd < self.ssthresh else self.cwnd + 1
            t = max(t, start + self.rtt)  # the next round waits for the acks
        self.free = t
        return out


def _acks(arrivals: np.ndarray, rng: np.random.Generator) -> list[float]:
    """The receiver's acks: one every second data packet that arrived, shortly after it."""
    got = np.sort(arrivals[~np.isnan(arrivals)])
    return [float(a + rng.uniform(2e-5, 4e-4)) for a in got[1::2]]


def _video_streaming(case: OtherCase, duration_s: float, rng: np.random.Generator):
    """(downstream send times, sizes) and upstream (times, sizes)."""
    link = max(case.rate_mbps * float(rng.uniform(1.5, 20.0)), 5.0) * 1e6
    tcp = _Tcp(link, float(rng.uniform(0.01, 0.08)), int(rng.integers(1360, 1449)), rng)
    seg_s, buffer_s = float(rng.uniform(2.0, 6.0)), float(rng.uniform(10.0, 30.0))
    down: list[tuple[float, int]] = []
    up: list[tuple[float, int]] = []
    t, buffered = float(rng.uniform(0.0, 0.2)), 0.0
    while t < duration_s:
        up.append((t, int(rng.integers(300, 800))))  # the HTTP request for the next segment
        nbytes = int(case.rate_mbps * 1e6 / 8 * seg_s * float(rng.lognormal(0, 0.2)))
        pkts = tcp.send(t + tcp.rtt, nbytes)
        down += pkts
        done = pkts[-1][0] if pkts else t
        buffered += seg_s - (done - t)
        # fill the buffer back to back, then fetch one segment a segment's length
        t = done + 0.005 if buffered < buffer_s else t + seg_s
    return down, up


def _bulk(case: OtherCase, duration_s: float, rng: np.random.Generator):
    tcp = _Tcp(case.rate_mbps * 1e6, float(rng.uniform(0.005, 0.1)),
               int(rng.integers(1360, 1449)), rng)
    up = [(0.0, int(rng.integers(200, 500)))]
    down = tcp.send(tcp.rtt, int(case.rate_mbps * 1e6 / 8 * duration_s * 2))
    return [p for p in down if p[0] < duration_s], up


def _call_side(rate_mbps: float, duration_s: float, camera: bool, rng: np.random.Generator,
               ) -> list[tuple[float, int, int, bool]]:
    """One side's media: (send time, bytes, RTP payload type, marker)."""
    out = []
    t = float(rng.uniform(0, 0.02))
    while t < duration_s:  # Opus audio, 20 ms frames
        out.append((t, int(rng.integers(90, 200)), 111, False))
        t += 0.02
    t = 0.0
    while t < duration_s:  # RTCP
        out.append((t, int(rng.integers(80, 160)), 72, False))
        t += float(rng.uniform(0.1, 1.0))
    if not camera:
        return out
    fps = float(rng.choice([15.0, 24.0, 30.0]))
    phi, sigma, level = float(rng.uniform(0.6, 0.95)), float(rng.uniform(0.1, 0.35)), 0.0
    mean = rate_mbps * 1e6 / 8 / fps
    pace = float(rng.uniform(1.5, 3.0)) * rate_mbps * 1e6 / 8  # the pacer's rate, bytes/s
    t, free = float(rng.uniform(0, 1 / fps)), 0.0
    while t < duration_s:
        level = phi * level + float(rng.normal(0, sigma))
        size = max(200, int(mean * np.exp(level)))
        n = -(-size // 1150)
        each = -(-size // n)
        free = max(free, t)
        for i in range(n):
            out.append((free, each + 40, 96, i == n - 1))
            free += (each + 40) / pace
        t += 1 / fps * float(rng.normal(1, 0.05))
    return out


def other_packets(case: OtherCase, duration_s: float, start_ns: int = 1_700_000_000 * NS,
                  client: bytes = bytes([10, 9, 0, 3]),
                  server: bytes = bytes([203, 0, 113, 9])) -> list[Packet]:
    """The session's packets in both directions, the path condition applied downstream."""
    if case.kind not in KINDS:
        raise ValueError(f"unknown kind of other traffic {case.kind!r} (one of {KINDS})")
    rng = np.random.default_rng(case.seed)
    sport, cport = (443 if case.kind != "realtime_call" else int(rng.integers(3478, 60000)),
                    int(rng.integers(1024, 60000)))
    proto = 17 if case.kind == "realtime_call" else 6
    down_key, up_key = (server, client, sport, cport, proto), (client, server, cport, sport, proto)
    cap_ratio = float(rng.uniform(0.5, 0.8))
    out: list[Packet] = []

    def at(t: float) -> int:
        return start_ns + int(t * NS)

    if case.kind == "realtime_call":
        sides = []
        for key, share in ((down_key, 1.0), (up_key, float(rng.uniform(0.3, 1.2)))):
            media = _call_side(case.rate_mbps * share, duration_s, bool(rng.random() < 0.85), rng)
            sides.append((key, sorted(media)))
        for k, (key, media) in enumerate(sides):
            ts = np.array([m[0] for m in media])
            sizes = np.array([m[1] for m in media], dtype=float)
            arr = ts if k else path_arrivals(ts, sizes, case.condition, case.rate_mbps,
                                             cap_ratio, rng)
            ssrc = {pt: int(rng.integers(1, 2**31)) for pt in (96, 111, 72)}
            seq = {pt: int(rng.integers(0, 65535)) for pt in ssrc}
            for a, (_, size, pt, marker) in zip(arr, media, strict=True):
                seq[pt] = (seq[pt] + 1) & 0xFFFF
                if np.isnan(a) or a >= duration_s:
                    continue
                out.append(Packet(ts_ns=at(a), key=key, length=size, rtp_ssrc=ssrc[pt],
                                  rtp_pt=pt, rtp_seq=seq[pt], rtp_ts=int(a * 90000),
                                  rtp_marker=marker))
    else:
        down, up = (_video_streaming if case.kind == "video_streaming" else _bulk)(
            case, duration_s, rng)
        ts = np.array([d[0] for d in down])
        sizes = np.array([d[1] for d in down], dtype=float)
        rate = case.rate_mbps if case.kind == "bulk" else case.rate_mbps * 2
        arr = path_arrivals(ts, sizes, case.condition, rate, cap_ratio, rng)
        for a, size in zip(arr, sizes, strict=True):
            if not np.isnan(a) and a < duration_s:
                out.append(Packet(ts_ns=at(a), key=down_key, length=int(size), tcp_flags=_ACK))
        for a in _acks(arr, rng):
            if a < duration_s:
                out.append(Packet(ts_ns=at(a), key=up_key, length=52, tcp_flags=_ACK))
        for t, size in up:
            if t < duration_s:
                out.append(Packet(ts_ns=at(t), key=up_key, length=size, tcp_flags=_ACK))
    out.sort(key=lambda p: p.ts_ns)
    return out


def other_records(case: OtherCase, duration_s: float = 6.0) -> list[FlowRecord]:
    """The records the probe would export for the session."""
    return records_from_packets(other_packets(case, duration_s), f"labcase/{case.condition}")
