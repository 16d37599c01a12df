"""Web-like traffic: short TCP transfers of heavy-tailed sizes separated by think times.

The client fetches objects whose sizes follow a bounded Pareto distribution (most pages small,
a few large) and pauses an exponential think time between fetches; each fetch opens a new TCP
connection, so the bottleneck sees slow-start bursts rather than one long flow.
"""

from __future__ import annotations

import http.client
import json
import random
import signal
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlparse

import numpy as np

MAX_OBJECT = 8 << 20
_CHUNK = bytes(64 << 10)


class _Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        try:
            size = int(parse_qs(urlparse(self.path).query).get("size", ["0"])[0])
        except ValueError:
            size = -1
        if not 0 <= size <= MAX_OBJECT:
            self.send_error(400, f"size must be an integer in [0, {MAX_OBJECT}]")
            return
        self.send_response(200)
        self.send_header("Content-Length", str(size))
        self.end_headers()
        left = size
        while left > 0:
            n = min(left, len(_CHUNK))
            self.wfile.write(_CHUNK[:n])
            left -= n

    def log_message(self, *args) -> None:  # quiet: thousands of requests per run
        pass


def serve(bind: tuple[str, int]) -> None:
    server = ThreadingHTTPServer(bind, _Handler)
    server.daemon_threads = True
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=server.shutdown).start())
    server.serve_forever(poll_interval=0.2)


def fetch_loop(
    server: tuple[str, int],
    duration: float,
    out: Path | None,
    mean_think_s: float = 0.3,
    pareto_alpha: float = 1.2,
    min_bytes: int = 8_000,
    seed: int | None = None,
    stop: threading.Event | None = None,
) -> dict:
    rng = random.Random(seed)
    stop = stop or threading.Event()
    end = time.monotonic() + duration
    times_ms, sizes, errors = [], [], 0
    while not stop.is_set() and time.monotonic() < end:
        size = min(int(min_bytes * rng.paretovariate(pareto_alpha)), MAX_OBJECT)
        t0 = time.perf_counter()
        try:
            conn = http.client.HTTPConnection(*server, timeout=10)
            conn.request("GET", f"/obj?size={size}")
            resp = conn.getresponse()
            body = resp.read()
            conn.close()
            if resp.status != 200 or len(body) != size:
                errors += 1
            else:
                times_ms.append((time.perf_counter() - t0) * 1000)
                sizes.append(size)
        except OSError:
            errors += 1
        stop.wait(rng.expovariate(1.0 / mean_think_s))
    arr = np.array(times_ms) if times_ms else np.array([np.nan])
    result = {
        "fetches": len(times_ms),
        "errors": errors,
        "bytes": int(sum(sizes)),
        "fetch_ms": {
            "p50": float(np.nanpercentile(arr, 50)),
            "p90": float(np.nanpercentile(arr, 90)),
            "p99": float(np.nanpercentile(arr, 99)),
            "max": float(np.nanmax(arr)),
        }
        if times_ms
        else None,
    }
    if out:
        out.parent.mkdir(parents=True, exist_ok=True)
        (out.parent / f"{out.name}.json").write_text(json.dumps(result, indent=1))
    return result
