"""Synthetic cloud-gaming traffic from the published platform profiles (MOSAICO D234 §2.1).

Everything generated here is marked synthetic (LabelledFlow.synthetic, dataset manifests and
reports). The packets are read as a capture by the probe's pcap twin (`packets.py`), so the
records are the probe's. Degradations (loss, jitter, rate caps) plant SLO episodes for detector
tests.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from cgloop.analytics.packets import Packet, records_from_packets
from cgloop.analytics.records import NS
from cgloop.v1.flow_pb2 import FlowRecord


@dataclass(frozen=True)
class PlatformProfile:
    name: str
    down_mbps: float
    fps: float = 60.0
    up_kbps: float = 420.0
    input_interval_ms: float = 10.0  # client input cadence (MOSAICO §3.3)
    mtu_payload: int = 1400


# Nominal downstream rates from MOSAICO §2.1 (Stadia 25-30: midpoint).
PROFILES: dict[str, PlatformProfile] = {
    "gfn": PlatformProfile("gfn", 33.0),
    "std": PlatformProfile("std", 27.5),
    "psn": PlatformProfile("psn", 23.0),
    "xc": PlatformProfile("xc", 13.0),
}


@dataclass(frozen=True)
class Degradation:
    """A planted episode: active in [start_s, end_s) of the session."""

    start_s: float
    end_s: float
    loss: float = 0.0  # fraction of downstream packets dropped
    jitter_ms: float = 0.0  # std of extra per-packet delay
    rate_cap_mbps: float | None = None


def gaming_packets(
    profile: PlatformProfile,
    duration_s: float,
    seed: int = 0,
    start_ns: int = 1_700_000_000 * NS,
    client: bytes = bytes([10, 0, 0, 2]),
    server: bytes = bytes([192, 0, 2, 10]),
    ports: tuple[int, int] = (49000, 49005),
    degradations: tuple[Degradation, ...] = (),
) -> list[Packet]:
    rng = np.random.default_rng(seed)
    cport, sport = ports
    down_key = (server, client, sport, cport, 17)
    up_key = (client, server, cport, sport, 17)
    out: list[Packet] = []
    ssrc = int(rng.integers(1, 2**31))
    seq, frame = int(rng.integers(0, 65535)), 0
    frame_gap = 1.0 / profile.fps
    t = 0.0
    while t < duration_s:
        deg = next((d for d in degradations if d.start_s <= t < d.end_s), None)
        rate = profile.down_mbps * float(rng.lognormal(0, 0.15))
        if deg and deg.rate_cap_mbps is not None:
            rate = min(rate, deg.rate_cap_mbps)
        frame_bytes = max(300, int(rate * 1e6 / 8 * frame_gap))
        n = max(1, -(-frame_bytes // profile.mtu_payload))
        rtp_ts = int(frame * 90000 / profile.fps) & 0xFFFFFFFF
        for i in range(n):
            size = profile.mtu_payload if i < n - 1 else max(100, frame_bytes % profile.mtu_payload)
            seq = (seq + 1) & 0xFFFF
            if deg and rng.random() < deg.loss:
                continue
            delay = abs(rng.normal(0, deg.jitter_ms / 1000)) if deg and deg.jitter_ms else 0.0
            ts = t + i * 40e-6 + delay  # back-to-back at line rate inside a frame
            out.append(
                Packet(
                    ts_ns=start_ns + int(ts * NS), key=down_key, length=size + 40,
                    rtp_ssrc=ssrc, rtp_pt=96, rtp_seq=seq, rtp_ts=rtp_ts,
                    rtp_marker=i == n - 1,
                )
            )
        frame += 1
        t += frame_gap * float(rng.normal(1, 0.03))
    # upstream: controller input every ~10 ms, sized to the profile's upstream rate
    up_size = int(profile.up_kbps * 1000 / 8 * profile.input_interval_ms / 1000)
    t = 0.0
    while t < duration_s:
        out.append(
            Packet(ts_ns=start_ns + int(t * NS), key=up_key,
                   length=max(60, int(up_size * rng.uniform(0.8, 1.2))))
        )
        t += profile.input_interval_ms / 1000 * float(rng.uniform(0.8, 1.2))
    out.sort(key=lambda p: p.ts_ns)
    return out


def gaming_records(
    platform: str,
    duration_s: float,
    seed: int = 0,
    interval_ns: int = 100_000_000,
    degradations: tuple[Degradation, ...] = (),
    **kw,
) -> list[FlowRecord]:
    packets = gaming_packets(PROFILES[platform], duration_s, seed, degradations=degradations, **kw)
    return records_from_packets(packets, f"synthetic/{platform}", interval_ns)


# ---------------------------------------------------------------- random sessions (issue 21)

# Training range of the random sessions' downstream rate: the lab cases (`labcases.py`) test
# outside it (below and above) on purpose.
TRAIN_RATE_MBPS = (2.0, 30.0)
FRAME_RATES = (30.0, 60.0, 120.0)


@dataclass(frozen=True)
class SessionDraw:
    """One random cloud-gaming session's settings: what varies across services, encoders,
    clients and access networks. Drawn by `draw_session`; always synthetic."""

    down_mbps: float
    fps: float
    gop_frames: int  # frames between key frames; 0: intra refresh, no key-frame spikes
    key_factor: float  # a key frame's size over a mean inter frame
    frame_sigma: float  # log-normal spread of inter-frame sizes
    mtu_payload: int
    pace_frac: float  # share of the frame interval a frame's packets are spread over (0: line rate)
    input_ms: float  # controller input cadence
    input_bytes: int
    feedback_ms: float  # receiver reports / feedback upstream
    rtp: bool  # RTP header visible (else an opaque UDP payload)
    jitter_ms: float
    loss: float
    adapt_every_s: float  # the encoder retargets its rate this often (x0.6-1.4)
    idle_input_frac: float  # share of time the player sends no input
    # An access link at this multiple of the stream's rate (0: none) spaces its packets.
    bottleneck: float = 0.0


def draw_session(rng: np.random.Generator) -> SessionDraw:
    lo, hi = TRAIN_RATE_MBPS
    return SessionDraw(
        down_mbps=float(np.exp(rng.uniform(np.log(lo), np.log(hi)))),
        fps=float(rng.choice(FRAME_RATES, p=[0.25, 0.6, 0.15])),
        gop_frames=int(rng.choice([0, int(rng.integers(30, 600))])),
        key_factor=float(rng.uniform(2.0, 8.0)),
        frame_sigma=float(rng.uniform(0.05, 0.5)),
        mtu_payload=int(rng.integers(1000, 1450)),
        pace_frac=float(rng.choice([0.0, rng.uniform(0.05, 0.6)])),
        input_ms=float(rng.uniform(4.0, 16.0)),
        input_bytes=int(rng.integers(60, 250)),
        feedback_ms=float(rng.uniform(20.0, 250.0)),
        rtp=bool(rng.random() < 0.6),
        jitter_ms=float(rng.choice([0.0, rng.uniform(0.1, 6.0)])),
        loss=float(rng.choice([0.0, rng.uniform(0.0005, 0.03)])),
        adapt_every_s=float(rng.uniform(0.5, 5.0)),
        idle_input_frac=float(rng.choice([0.0, rng.uniform(0.05, 0.4)])),
        bottleneck=float(rng.choice([0.0, 0.0, 0.0, rng.uniform(0.9, 2.0)])),
    )


def random_session_packets(
    d: SessionDraw,
    duration_s: float,
    seed: int = 0,
    start_ns: int = 1_700_000_000 * NS,
    client: bytes = bytes([10, 0, 0, 2]),
    server: bytes = bytes([198, 51, 100, 10]),
    ports: tuple[int, int] = (50000, 50005),
) -> list[Packet]:
    """A session of `d`: frames at its cadence with key frames and size spread, packetised at
    its MTU and pacing, with network jitter and loss; an input stream and feedback upstream."""
    rng = np.random.default_rng(seed)
    cport, sport = ports
    down_key, up_key = (server, client, sport, cport, 17), (client, server, cport, sport, 17)
    ssrc, seq = int(rng.integers(1, 2**31)), int(rng.integers(0, 65535))
    pt = int(rng.integers(96, 128))
    out: list[Packet] = []
    gap = 1.0 / d.fps
    rate, next_adapt = d.down_mbps, d.adapt_every_s
    t, frame = float(rng.uniform(0, gap)), 0
    while t < duration_s:
        if t >= next_adapt:
            rate = float(np.clip(rate * rng.uniform(0.6, 1.4), 0.5 * d.down_mbps,
                                 1.5 * d.down_mbps))
            next_adapt += d.adapt_every_s
        mean = rate * 1e6 / 8 * gap
        key = d.gop_frames and frame % d.gop_frames == 0
        size = mean * (d.key_factor if key else 1.0) * float(rng.lognormal(0, d.frame_sigma))
        size = max(200, int(size))
        n = -(-size // d.mtu_payload)
        spread = d.pace_frac * gap
        for i in range(n):
            seq = (seq + 1) & 0xFFFF
            if rng.random() < d.loss:
                continue
            payload = d.mtu_payload if i < n - 1 else max(60, size - d.mtu_payload * (n - 1))
            at = t + (i * spread / n if spread else i * float(rng.uniform(15e-6, 60e-6)))
            at += abs(float(rng.normal(0, d.jitter_ms / 1000))) if d.jitter_ms else 0.0
            out.append(Packet(
                ts_ns=start_ns + int(at * NS), key=down_key, length=payload + 40,
                rtp_ssrc=ssrc if d.rtp else None, rtp_pt=pt, rtp_seq=seq,
                rtp_ts=int(frame * 90000 / d.fps), rtp_marker=i == n - 1,
            ))
        frame += 1
        t += gap * float(rng.normal(1, 0.02))
    if d.bottleneck:  # a slower link before the probe sends packets at its own rate, in order
        cap, free = d.bottleneck * d.down_mbps * 1e6 / 8, 0
        for p in sorted(out, key=lambda p: p.ts_ns):
            p.ts_ns = free = max(p.ts_ns, free) + int(p.length / cap * NS)
    t, idle_until = 0.0, 0.0
    while t < duration_s:
        if t >= idle_until and rng.random() < d.idle_input_frac * d.input_ms / 1000:
            idle_until = t + float(rng.uniform(0.2, 1.5))  # the player stops touching the pad
        if t >= idle_until:
            size = int(d.input_bytes * rng.uniform(0.8, 1.2))
            out.append(Packet(ts_ns=start_ns + int(t * NS), key=up_key, length=size))
        t += d.input_ms / 1000 * float(rng.uniform(0.85, 1.15))
    t = float(rng.uniform(0, d.feedback_ms / 1000))
    while t < duration_s:
        out.append(Packet(ts_ns=start_ns + int(t * NS), key=up_key,
                          length=int(rng.integers(80, 200))))
        t += d.feedback_ms / 1000 * float(rng.uniform(0.8, 1.2))
    out.sort(key=lambda p: p.ts_ns)
    return out


def random_session_records(
    duration_s: float, seed: int = 0, interval_ns: int = 100_000_000
) -> tuple[SessionDraw, list[FlowRecord]]:
    """A random session (`draw_session` from `seed`) as the probe's records."""
    d = draw_session(np.random.default_rng(seed))
    packets = random_session_packets(d, duration_s, seed=seed + 1)
    return d, records_from_packets(packets, "synthetic/random", interval_ns)
