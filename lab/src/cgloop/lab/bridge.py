"""A loopback bridge from a lab namespace to the host's loopback (Kafka, the store).

Processes inside a lab namespace (the probe and the node agent on the edge) must reach the broker
and the store, which listen on the host's 127.0.0.1, while the lab creates nothing in the host
namespace. The bridge runs inside the lab namespace (so `down` stops it with the rest), opens its
listening sockets there on 127.0.0.1:PORT, then moves its own thread into the upstream namespace
(the one of the process that started it) and connects each accepted connection to 127.0.0.1:PORT
there. A socket keeps the namespace it was created in, so after `setns` the listeners still serve
the lab and every upstream connection is made in the host. Same port numbers on both sides: the
broker's advertised address `127.0.0.1:PORT` is right in both namespaces, with no client settings.

    python -m cgloop.lab.bridge --upstream-pid PID --port 19092 --port 18123
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import errno
import logging
import os
import signal
import socket
import sys
import time

from cgloop.lab.procs import enter_netns

log = logging.getLogger("cgloop.lab.bridge")
_CHUNK = 256 * 1024


def listen(port: int, timeout_s: float = 5.0) -> socket.socket:
    # A namespace made a moment ago may not have 127.0.0.1 on its loopback yet: retry briefly.
    deadline = time.monotonic() + timeout_s
    while True:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
            break
        except OSError as exc:
            sock.close()
            if exc.errno != errno.EADDRNOTAVAIL or time.monotonic() > deadline:
                raise OSError(exc.errno, f"binding 127.0.0.1:{port}: {exc.strerror}") from None
            time.sleep(0.1)
    sock.listen(128)
    sock.setblocking(False)
    return sock


def enter_netns_of(pid: int) -> None:
    """Move the calling thread into the network namespace of `pid`."""
    fd = os.open(f"/proc/{pid}/ns/net", os.O_RDONLY)
    try:
        enter_netns(fd, f"the network namespace of pid {pid}")
    finally:
        os.close(fd)


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(_CHUNK):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        with contextlib.suppress(Exception):
            writer.close()


def _handler(port: int):
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", port)
        except OSError as exc:
            log.warning("port %d: upstream 127.0.0.1:%d refused: %s", port, port, exc)
            writer.close()
            return
        for w in (writer, up_writer):
            sock = w.get_extra_info("socket")
            if sock is not None:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))

    return handle


async def serve(listeners: dict[int, socket.socket]) -> None:
    servers = [
        await asyncio.start_server(_handler(port), sock=sock) for port, sock in listeners.items()
    ]
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    print(f"bridge ready: ports {', '.join(map(str, listeners))}", flush=True)
    await stop.wait()
    for s in servers:
        s.close()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m cgloop.lab.bridge", description=__doc__)
    p.add_argument("--upstream-pid", type=int, required=True,
                   help="a process in the namespace the ports are forwarded to")
    p.add_argument("--port", type=int, action="append", required=True, help="repeat")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    try:
        listeners = {port: listen(port) for port in args.port}
        enter_netns_of(args.upstream_pid)
    except OSError as exc:
        print(f"bridge: {exc}", file=sys.stderr)
        return 1
    asyncio.run(serve(listeners))
    return 0


if __name__ == "__main__":
    sys.exit(main())
