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
