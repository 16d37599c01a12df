"""Traffic profiles: what each platform's session and each other application sends.

Cloud-gaming numbers are MOSAICO D234 §2.1 (docs/sources.md): downstream RTP/UDP
video at the platform's nominal rate, 60 fps, every frame sent as one burst of MTU-sized
packets; upstream client input every ~10 ms at ~420 kbit/s. Where the source gives a range
(Stadia 25-30, Xbox Cloud 12-14 Mbit/s) the midpoint is the default.
"""

from __future__ import annotations

from cgloop.slo import LAB
from cgloop.slo import table as slo_table
from pydantic import BaseModel, ConfigDict, Field


class StreamSpec(BaseModel):
    """One direction of an RTP/UDP media stream."""

    model_config = ConfigDict(extra="forbid")

    rate_kbps: float = Field(gt=0, le=1_000_000)
    fps: float = Field(gt=0, le=10_000, description="frames (send events) per second")
    payload_max: int = Field(default=1200, ge=64, le=1472, description="UDP payload per packet")
    burst: bool = Field(default=True, description="send a frame's packets back to back")
    size_cv: float = Field(default=0.15, ge=0, le=2, description="frame size variation")
    tos: int = Field(default=0, ge=0, le=255, description="IP TOS byte (ECN in the low 2 bits)")
    payload_type: int = Field(default=96, ge=0, le=127)
    # Congestion feedback for a responsive (L4S) sender: a stream with `ce_echo` carries the
    # number of CE-marked packets its peer has received so far; a `responsive` stream halves its
    # rate when that number grows (at most once per `react_ms`) and grows back additively.
    ce_echo: bool = False
    responsive: bool = False
    react_ms: float = Field(default=20.0, gt=0, le=10_000)
    # A sender late by more than two frame periods (starved of CPU) drops the stale frames,
    # as a pacing encoder does; a generator that must hold its average rate (a flood, the
    # rate-paced L4S sender) sends them instead, back to back.
    catch_up: bool = False


class MediaProfile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str
    down: StreamSpec | None  # server → client
    up: StreamSpec | None  # client → server
    # The latency objective the loop defends (gaming: one-way p99 under this).
    slo_p99_ms: float | None = None


def _input(rate_kbps: float = 420) -> StreamSpec:
    return StreamSpec(rate_kbps=rate_kbps, fps=100, payload_type=97, size_cv=0.0, burst=True)


def _video(rate_mbit: float) -> StreamSpec:
    return StreamSpec(rate_kbps=rate_mbit * 1000, fps=60)


# Gaming SLO: the lab's deployment profile in the SLO table (cgloop.slo, where its source is
# given): one-way p99 on the lab's shared home bottleneck, what the loop defends.
GAMING_SLO_P99_MS = slo_table().latency_ms(LAB)

PROFILES: dict[str, MediaProfile] = {
    "gfn": MediaProfile(name="gfn", down=_video(33), up=_input(), slo_p99_ms=GAMING_SLO_P99_MS),
    "std": MediaProfile(name="std", down=_video(27.5), up=_input(), slo_p99_ms=GAMING_SLO_P99_MS),
    "psn": MediaProfile(name="psn", down=_video(23), up=_input(), slo_p99_ms=GAMING_SLO_P99_MS),
    "xc": MediaProfile(name="xc", down=_video(13), up=_input(), slo_p99_ms=GAMING_SLO_P99_MS),
    # A light gaming-like profile for tests on a busy 2-core machine: same cadence, lower rate.
    "test": MediaProfile(name="test", down=_video(4), up=_input(), slo_p99_ms=GAMING_SLO_P99_MS),
    # Video call: 30 fps video both ways (~1.5 Mbit/s), frames paced, no latency contract here.
    "video-call": MediaProfile(
        name="video-call",
        down=StreamSpec(rate_kbps=1500, fps=30, burst=False, size_cv=0.3),
        up=StreamSpec(rate_kbps=1500, fps=30, burst=False, size_cv=0.3),
    ),
}

GAMING_PLATFORMS = ("gfn", "std", "psn", "xc")


def ect1_abuser(rate_mbit: float, burst_packets: int = 4) -> StreamSpec:
    """An unresponsive UDP flow marked ECT(1): claims the L4S low-latency class, ignores CE.

    It sends `burst_packets` back to back per send event (unpaced micro-bursts, MOSAICO §2.3.2).
    """
    return unresponsive_udp(rate_mbit, burst_packets, tos=0x01)


def l4s_sender(rate_mbit: float) -> MediaProfile:
    """A responsive L4S sender: paced ECT(1) UDP at up to `rate_mbit` that halves its rate on
    CE (echoed by its peer every 10 ms) and grows back by 2 % of it per reaction interval."""
    payload = 1200
    return MediaProfile(
        name="l4s",
        down=StreamSpec(
            rate_kbps=rate_mbit * 1000, fps=max(rate_mbit * 1e6 / 8 / payload / 4, 1.0),
            payload_max=payload, burst=False, size_cv=0.0, tos=0x01, payload_type=101,
            responsive=True, catch_up=True,
        ),
        up=StreamSpec(rate_kbps=64, fps=100, payload_max=80, size_cv=0.0, ce_echo=True,
                      payload_type=102),
    )


def unresponsive_udp(rate_mbit: float, burst_packets: int, tos: int = 0) -> StreamSpec:
    """UDP at `rate_mbit` in bursts of `burst_packets` back to back, deaf to congestion; `tos`
    0 (not ECT) is a classic flood, 0x01 (ECT(1)) an L4S abuser."""
    payload = 1200
    pps = rate_mbit * 1e6 / 8 / payload
    return StreamSpec(
        rate_kbps=rate_mbit * 1000,
        fps=max(pps / burst_packets, 1.0),
        payload_max=payload,
        burst=True,
        size_cv=0.0,
        tos=tos,
        payload_type=100,
        catch_up=True,
    )
