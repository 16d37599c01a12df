"""Non-circular test cases: cloud-gaming sessions from a generator that training never uses.

The training's synthetic sessions (`synthetic.py`) and the lab's traffic share ideas (a frame
every 1/fps s, i.i.d. log-normal frame sizes, full-MTU packets and a remainder, a uniform
input cadence, per-packet Gaussian delay, independent loss, a rate cap that shrinks frames).
A model that learnt those ideas rather than cloud gaming would pass a test drawn from them.
This generator is written apart and models each part differently:

* **frames**: a display clock whose frames the encoder sometimes skips (render stalls), a
  log-AR(1) frame size (scene complexity drifts, it is not i.i.d.), periodic key frames and
  random scene cuts; frames are split into equal packets of a drawn MTU and leave the server
  as a train at a drawn link rate (10 Mbit/s - 1 Gbit/s), not back to back;
* **input**: controller reports at a drawn poll rate (4-16 ms) that stop while the player is
  idle and come in pairs on a press/release, plus sparse receiver reports;
* **the path**: a FIFO queue drained at a rate cap with a drop-tail buffer (so a cap delays,
  then drops, and the encoder adapts only after it saw the loss), Gilbert-Elliott burst loss,
  and jitter as a random-walk delay that keeps packet order (Wi-Fi, cellular);
* **bitrates outside the training range** (`synthetic.TRAIN_RATE_MBPS`): below and above.

No real per-packet capture of a cloud-gaming stream exists in the project's data (the Xbox
data set gives per-flow means; the nDPI pcaps are set-ups and low-rate calls), so these are
not replayed timings: they are a second, independent model. Always marked synthetic.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from cgloop.analytics.packets import Packet, records_from_packets
from cgloop.analytics.records import NS
from cgloop.analytics.synthetic import TRAIN_RATE_MBPS
from cgloop.v1.flow_pb2 import FlowRecord

CONDITIONS = ("clean", "loss", "jitter", "rate_cap")


@dataclass(frozen=True)
class LabCase:
    """One session: its bitrate (outside the training range), frame rate and path condition."""

    rate_mbps: float
    fps: float
    condition: str
    seed: int

    @property
    def name(self) -> str:
        return f"lab/{self.condition}/{self.rate_mbps:.1f}Mbps-{self.fps:.0f}fps-{self.seed}"


def draw_cases(n: int, seed: int = 0) -> list[LabCase]:
    """`n` cases cycling the conditions, half below the training range (1 Mbit/s up to its
    floor), half above it (its ceiling up to 60 Mbit/s)."""
    rng = np.random.default_rng(10_000 + seed)
    lo, hi = TRAIN_RATE_MBPS
    out = []
    for i in range(n):
        a, b = (1.0, lo * 0.95) if i % 2 == 0 else (hi * 1.1, 60.0)
        rate = float(np.exp(rng.uniform(np.log(a), np.log(b))))
        fps = float(rng.choice([30.0, 60.0, 120.0]))
        out.append(LabCase(rate, fps, CONDITIONS[(i // 2) % len(CONDITIONS)], seed * 1000 + i))
    return out


def _frames(case: LabCase, duration_s: float, rng: np.random.Generator):
    """(send time s, bytes) of each encoded frame; `rate(t)` may be lowered by adaptation."""
    tick = 1.0 / case.fps
    gop = int(rng.integers(2, 10)) * int(case.fps)  # a key frame every 2-10 s
    key = float(rng.uniform(3.0, 10.0))
    phi, sigma = float(rng.uniform(0.7, 0.97)), float(rng.uniform(0.1, 0.4))
    level, k, out = 0.0, 0, []
    while k * tick < duration_s:
        k += 1
        if rng.random() < 0.02:  # the game stalls: the encoder skips this display tick
            continue
        level = phi * level + float(rng.normal(0, sigma))
        scale = np.exp(level)
        if k % gop == 1 or rng.random() < 0.003:  # key frame or scene cut
            scale *= key
        render = float(rng.gamma(4.0, tick / 40))  # encode time after the tick
        out.append((k * tick + render, float(scale)))
    return out


def path_arrivals(
    ts: np.ndarray, sizes: np.ndarray, condition: str, rate_mbps: float, cap_ratio: float,
    rng: np.random.Generator,
) -> np.ndarray:
    """Arrival times at the probe (NaN: dropped) of packets sent at `ts` with `sizes` bytes
    after a path `condition` (CONDITIONS); a rate cap is `cap_ratio` of `rate_mbps`."""
    arr = ts.copy()
    if condition == "loss":  # Gilbert-Elliott: bursts of loss, ~1-3 % overall
        bad, p_gb, p_bg = False, float(rng.uniform(0.003, 0.01)), float(rng.uniform(0.2, 0.5))
        for i in range(len(arr)):
            bad = (rng.random() < p_gb) if not bad else (rng.random() >= p_bg)
            if bad and rng.random() < 0.6:
                arr[i] = np.nan
    elif condition == "jitter":  # a mean-reverting random-walk delay, FIFO kept
        std, tau = float(rng.uniform(2.0, 8.0)) / 1000, float(rng.uniform(0.05, 0.3))
        d, prev, last = std, arr[0] if len(arr) else 0.0, 0.0
        for i in range(len(arr)):
            dt = max(arr[i] - prev, 0.0)
            prev = arr[i]
            d += (std - d) * min(1.0, dt / tau) + float(rng.normal(0, std * np.sqrt(2 * dt / tau)))
            d = max(0.0, d)
            last = max(last, arr[i] + d)
            arr[i] = last
    elif condition == "rate_cap":  # a bottleneck below the stream's rate, drop-tail
        cap = rate_mbps * cap_ratio * 1e6 / 8
        buffer_s, free = float(rng.uniform(0.03, 0.15)), 0.0
        for i in range(len(arr)):
            start = max(free, arr[i])
            if start - arr[i] > buffer_s:
                arr[i] = np.nan
                continue
            free = start + sizes[i] / cap
            arr[i] = free
    return arr


def case_packets(
    case: LabCase,
    duration_s: float,
    start_ns: int = 1_700_000_000 * NS,
    client: bytes = bytes([10, 9, 0, 2]),
    server: bytes = bytes([203, 0, 113, 7]),
) -> list[Packet]:
    rng = np.random.default_rng(case.seed)
    sport, cport = int(rng.integers(1024, 60000)), int(rng.integers(1024, 60000))
    down, up = (server, client, sport, cport, 17), (client, server, cport, sport, 17)
    mtu = int(rng.integers(1100, 1500))
    # the server's link: 10 Mbit/s - 1 Gbit/s, and at least 2.5 times the stream's rate
    link = max(float(np.exp(rng.uniform(np.log(10e6), np.log(1e9)))),
               2.5 * case.rate_mbps * 1e6) / 8  # bytes/s
    cap_ratio = float(rng.uniform(0.5, 0.8))  # a rate cap's share of the stream's rate
    rtp, pt = bool(rng.random() < 0.5), int(rng.integers(96, 128))
    ssrc, seq = int(rng.integers(1, 2**31)), int(rng.integers(0, 65535))
    frames = _frames(case, duration_s, rng)
    mean_scale = float(np.mean([s for _, s in frames])) if frames else 1.0
    budget = case.rate_mbps * 1e6 / 8 / case.fps / mean_scale
    ts, sizes, meta = [], [], []
    adapt_at = float(rng.uniform(0.8, 2.0))  # the encoder reacts to a cap's loss this late
    for fi, (t, scale) in enumerate(frames):
        factor = 1.0
        if case.condition == "rate_cap" and t >= adapt_at:
            factor = 0.8 * cap_ratio  # the encoder retargets below the bottleneck
        size = max(120, int(budget * scale * factor))
        n = -(-size // mtu)
        each = -(-size // n)
        for i in range(n):
            ts.append(t + i * each / link)
            sizes.append(each + 40)
            meta.append((fi, i == n - 1))
    arr = path_arrivals(np.array(ts), np.array(sizes, dtype=float), case.condition,
                        case.rate_mbps, cap_ratio, rng)
    out: list[Packet] = []
    for a, size, (fi, last) in zip(arr, sizes, meta, strict=True):
        seq = (seq + 1) & 0xFFFF
        if np.isnan(a) or a >= duration_s:
            continue
        out.append(Packet(
            ts_ns=start_ns + int(a * NS), key=down, length=int(size),
            rtp_ssrc=ssrc if rtp else None, rtp_pt=pt, rtp_seq=seq,
            rtp_ts=int(fi * 90000 / case.fps), rtp_marker=last,
        ))
    poll = float(rng.uniform(4.0, 16.0)) / 1000
    report = int(rng.integers(50, 180))
    t, active_until = 0.0, float(rng.exponential(3.0))
    while t < duration_s:
        if t > active_until:  # idle a while, then play again
            t = active_until + float(rng.exponential(0.4))
            active_until = t + float(rng.exponential(3.0))
            continue
        n = 2 if rng.random() < 0.1 else 1  # a press and its release in one poll
        for j in range(n):
            out.append(Packet(ts_ns=start_ns + int((t + j * 2e-4) * NS), key=up,
                              length=report + int(rng.integers(-8, 9))))
        t += poll + float(rng.normal(0, poll / 20))
    t = 0.0
    while t < duration_s:  # receiver reports
        out.append(Packet(ts_ns=start_ns + int(t * NS), key=up, length=int(rng.integers(70, 120))))
        t += float(rng.uniform(0.05, 0.5))
    out.sort(key=lambda p: p.ts_ns)
    return out


def case_records(case: LabCase, duration_s: float = 6.0) -> list[FlowRecord]:
    """The records the probe would export for the case's session."""
    return records_from_packets(case_packets(case, duration_s), f"labcase/{case.condition}")
