"""The loopback bridge on the real kernel: started in a namespace of its own with
`procs.spawn` (setns between fork and exec), it moves into the host's namespace and forwards
a connection made to 127.0.0.1:PORT inside the namespace to 127.0.0.1:PORT on the host.
Also: a bridge asked to join the namespace of a pid that does not exist says so."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

pytestmark = [
    pytest.mark.root,
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root (network namespaces)"),
    pytest.mark.timeout(60),
]

from cgloop.lab import procs  # noqa: E402
from cgloop.lab.lab import in_netns  # noqa: E402
from cgloop.testing import free_port  # noqa: E402


@pytest.fixture
def netns_name():
    name = f"cgl-bridge-{os.getpid()}"
    subprocess.run(["ip", "netns", "add", name], check=True)
    subprocess.run(["ip", "-n", name, "link", "set", "lo", "up"], check=True)
    try:
        yield name
    finally:
        procs.stop([(p, None) for p in procs.pids_in_netns(name)], grace=2)
        subprocess.run(["ip", "netns", "del", name], check=False)


def test_bridge_forwards_from_a_namespace_to_the_host(netns_name: str, tmp_path: Path):
    port = free_port()
    host = socket.create_server(("127.0.0.1", port))
    got: list[bytes] = []

    def serve() -> None:
        conn, _ = host.accept()
        with conn:
            data = conn.recv(64)
            got.append(data)
            conn.sendall(data.upper())

    threading.Thread(target=serve, daemon=True).start()
    log = tmp_path / "bridge.log"
    bridge = procs.spawn(netns_name, [sys.executable, "-m", "cgloop.lab.bridge",
                                      "--upstream-pid", str(os.getpid()), "--port", str(port)],
                         log=log)
    try:
        deadline = time.monotonic() + 20
        while "bridge ready" not in log.read_text() and time.monotonic() < deadline:
            assert bridge.poll() is None, log.read_text()
            time.sleep(0.05)
        # Its listener is in the namespace (spawn's setns took: on the host the port is the
        # server's), and its thread is in the host now (bridge's setns took: the server is
        # reached through it).

        def talk() -> bytes:
            with socket.create_connection(("127.0.0.1", port), timeout=5) as c:
                c.sendall(b"ping")
                return c.recv(64)

        assert in_netns(netns_name, talk) == b"PING"
        assert got == [b"ping"]
    finally:
        procs.stop([(bridge.pid, procs.start_ticks(bridge.pid))], grace=2)
        host.close()


def test_bridge_names_the_pid_it_cannot_join():
    gone = subprocess.Popen(["true"])
    gone.wait()
    out = subprocess.run(
        [sys.executable, "-m", "cgloop.lab.bridge", "--upstream-pid", str(gone.pid),
         "--port", str(free_port())], capture_output=True, text=True, timeout=30,
    )
    assert out.returncode == 1
    assert f"pid {gone.pid}" in out.stderr or str(gone.pid) in out.stderr, out.stderr
