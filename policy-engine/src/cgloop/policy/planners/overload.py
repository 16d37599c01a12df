"""Overload guard: keep the offered packet rate under R_max with a margin.

Gallenmüller thesis §5.4.4.

§5.4.4, eq. 5.10: R_max = (1 s - d_sum) / t_CPU, with d_sum the CPU time spent on interrupts
per second and t_CPU the CPU time per packet (t_e2e minus 2 t_transfer, eq. 5.9). The thesis
finds it a lower bound of the real limit and advises a conservative use; overload multiplies
latency by 100 (VM) to 1000 (bare metal), so the guard keeps the load under
`margin * R_max`. T_max (§5.4) caps the rate further by the link:
T_max = min(T_ethernet, f_cpu / cycles_per_packet * size).
"""

from __future__ import annotations

from dataclasses import dataclass


def r_max_pps(t_cpu_s: float, interrupt_time_per_s: float = 0.0) -> float:
    if t_cpu_s <= 0:
        raise ValueError("t_cpu_s must be > 0")
    if not 0 <= interrupt_time_per_s < 1:
        raise ValueError("interrupt time per second must be in [0, 1) s")
    return (1.0 - interrupt_time_per_s) / t_cpu_s


def t_cpu_from_latency(t_e2e_s: float, two_transfer_s: float) -> float:
    """Eq. 5.9: t_CPU = t_e2e - 2 t_transfer (2 t_transfer from a bare forwarder's median)."""
    return t_e2e_s - two_transfer_s


def t_max_bps(
    ethernet_bps: float, cpu_hz: float, cycles_per_packet: float, size_bits: float
) -> float:
    return min(ethernet_bps, cpu_hz / cycles_per_packet * size_bits)


@dataclass(frozen=True)
class OverloadDecision:
    r_max_pps: float
    limit_pps: float  # margin * R_max
    offered_pps: float
    overloaded: bool
    # Packet rate to shed or move elsewhere to get back under the limit (0 when fine).
    excess_pps: float

    @property
    def utilisation(self) -> float:
        return self.offered_pps / self.r_max_pps


def check_overload(
    offered_pps: float, t_cpu_s: float, interrupt_time_per_s: float = 0.0, margin: float = 0.8
) -> OverloadDecision:
    if not 0 < margin <= 1:
        raise ValueError("margin must be in (0, 1]")
    r = r_max_pps(t_cpu_s, interrupt_time_per_s)
    limit = margin * r
    excess = max(0.0, offered_pps - limit)
    return OverloadDecision(r, limit, offered_pps, offered_pps > limit, excess)
