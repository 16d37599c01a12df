"""The agent's cost as the benchmark measures it: per-thread CPU (psutil), and the run time of
the BPF programs a process holds (root: a program is loaded and run through BPF_PROG_TEST_RUN)."""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
import time

import pytest
from cgloop.loop.cost import CostMeter, held_programs

SPIN = "import time\nt = time.monotonic()\nwhile time.monotonic() - t < 5: pass\n"


def _cost_of(script: str, settle_s: float):
    """The cost meter over one second of a child running `script`, once it has started."""
    child = subprocess.Popen([sys.executable, "-c", script])
    try:
        time.sleep(settle_s)
        meter = CostMeter(child.pid)
        meter.start()
        time.sleep(1.0)
        return meter.stop()
    finally:
        child.kill()
        child.wait()


def test_thread_cpu_of_a_busy_process() -> None:
    cost = _cost_of(SPIN, 0.2)
    # one thread spinning: about one core (a busy 2-core machine may give it less)
    assert 30 < cost.agent_pct_of_core <= 110, cost
    assert cost.sampler_pct_of_core is None  # no thread named like the queue monitor
    assert cost.micro_loop_pct_of_core is None


NAMED_SPIN = """
import ctypes, threading, time
def spin():
    ctypes.CDLL(None).prctl(15, b"queue-monitor", 0, 0, 0)  # PR_SET_NAME: the OS thread name
    t = time.monotonic()
    while time.monotonic() - t < 5: pass
threading.Thread(target=spin).start()
"""


def test_a_thread_named_like_the_sampler_is_the_sampler() -> None:
    cost = _cost_of(NAMED_SPIN, 0.3)
    assert "queue-monitor" in cost.threads_pct_of_core, cost
    assert cost.sampler_pct_of_core is not None and 30 < cost.sampler_pct_of_core <= 110, cost
    # the spinning thread is nearly all of the process
    assert cost.sampler_pct_of_core > 0.8 * cost.agent_pct_of_core, cost


class _TestRun(ctypes.Structure):
    _fields_ = [
        ("prog_fd", ctypes.c_uint32), ("retval", ctypes.c_uint32),
        ("data_size_in", ctypes.c_uint32), ("data_size_out", ctypes.c_uint32),
        ("data_in", ctypes.c_uint64), ("data_out", ctypes.c_uint64),
        ("repeat", ctypes.c_uint32), ("duration", ctypes.c_uint32),
    ]


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root (bpf)")
def test_bpf_run_time_of_held_programs() -> None:
    from cgloop.lab.bpf import load_sched_cls, loss_program

    fd = load_sched_cls(loss_program(0.5), "cgl_cost_test")
    try:
        assert held_programs(os.getpid()), "the loaded program is not seen as held"
        meter = CostMeter(os.getpid())
        meter.start()
        packet = ctypes.create_string_buffer(64)  # an Ethernet frame's worth of zeros
        attr = _TestRun(prog_fd=fd, data_size_in=64, data_in=ctypes.addressof(packet),
                        repeat=1000)
        libc = ctypes.CDLL(None, use_errno=True)
        rc = libc.syscall(321, 10, ctypes.byref(attr), ctypes.sizeof(attr))  # BPF_PROG_TEST_RUN
        assert rc == 0, os.strerror(ctypes.get_errno())
        cost = meter.stop()
    finally:
        os.close(fd)
    assert cost.bpf_stats, cost
    prog = cost.programs["cgl_cost_test"]
    assert prog.runs == 1000 and prog.run_time_ns > 0, prog
