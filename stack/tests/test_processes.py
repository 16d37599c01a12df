"""Managed processes are tracked by pid file and stopped as a whole process group."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from cgloop.stack.processes import ManagedProcess


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_stop_ends_the_process_and_its_children(tmp_path: Path) -> None:
    proc = ManagedProcess("tree", tmp_path)
    pid = proc.start(["sh", "-c", "sleep 300 & echo $! > child.pid; wait"], cwd=tmp_path)
    deadline = time.monotonic() + 5
    # the shell creates the file before it writes the pid (CI once read it empty)
    written = tmp_path / "child.pid"
    while time.monotonic() < deadline and not (
        written.exists() and written.read_text().strip()
    ):
        time.sleep(0.05)
    child = int(written.read_text())
    assert proc.pid() == pid and _alive(child)
    assert proc.start(["sleep", "1"]) == pid  # already running: no second copy
    assert proc.stop(timeout_s=5)
    assert not _alive(pid) and not _alive(child)
    assert proc.pid() is None and not proc.pid_file.exists()
    assert not proc.stop()  # nothing left to stop


def test_a_recycled_pid_is_not_mistaken_for_ours(tmp_path: Path) -> None:
    proc = ManagedProcess("ghost", tmp_path)
    # Our own pid is alive, but it started at another time than the file claims.
    proc.pid_file.write_text(json.dumps({"pid": os.getpid(), "start_ticks": 1}))
    assert proc.pid() is None
    assert not proc.pid_file.exists()


def test_garbage_pid_file_is_ignored(tmp_path: Path) -> None:
    proc = ManagedProcess("junk", tmp_path)
    proc.pid_file.write_text("not json")
    assert proc.pid() is None


def test_log_tail_shows_what_the_process_printed(tmp_path: Path) -> None:
    proc = ManagedProcess("talker", tmp_path)
    proc.start(["sh", "-c", "echo first; echo last"])
    deadline = time.monotonic() + 5
    while not proc.exited() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert proc.log_tail(2).splitlines() == ["first", "last"]


def test_a_pid_file_with_the_kernels_start_ticks_names_our_process(tmp_path: Path) -> None:
    """Start ticks are the kernel's (field 22 of /proc/PID/stat), so a pid file written by an
    earlier cgloop, which read that field itself, still finds the running process."""
    proc = ManagedProcess("sleeper", tmp_path)
    pid = proc.start(["sleep", "30"])
    try:
        ticks = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
        assert json.loads(proc.pid_file.read_text())["start_ticks"] == ticks
        proc.pid_file.write_text(json.dumps({"pid": pid, "start_ticks": ticks}))
        assert proc.pid() == pid
    finally:
        proc.stop(timeout_s=5)
