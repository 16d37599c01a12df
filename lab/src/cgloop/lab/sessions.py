"""Traffic sessions in a running lab: each starts generator processes in the right namespaces.

A session knows its processes and its output files; `stop()` ends it early (the generators
write their results on SIGTERM) and `result()` reads what they wrote.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal

from cgloop.lab import procs
from cgloop.lab.lab import Lab
from cgloop.lab.traffic.profiles import (
    PROFILES,
    MediaProfile,
    StreamSpec,
    ect1_abuser,
    l4s_sender,
    unresponsive_udp,
)
from cgloop.lab.traffic.stats import Packets
from pydantic import BaseModel, ConfigDict, Field

GENERATOR = [sys.executable, "-m", "cgloop.lab.traffic"]


@dataclass(frozen=True)
class StartSignal:
    """A start the runner fixes only once every generator is ready (its socket bound): it
    writes the instant (CLOCK_REALTIME ns) to `path`, and a generator begins sending
    `offset_s` after it. On a loaded machine a dozen Python generators can take longer to
    start than any fixed head start (an ECT(1) abuser once started after its fault had ended)."""

    path: Path
    offset_s: float = 0.0

    def fix(self, start_ns: int) -> None:
        """Publish the start (write, then rename: a generator never reads half a number)."""
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text(str(start_ns))
        os.replace(tmp, self.path)


class _Spec(BaseModel):
    model_config = ConfigDict(extra="forbid")


class GamingSpec(_Spec):
    kind: Literal["gaming"] = "gaming"
    platform: str = Field("gfn", description="a key of profiles.PROFILES")
    server: str = "gs1"
    client: str = "cl1"
    port: int = Field(49004, ge=1024, le=65535)
    # A session that starts mid-scenario (a new player): its generators are started with the
    # others, bound and silent, and begin sending `at` seconds after the traffic started.
    at: float = Field(0.0, ge=0, description="seconds after the scenario's traffic started")
    # Most platforms send their stream unmarked, so the loop must recognise it; a provider that
    # marks it (e.g. EF, 46, under an agreement with the operator) is served by the edges'
    # gaming class, and its service chain, from the first packet.
    dscp: int = Field(0, ge=0, le=63, description="DSCP the server marks its stream with")


class VideoCallSpec(_Spec):
    kind: Literal["video_call"] = "video_call"
    a: str = "apps"
    b: str = "home1"
    port: int = Field(50004, ge=1024, le=65535)


class WebSpec(_Spec):
    kind: Literal["web"] = "web"
    server: str = "apps"
    client: str = "home1"
    port: int = Field(8080, ge=1024, le=65535)


class BulkSpec(_Spec):
    kind: Literal["bulk"] = "bulk"
    src: str = "bulk"
    dst: str = "home1"
    flows: int = Field(4, ge=1, le=64)
    port: int = Field(5201, ge=1024, le=65535)


class Ect1Spec(_Spec):
    kind: Literal["ect1"] = "ect1"
    src: str = "apps"
    dst: str = "home1"
    rate_mbit: float = Field(30.0, gt=0, le=1000)
    burst_packets: int = Field(4, ge=1, le=64)
    port: int = Field(51004, ge=1024, le=65535)


class L4sSpec(_Spec):
    """A responsive L4S sender: paced ECT(1) UDP that halves its rate on CE (its peer echoes
    the CE marks it receives); the flow RFC 9957 queue protection must leave alone."""

    kind: Literal["l4s"] = "l4s"
    src: str = "apps"
    dst: str = "home1"
    rate_mbit: float = Field(5.0, gt=0, le=1000)
    port: int = Field(53004, ge=1024, le=65535)


class UdpBurstSpec(_Spec):
    """A classic (not ECT) unresponsive UDP flood in large back-to-back bursts: a queue that
    builds at once, without TCP's slow start."""

    kind: Literal["udp_burst"] = "udp_burst"
    src: str = "apps"
    dst: str = "home1"
    rate_mbit: float = Field(80.0, gt=0, le=1000)
    burst_packets: int = Field(32, ge=1, le=256)
    port: int = Field(52004, ge=1024, le=65535)


TrafficSpec = Annotated[
    GamingSpec | VideoCallSpec | WebSpec | BulkSpec | Ect1Spec | UdpBurstSpec | L4sSpec,
    Field(discriminator="kind"),
]


class Session:
    """Generator processes started together; subclasses say which."""

    def __init__(self, lab: Lab, ident: str, out_dir: Path) -> None:
        self.lab, self.ident, self.out_dir = lab, ident, out_dir
        self.procs: list[subprocess.Popen] = []
        self.started_ns = 0

    def _spawn(self, node: str, argv: list[str], role: str) -> subprocess.Popen:
        self.out_dir.mkdir(parents=True, exist_ok=True)
        proc = self.lab.spawn(
            node, argv, role=f"{self.ident}:{role}", log=self.out_dir / f"{self.ident}.{role}.log"
        )
        self.procs.append(proc)
        return proc

    def start(self, duration: float, start: int | StartSignal | None = None) -> None:
        """Start the generators; those that can wait begin sending at `start` (CLOCK_REALTIME
        ns, or when a StartSignal says), the others at once."""
        raise NotImplementedError

    def ready_markers(self) -> list[Path]:
        """Files the generators that wait for a StartSignal create once they are ready."""
        return []

    def stop(self, grace: float = 5.0) -> None:
        procs.stop([(p.pid, None) for p in self.procs if p.poll() is None], grace=grace)
        self.wait(grace)
        self.lab.forget([p.pid for p in self.procs])

    def wait(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        for p in self.procs:
            try:
                p.wait(max(deadline - time.monotonic(), 0.01))
            except subprocess.TimeoutExpired:
                return False
        return True

    def result(self) -> dict:
        return {}


class MediaSession(Session):
    """Two media peers: `server` sends `profile.down`, `client` sends `profile.up`."""

    def __init__(
        self,
        lab: Lab,
        ident: str,
        out_dir: Path,
        profile: MediaProfile,
        server: str,
        client: str,
        port: int,
    ) -> None:
        super().__init__(lab, ident, out_dir)
        self.profile, self.server, self.client, self.port = profile, server, client, port
        self._waits = False  # started with a StartSignal: its generators say when ready

    def _peer(
        self,
        node: str,
        other: str,
        spec: StreamSpec | None,
        duration: float,
        out: Path,
        start: int | StartSignal | None,
    ) -> None:
        topo = self.lab.topo
        argv = [
            *GENERATOR,
            "media",
            "--bind",
            f"{topo.address(node)}:{self.port}",
            "--peer",
            f"{topo.address(other)}:{self.port}",
            "--duration",
            str(duration),
            "--out",
            str(out),
        ]
        if spec:
            argv += ["--send", spec.model_dump_json()]
        if isinstance(start, StartSignal):
            argv += ["--start-file", str(start.path), "--start-offset-s", str(start.offset_s)]
        elif start is not None:
            argv += ["--start-at-ns", str(start)]
        self._spawn(node, argv, role=out.name.rsplit("-", 1)[-1])

    def start(self, duration: float, start: int | StartSignal | None = None) -> None:
        # with a StartSignal, known once the runner fixes the start (`started_at`)
        self.started_ns = start if isinstance(start, int) else time.time_ns()
        self._waits = isinstance(start, StartSignal)
        # The client binds first so the first downstream frames find a socket.
        self._peer(self.client, self.server, self.profile.up, duration, self.downstream_path,
                   start)
        self._peer(self.server, self.client, self.profile.down, duration, self.upstream_path,
                   start)

    def started_at(self, start_ns: int) -> None:
        """The runner fixed the StartSignal's instant: this session begins at `start_ns`."""
        self.started_ns = start_ns

    def ready_markers(self) -> list[Path]:
        if not self._waits:
            return []
        return [p.parent / f"{p.name}.ready" for p in (self.downstream_path, self.upstream_path)]

    @property
    def downstream_path(self) -> Path:
        return self.out_dir / f"{self.ident}-client"  # what the client received

    @property
    def upstream_path(self) -> Path:
        return self.out_dir / f"{self.ident}-server"  # what the server received

    def packets(self, direction: str = "down") -> Packets:
        path = self.downstream_path if direction == "down" else self.upstream_path
        return Packets.load(path.parent / f"{path.name}.npz")

    def result(self) -> dict:
        out = {"kind": "media", "profile": self.profile.name}
        for direction, path in (("down", self.downstream_path), ("up", self.upstream_path)):
            try:
                out[direction] = json.loads((path.parent / f"{path.name}.json").read_text())
            except (OSError, ValueError) as exc:
                out[direction] = {"error": f"no result from {path.name}: {exc}"}
        return out


class BulkSession(Session):
    """iperf3 TCP: a one-shot server at `dst`, a client at `src` with `flows` parallel streams."""

    def __init__(self, lab: Lab, ident: str, out_dir: Path, spec: BulkSpec) -> None:
        super().__init__(lab, ident, out_dir)
        self.spec = spec
        self._listening = False

    def listen(self) -> None:
        """Start the one-shot server ahead of the flood (a fault prepares it), so the flood
        begins as soon as the client starts."""
        if self._listening:
            return
        if shutil.which("iperf3") is None:
            raise RuntimeError(
                "iperf3 is not installed (listed in scripts/bootstrap.d/lab.apt): "
                "run scripts/bootstrap.sh"
            )
        dst = str(self.lab.topo.address(self.spec.dst))
        self._spawn(
            self.spec.dst, ["iperf3", "-s", "-1", "-B", dst, "-p", str(self.spec.port)], "server"
        )
        _wait_listening(self.lab.ns(self.spec.dst), self.spec.port, timeout=5)
        self._listening = True

    def start(self, duration: float, start: int | StartSignal | None = None) -> None:
        self.listen()
        self.started_ns = time.time_ns()  # the client connects in milliseconds: no scheduling
        dst = str(self.lab.topo.address(self.spec.dst))
        port = str(self.spec.port)
        self._spawn(
            self.spec.src,
            [
                "iperf3",
                "-c",
                dst,
                "-p",
                port,
                "-t",
                str(max(duration, 1)),
                "-P",
                str(self.spec.flows),
                "-J",
                "--logfile",
                str(self.out_dir / f"{self.ident}-iperf3.json"),
            ],
            "client",
        )

    def result(self) -> dict:
        try:
            report = json.loads((self.out_dir / f"{self.ident}-iperf3.json").read_text())
            # A client stopped by the scenario (SIGTERM) reports only what it sent.
            end = report["end"]["sum_received"]
            if not end.get("bytes"):
                end = report["end"]["sum_sent"]
            return {"kind": "bulk", "mbit": end["bits_per_second"] / 1e6, "bytes": end["bytes"]}
        except (OSError, ValueError, KeyError) as exc:
            return {"kind": "bulk", "error": f"no iperf3 result: {exc}"}


class WebSession(Session):
    def __init__(self, lab: Lab, ident: str, out_dir: Path, spec: WebSpec) -> None:
        super().__init__(lab, ident, out_dir)
        self.spec = spec

    def start(self, duration: float, start: int | StartSignal | None = None) -> None:
        self.started_ns = time.time_ns()  # background browsing: starts when it is ready
        addr = f"{self.lab.topo.address(self.spec.server)}:{self.spec.port}"
        self._spawn(self.spec.server, [*GENERATOR, "web-server", "--bind", addr], "server")
        _wait_listening(self.lab.ns(self.spec.server), self.spec.port, timeout=10)
        self._spawn(
            self.spec.client,
            [
                *GENERATOR,
                "web-client",
                "--server",
                addr,
                "--duration",
                str(duration),
                "--out",
                str(self.out_dir / f"{self.ident}-web"),
            ],
            "client",
        )

    def wait(self, timeout: float) -> bool:
        # The server runs until stopped; the client ends on its own.
        client = self.procs[-1:]
        try:
            for p in client:
                p.wait(timeout)
        except subprocess.TimeoutExpired:
            return False
        return True

    def result(self) -> dict:
        try:
            path = self.out_dir / f"{self.ident}-web.json"
            return {"kind": "web", **json.loads(path.read_text())}
        except (OSError, ValueError) as exc:
            return {"kind": "web", "error": str(exc)}


def make_session(lab: Lab, ident: str, out_dir: Path, spec: TrafficSpec) -> Session:
    if isinstance(spec, GamingSpec):
        if spec.platform not in PROFILES:
            raise ValueError(f"unknown platform {spec.platform!r}; known: {sorted(PROFILES)}")
        profile = PROFILES[spec.platform]
        if spec.dscp and profile.down is not None:
            tos = (spec.dscp << 2) | (profile.down.tos & 3)  # the ECN bits stay the profile's
            down = profile.down.model_copy(update={"tos": tos})
            profile = profile.model_copy(update={"down": down})
        return MediaSession(lab, ident, out_dir, profile, spec.server, spec.client, spec.port)
    if isinstance(spec, VideoCallSpec):
        return MediaSession(lab, ident, out_dir, PROFILES["video-call"], spec.a, spec.b, spec.port)
    if isinstance(spec, Ect1Spec):
        profile = MediaProfile(
            name="ect1", down=ect1_abuser(spec.rate_mbit, spec.burst_packets), up=None
        )
        return MediaSession(lab, ident, out_dir, profile, spec.src, spec.dst, spec.port)
    if isinstance(spec, L4sSpec):
        return MediaSession(
            lab, ident, out_dir, l4s_sender(spec.rate_mbit), spec.src, spec.dst, spec.port
        )
    if isinstance(spec, UdpBurstSpec):
        profile = MediaProfile(
            name="udp-burst", down=unresponsive_udp(spec.rate_mbit, spec.burst_packets), up=None
        )
        return MediaSession(lab, ident, out_dir, profile, spec.src, spec.dst, spec.port)
    if isinstance(spec, BulkSpec):
        return BulkSession(lab, ident, out_dir, spec)
    if isinstance(spec, WebSpec):
        return WebSession(lab, ident, out_dir, spec)
    raise TypeError(f"unknown traffic spec {spec!r}")


def listening(netns: str, port: int) -> bool:
    """Whether a TCP socket listens on `port` in `netns` (its /proc/net/tcp, read via a pid
    there)."""
    hexport = f":{port:04X}"
    for pid in procs.pids_in_netns(netns):
        try:
            lines = Path(f"/proc/{pid}/net/tcp").read_text().splitlines()[1:]
        except OSError:
            continue
        # state 0A = LISTEN
        return any(ln.split()[1].endswith(hexport) and ln.split()[3] == "0A" for ln in lines)
    return False


def _wait_listening(netns: str, port: int, timeout: float) -> None:
    """Until a TCP socket listens on `port` in `netns`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if listening(netns, port):
            return
        time.sleep(0.05)
    raise TimeoutError(f"nothing listens on port {port} in {netns} after {timeout} s")
