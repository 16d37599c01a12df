"""Background processes the stack owns: started detached, tracked by pid file, stopped cleanly.

Each process runs in its own session (process group), so stopping it also stops whatever it
spawned: no orphans. The pid file records the process start time too, so a recycled pid is
never mistaken for our process.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

_CLK_TCK = os.sysconf("SC_CLK_TCK")


def _start_ticks(pid: int) -> int | None:
    """Process start time in clock ticks since boot, None if there is no such process.

    psutil's create_time() is the boot time plus the start since boot: taking the boot time
    off again gives a value no clock adjustment changes, kept in the pid file."""
    try:
        return round((psutil.Process(pid).create_time() - psutil.boot_time()) * _CLK_TCK)
    except psutil.Error:
        return None


def _running(pid: int) -> bool:
    """True while `pid` exists and is not a zombie."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


@dataclass
class ManagedProcess:
    name: str
    run_dir: Path  # pid and log files live here

    @property
    def pid_file(self) -> Path:
        return self.run_dir / f"{self.name}.pid"

    @property
    def log_file(self) -> Path:
        return self.run_dir / f"{self.name}.log"

    def pid(self) -> int | None:
        """The pid if our process is alive, else None (and a stale pid file is removed)."""
        try:
            info = json.loads(self.pid_file.read_text())
        except (OSError, ValueError):
            return None
        pid, ticks = info.get("pid"), info.get("start_ticks")
        ours = isinstance(pid, int) and ticks is not None and _start_ticks(pid) == ticks
        if ours and _running(pid):
            return pid
        self.pid_file.unlink(missing_ok=True)
        return None

    def start(
        self, cmd: list[str], env: dict[str, str] | None = None, cwd: Path | None = None
    ) -> int:
        if (pid := self.pid()) is not None:
            return pid
        self.run_dir.mkdir(parents=True, exist_ok=True)
        with self.log_file.open("ab") as log:
            log.write(
                f"\n--- {time.strftime('%Y-%m-%d %H:%M:%S')} starting: {' '.join(cmd)}\n".encode()
            )
            log.flush()
            proc = subprocess.Popen(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**os.environ, **(env or {})},
                cwd=cwd,
                start_new_session=True,
            )
        self.pid_file.write_text(
            json.dumps({"pid": proc.pid, "start_ticks": _start_ticks(proc.pid), "cmd": cmd})
        )
        self._popen = proc  # keeps the child reapable while this process lives
        return proc.pid

    def exited(self) -> bool:
        """True if a process we started in this Python process has already exited."""
        proc = getattr(self, "_popen", None)
        return proc is not None and proc.poll() is not None

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_file.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def stop(self, timeout_s: float = 20) -> bool:
        """SIGTERM the process group, wait, then SIGKILL. True if something was running."""
        pid = self.pid()
        if pid is None:
            return False
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and self._group_alive(pid):
            self._reap()
            time.sleep(0.1)
        if self._group_alive(pid):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
            while self._group_alive(pid):
                self._reap()
                time.sleep(0.05)
        self._reap()
        self.pid_file.unlink(missing_ok=True)
        return True

    def _reap(self) -> None:
        proc = getattr(self, "_popen", None)
        if proc is not None:
            proc.poll()

    @staticmethod
    def _group_alive(pgid: int) -> bool:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        # A group of only zombies is as good as gone.
        for proc in psutil.process_iter(["status"]):
            with contextlib.suppress(OSError):
                if os.getpgid(proc.pid) == pgid and proc.info["status"] != psutil.STATUS_ZOMBIE:
                    return True
        return False
