"""Processes inside the lab's namespaces: start them there, find them again, stop them.

A process enters its namespace with setns(2) between fork and exec (no `ip netns exec`
shell-out) and leads its own session, so stopping the group also stops whatever it forked
(iperf3's children, a web server's threads). Processes are found by the inode of their network
namespace, which is how `down` catches everything even when the state file lost track.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import signal
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

import psutil
from cgloop.lab import cgroups

NETNS_RUN_DIR = Path("/var/run/netns")
_CLONE_NEWNET = 0x40000000
_CLK_TCK = os.sysconf("SC_CLK_TCK")
# setns(2) through libc: os.setns needs Python 3.12, and the workspace runs on 3.11 too.
# Loaded at import, so a child between fork and exec only calls it.
_LIBC = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)


def enter_netns(fd: int, what: str) -> None:
    """Move the calling thread into the network namespace open at `fd`; `what` names that
    namespace in the error."""
    if _LIBC.setns(fd, _CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"setns into {what}: {os.strerror(err)}")


def netns_path(netns: str) -> Path:
    return NETNS_RUN_DIR / netns


def netns_inode(netns: str) -> tuple[int, int] | None:
    try:
        st = os.stat(netns_path(netns))
    except OSError:
        return None
    return st.st_dev, st.st_ino


def _ticks(proc: psutil.Process) -> int:
    # create_time() is the boot time plus the start since boot: without the boot time, a value
    # in clock ticks that no clock adjustment changes (the kernel's own, /proc/PID/stat's 22nd)
    return round((proc.create_time() - psutil.boot_time()) * _CLK_TCK)


def start_ticks(pid: int) -> int | None:
    """The process's start time in clock ticks since boot, None if gone."""
    try:
        return _ticks(psutil.Process(pid))
    except psutil.Error:
        return None


def alive(pid: int, ticks: int | None) -> bool:
    """True while `pid` runs and is still the process that started at `ticks` (not a zombie)."""
    try:
        proc = psutil.Process(pid)
        return proc.status() != psutil.STATUS_ZOMBIE and (ticks is None or _ticks(proc) == ticks)
    except psutil.Error:
        return False


def spawn(
    netns: str,
    argv: Sequence[str],
    *,
    log: Path | None = None,
    env: dict[str, str] | None = None,
    cpus: Sequence[int] | None = None,
    cgroup: Path | None = None,
) -> subprocess.Popen:
    """Start `argv` inside namespace `netns`, in its own session; stdout+stderr go to `log`.
    With `cpus`, the process (and what it forks) may run only on those cores
    (sched_setaffinity before exec); with `cgroup`, it starts in that cgroup v2 directory."""
    fd = os.open(netns_path(netns), os.O_RDONLY)
    affinity = set(cpus) if cpus is not None else None

    def enter() -> None:
        if cgroup is not None:
            cgroups.join(cgroup)
        enter_netns(fd, f"namespace {netns}")
        if affinity is not None:
            os.sched_setaffinity(0, affinity)

    out = open(log, "ab") if log else subprocess.DEVNULL  # noqa: SIM115 - handed to the child
    try:
        return subprocess.Popen(
            list(argv),
            preexec_fn=enter,
            start_new_session=True,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {})},
        )
    finally:
        os.close(fd)
        if log:
            out.close()


def pids_in_netns(netns: str) -> list[int]:
    """Every process whose network namespace is `netns`."""
    want = netns_inode(netns)
    if want is None:
        return []
    found = []
    for pid in psutil.pids():
        try:  # psutil has no namespaces: the kernel's namespace link, stat()ed
            st = os.stat(f"/proc/{pid}/ns/net")
        except OSError:
            continue
        if (st.st_dev, st.st_ino) == want:
            found.append(pid)
    return found


def stop(
    pids: Sequence[tuple[int, int | None]], grace: float = 3.0, kill_wait: float = 5.0
) -> None:
    """SIGTERM each (pid, start ticks) and its process group, SIGKILL what survives `grace`,
    and wait up to `kill_wait` for the killed to be gone (SIGKILL is delivered asynchronously:
    on a loaded machine a killed process can still be exiting when kill() returns)."""
    live = [(pid, t) for pid, t in pids if alive(pid, t) and pid != os.getpid()]
    for pid, _ in live:
        _signal(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and any(alive(p, t) for p, t in live):
        _reap(live)
        time.sleep(0.05)
    for pid, t in live:
        if alive(pid, t):
            _signal(pid, signal.SIGKILL)
    deadline = time.monotonic() + kill_wait
    _reap(live)
    while time.monotonic() < deadline and any(alive(p, t) for p, t in live):
        time.sleep(0.02)
        _reap(live)


def _signal(pid: int, sig: int) -> None:
    try:
        if os.getpgid(pid) == pid:
            os.killpg(pid, sig)
        else:
            os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _reap(pids: Sequence[tuple[int, int | None]]) -> None:
    # Our own children become zombies until waited for; zombies still have a /proc entry.
    for pid, _ in pids:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)
