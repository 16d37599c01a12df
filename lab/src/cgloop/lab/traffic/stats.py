"""Per-packet one-way measurements and their summaries (percentiles, loss, jitter).

Sender and receiver run on one machine: the sender stamps CLOCK_REALTIME into each packet just
before sendto(), the receiving kernel stamps CLOCK_REALTIME on arrival (SO_TIMESTAMPNS), so
`recv_ns - send_ns` is the exact one-way delay through the lab, including every queue.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from pydantic import BaseModel

PERCENTILES = (50.0, 90.0, 99.0, 99.9)


class DelaySummary(BaseModel):
    packets: int
    expected: int
    lost: int
    loss_pct: float
    p50_ms: float | None
    p90_ms: float | None
    p99_ms: float | None
    p999_ms: float | None
    max_ms: float | None
    jitter_ms: float | None  # RFC 3550 interarrival jitter, at the end of the window
    rate_mbit: float | None  # received payload rate over the window


class Packets:
    """Columns of received packets: extended sequence, send/receive times, payload size."""

    def __init__(
        self, seq: np.ndarray, send_ns: np.ndarray, recv_ns: np.ndarray, size: np.ndarray
    ) -> None:
        order = np.argsort(seq, kind="stable")
        self.seq, self.send_ns = seq[order], send_ns[order]
        self.recv_ns, self.size = recv_ns[order], size[order]

    @classmethod
    def load(cls, path: Path) -> Packets:
        with np.load(path) as z:
            return cls(z["seq"], z["send_ns"], z["recv_ns"], z["size"])

    def save(self, path: Path) -> None:
        np.savez(path, seq=self.seq, send_ns=self.send_ns, recv_ns=self.recv_ns, size=self.size)

    def __len__(self) -> int:
        return len(self.seq)

    def window(self, start_ns: int | None = None, end_ns: int | None = None) -> Packets:
        """Packets SENT in [start_ns, end_ns)."""
        keep = np.ones(len(self.seq), dtype=bool)
        if start_ns is not None:
            keep &= self.send_ns >= start_ns
        if end_ns is not None:
            keep &= self.send_ns < end_ns
        return Packets(self.seq[keep], self.send_ns[keep], self.recv_ns[keep], self.size[keep])

    def summary(self, sent: int | None = None, first_seq: int = 0) -> DelaySummary:
        """Summary of these packets; loss counts the sequence numbers missing between the first
        and last received, or from `first_seq` to `sent` when the sender's count is known."""
        n = len(self.seq)
        if sent is not None:
            expected = max(sent - first_seq, n)
        elif n:
            expected = int(self.seq[-1] - self.seq[0] + 1)
        else:
            expected = 0
        if n == 0:
            return DelaySummary(
                packets=0,
                expected=expected,
                lost=expected,
                loss_pct=100.0 if expected else 0.0,
                p50_ms=None,
                p90_ms=None,
                p99_ms=None,
                p999_ms=None,
                max_ms=None,
                jitter_ms=None,
                rate_mbit=None,
            )
        unique = len(np.unique(self.seq))
        lost = max(expected - unique, 0)
        delay_ms = (self.recv_ns - self.send_ns) / 1e6
        p50, p90, p99, p999 = np.percentile(delay_ms, PERCENTILES)
        span_ns = int(self.recv_ns.max() - self.recv_ns.min())
        rate = float(self.size.sum()) * 8 / (span_ns / 1e9) / 1e6 if span_ns > 0 else None
        return DelaySummary(
            packets=n,
            expected=expected,
            lost=lost,
            loss_pct=100.0 * lost / expected if expected else 0.0,
            p50_ms=float(p50),
            p90_ms=float(p90),
            p99_ms=float(p99),
            p999_ms=float(p999),
            max_ms=float(delay_ms.max()),
            jitter_ms=rfc3550_jitter_ms(self.send_ns, self.recv_ns),
            rate_mbit=rate,
        )


def rfc3550_jitter_ms(send_ns: np.ndarray, recv_ns: np.ndarray) -> float | None:
    """J += (|D(i-1,i)| - J) / 16 over packets in arrival order (RFC 3550 §6.4.1)."""
    if len(send_ns) < 2:
        return None
    order = np.argsort(recv_ns, kind="stable")
    transit = (recv_ns[order] - send_ns[order]).astype(np.float64)
    d = np.abs(np.diff(transit))
    j = 0.0
    for x in d:  # a recursive filter: no closed vectorised form worth the obscurity
        j += (x - j) / 16.0
    return j / 1e6
