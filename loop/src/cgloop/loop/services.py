"""Every cgloop service of the closed loop, started where it belongs, stopped together.

On the lab, the kernel-facing services run inside the edge node's namespace (the flow probe on
the edge's interfaces, the node agent on its bottleneck queue) and reach the broker through the
lab's loopback bridge (`cgloop.lab.bridge`); the UDP echo reflectors run on the gaming clients;
analytics and the policy engine run beside the broker. Lab processes are recorded in the lab's
state, so `cgloop lab down` stops them even after a crash; host processes are this object's
children, each in its own process group.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from cgloop.binaries import find_binary
from cgloop.config import Settings, kafka_client_config
from cgloop.lab.lab import Lab

REFLECT_PORT = 7799


class ServiceError(RuntimeError):
    """A service did not start; the text names it and quotes its log."""


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


@dataclass
class Service:
    name: str
    proc: subprocess.Popen
    log: Path
    in_lab: bool
    # Where this process's output starts in its log: logs are appended across runs, and a
    # readiness line an earlier run wrote must not pass for this one's.
    log_start: int = 0

    def alive(self) -> bool:
        return self.proc.poll() is None

    def output(self) -> str:
        """What this process has written to its log so far."""
        try:
            with open(self.log, "rb") as f:
                f.seek(self.log_start)
                return f.read().decode(errors="replace")
        except OSError:
            return ""

    def tail(self, lines: int = 15) -> str:
        return "\n".join(self.output().splitlines()[-lines:]) or "(no log)"


@dataclass
class Services:
    """The running services; `stop()` ends them in reverse start order."""

    lab: Lab | None
    log_dir: Path
    started: list[Service] = field(default_factory=list)

    def spawn_lab(self, node: str, name: str, argv: list[str]) -> Service:
        assert self.lab is not None
        log = self.log_dir / f"{name}.log"
        start = _size(log)
        proc = self.lab.spawn(node, argv, role=f"loop-{name}", log=log)
        svc = Service(name, proc, log, in_lab=True, log_start=start)
        self.started.append(svc)
        return svc

    def spawn_host(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> Service:
        log = self.log_dir / f"{name}.log"
        start = _size(log)
        with open(log, "ab") as out:
            proc = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True, env={**os.environ, **(env or {})},
            )
        svc = Service(name, proc, log, in_lab=False, log_start=start)
        self.started.append(svc)
        return svc

    def wait_for(self, svc: Service, ready: Callable[[], bool], timeout_s: float) -> None:
        """Wait until `ready()`; a service that exits or stays unready is a ServiceError."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not svc.alive():
                raise ServiceError(
                    f"{svc.name} exited with status {svc.proc.returncode}; its log "
                    f"({svc.log}) ends with:\n{svc.tail()}"
                )
            try:
                if ready():
                    return
            except Exception:  # not ready yet, whatever the reason
                pass
            time.sleep(0.1)
        raise ServiceError(
            f"{svc.name} not ready after {timeout_s:.0f} s; its log ({svc.log}) ends with:\n"
            f"{svc.tail()}"
        )

    def log_says(self, svc: Service, text: str) -> Callable[[], bool]:
        return lambda: text in svc.output()

    def check(self) -> list[str]:
        """Services that died, with the end of their logs."""
        return [
            f"{s.name} exited ({s.proc.returncode}): {s.tail(5)}"
            for s in self.started
            if not s.alive()
        ]

    def stop(self, grace_s: float = 5.0) -> None:
        for svc in reversed(self.started):
            if svc.alive():
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(svc.proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for svc in reversed(self.started):
            try:
                svc.proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(svc.proc.pid, signal.SIGKILL)
                svc.proc.wait(5)
        if self.lab is not None:
            self.lab.forget([s.proc.pid for s in self.started if s.in_lab])
        self.started.clear()


def python_module(module: str, *args: str) -> list[str]:
    return [sys.executable, "-m", module, *args]


def cgloop_exe() -> str:
    """The `cgloop` console script of this environment."""
    exe = Path(sys.executable).parent / "cgloop"
    return str(exe) if exe.exists() else shutil.which("cgloop") or "cgloop"


def bridge_argv(settings: Settings) -> list[str]:
    return python_module(
        "cgloop.lab.bridge", "--upstream-pid", str(os.getpid()),
        "--port", str(settings.kafka_port), "--port", str(settings.store_port),
    )


def agent_binary() -> Path:
    return find_binary("cgloop-node-agent")


def probe_binary() -> Path:
    return find_binary("cgloop-probe")


def group_ready(bootstrap: str, group: str, members: int = 1) -> Callable[[], bool]:
    """True once consumer group `group` is stable with at least `members` members, partitions
    assigned to them."""
    from confluent_kafka import ConsumerGroupState
    from confluent_kafka.admin import AdminClient

    admin = AdminClient(kafka_client_config(bootstrap))

    def ready() -> bool:
        desc = admin.describe_consumer_groups([group], request_timeout=5)[group].result(10)
        return (
            desc.state == ConsumerGroupState.STABLE and len(desc.members) >= members
            and any(m.assignment.topic_partitions for m in desc.members)
        )

    return ready


def group_caught_up(
    bootstrap: str, group: str, topics: tuple[str, ...]
) -> Callable[[], bool]:
    """True once consumer group `group` has committed, on every partition of `topics`, at least
    the end offsets those partitions had when first asked: the backlog written before its
    members started is handled. A new group reads its topics from the start; until it has
    caught up, what it detects is seconds old (a worker that loaded its model on a busy
    machine met the first fault 9 s behind)."""
    from cgloop.bus.kafka import GroupOffsets

    offsets = GroupOffsets(bootstrap, group)
    ends: dict[tuple[str, int], int] = {}

    def ready() -> bool:
        if not ends:
            parts = offsets.partitions(topics, timeout_s=5)
            if not parts:
                return True
            ends.update(offsets.ends(parts, timeout_s=5))
        todo = {k: v for k, v in ends.items() if v > 0}
        if not todo:
            return True
        done = offsets.committed(todo, timeout_s=10)
        return all(done.get(k, -1) >= v for k, v in todo.items())

    return ready


def settings_env(settings: Settings) -> dict[str, str]:
    """The environment that gives a `cgloop` child process these settings."""
    env = {
        "CGLOOP_STATE_DIR": str(settings.state_dir),
        "CGLOOP_CACHE_DIR": str(settings.cache_dir),
        "CGLOOP_KAFKA_PORT": str(settings.kafka_port),
        "CGLOOP_KAFKA_CONTROLLER_PORT": str(settings.kafka_controller_port),
        "CGLOOP_STORE_PORT": str(settings.store_port),
    }
    if settings.kafka_bootstrap:
        env["CGLOOP_KAFKA_BOOTSTRAP"] = settings.kafka_bootstrap
    if settings.store_url:
        env["CGLOOP_STORE_URL"] = settings.store_url
    env.update(settings.kafka_security().env())  # the broker's credentials, if it wants them
    return env


def exit_on_sigterm() -> None:
    """Make SIGTERM unwind like Ctrl-C (finally blocks stop services and take the lab down).

    Only in this process: pyroute2 forks helpers that enter namespaces and inherit Python's
    handlers, and stops them with SIGTERM; raising SystemExit there breaks its netlink calls.
    """
    main_pid = os.getpid()

    def on_term(*_args) -> None:
        if os.getpid() != main_pid:
            os._exit(143)
        sys.exit(143)

    signal.signal(signal.SIGTERM, on_term)
