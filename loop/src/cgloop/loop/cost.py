"""What the node agent costs while the loop runs: the CPU of each of its threads (the 1 ms queue
sampler among them) and the run time of its BPF programs (the classifier, with RFC 9957 queue
protection inside it, and the queue monitor's qdisc tracepoint programs).

Threads' CPU (user + system) and names are read with psutil. BPF run time is counted
by the kernel only while statistics are enabled: `BPF_ENABLE_STATS` returns a file descriptor
that keeps them on while it is open (reference counted, so other users' `kernel.bpf_stats_enabled`
is left as it was), and `bpftool prog show` reads each program's `run_time_ns`/`run_cnt`; the
agent's own programs (out of every lab's) are those its descriptors and links name in
`/proc/<pid>/fdinfo`.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import re
import subprocess
import time
from pathlib import Path

import psutil
from pydantic import BaseModel

_SYS_BPF = 321  # x86_64
_BPF_ENABLE_STATS = 32
_BPF_STATS_RUN_TIME = 0
# Thread names of the queue monitor's sampler (the agent names its threads; see
# actuators/node-agent/src/qmon.rs). Any thread whose name matches counts as the sampler.
SAMPLER_THREADS = re.compile(r"queue-mon|qmon|sampler", re.IGNORECASE)
# The agent's BPF programs the micro loop adds or runs in: the classifier (queue protection,
# the ECN rule, CE marking) and the monitor's tracepoint programs.
MICRO_LOOP_PROGRAMS = re.compile(r"classify|qmon|qdisc|enq|deq", re.IGNORECASE)


class ProgramCost(BaseModel):
    runs: int
    run_time_ns: int
    pct_of_core: float
    ns_per_run: float | None


class AgentCost(BaseModel):
    wall_s: float
    agent_pct_of_core: float
    threads_pct_of_core: dict[str, float]
    sampler_pct_of_core: float | None  # None: no thread named like the sampler
    programs: dict[str, ProgramCost]
    bpf_stats: bool  # False: run time could not be counted (no bpftool, no permission)

    @property
    def micro_loop_pct_of_core(self) -> float | None:
        """The sampler thread plus the micro loop's BPF programs, in % of one core."""
        if self.sampler_pct_of_core is None:
            return None
        bpf = sum(
            p.pct_of_core for n, p in self.programs.items() if MICRO_LOOP_PROGRAMS.search(n)
        )
        return self.sampler_pct_of_core + bpf


def thread_cpu(pid: int) -> dict[str, float]:
    """CPU seconds (user + system) per thread name of `pid`; threads of one name are summed."""
    out: dict[str, float] = {}
    for t in psutil.Process(pid).threads():
        try:
            name = psutil.Process(t.id).name()  # a thread id is a Process to psutil on Linux
        except psutil.NoSuchProcess:
            continue  # the thread ended
        out[name] = out.get(name, 0.0) + t.user_time + t.system_time
    return out


def held_programs(pid: int) -> set[int]:
    """Ids of the BPF programs `pid` holds: its program descriptors and the programs of its
    links (`prog_id:` in /proc/<pid>/fdinfo/*)."""
    ids: set[int] = set()
    for info in Path(f"/proc/{pid}/fdinfo").iterdir():
        try:
            text = info.read_text()
        except OSError:
            continue  # closed meanwhile
        for line in text.splitlines():
            if line.startswith("prog_id:"):
                ids.add(int(line.split()[1]))
    return ids


def program_stats(pid: int) -> dict[str, tuple[int, int]] | None:
    """(run_cnt, run_time_ns) per name of the BPF programs `pid` holds; None without bpftool."""
    try:
        held = held_programs(pid)
        text = subprocess.run(
            ["bpftool", "-j", "prog", "show"], capture_output=True, text=True, check=True,
            timeout=10,
        ).stdout
        progs = json.loads(text or "[]")
    except (OSError, subprocess.SubprocessError, ValueError):
        return None
    out: dict[str, tuple[int, int]] = {}
    for p in progs:
        if p.get("id") not in held:
            continue
        name = p.get("name", f"id{p.get('id')}")
        runs, ns = out.get(name, (0, 0))
        out[name] = (runs + int(p.get("run_cnt", 0)), ns + int(p.get("run_time_ns", 0)))
    return out


def _enable_bpf_stats() -> int | None:
    """A file descriptor that keeps BPF run-time statistics on while open; None if refused."""
    libc = ctypes.CDLL(None, use_errno=True)
    attr = ctypes.c_uint32(_BPF_STATS_RUN_TIME)
    fd = libc.syscall(_SYS_BPF, _BPF_ENABLE_STATS, ctypes.byref(attr), ctypes.sizeof(attr))
    return fd if fd >= 0 else None


class CostMeter:
    """`start()` before the measured span, `stop()` after it: the agent's cost in between."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self._fd: int | None = None
        self._t0 = 0.0
        self._threads: dict[str, float] = {}
        self._progs: dict[str, tuple[int, int]] | None = None
        self._stats_on = False

    def start(self) -> None:
        self._fd = _enable_bpf_stats()
        self._stats_on = self._fd is not None
        self._t0 = time.monotonic()
        self._threads = thread_cpu(self.pid)
        self._progs = program_stats(self.pid)

    def stop(self) -> AgentCost:
        wall = max(time.monotonic() - self._t0, 1e-9)
        threads = thread_cpu(self.pid)
        progs = program_stats(self.pid)
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None
        pct = {n: 100.0 * (t - self._threads.get(n, 0.0)) / wall for n, t in threads.items()}
        sampler = [v for n, v in pct.items() if SAMPLER_THREADS.search(n)]
        programs = {}
        for name, (runs, ns) in (progs or {}).items():
            runs0, ns0 = (self._progs or {}).get(name, (0, 0))
            d_runs, d_ns = runs - runs0, ns - ns0
            programs[name] = ProgramCost(
                runs=d_runs, run_time_ns=d_ns, pct_of_core=100.0 * d_ns / 1e9 / wall,
                ns_per_run=d_ns / d_runs if d_runs else None,
            )
        return AgentCost(
            wall_s=wall,
            agent_pct_of_core=sum(pct.values()),
            threads_pct_of_core={n: round(v, 3) for n, v in sorted(pct.items())},
            sampler_pct_of_core=sum(sampler) if sampler else None,
            programs=programs,
            bpf_stats=self._stats_on and progs is not None and self._progs is not None,
        )
