"""An RTP/UDP media peer: sends one stream to its peer and measures the one it receives.

Both ends of a session use one UDP socket bound to their own port, so the two directions share
one five-tuple, as a cloud-gaming session does. Each packet is an RTP v2 packet (RFC 3550:
sequence number, 90 kHz timestamp, SSRC, marker on a frame's last packet) whose payload starts
with the measurement stamp `!QIHH` = send time (CLOCK_REALTIME ns), frame number, index of the
packet in its frame, packets in the frame; the rest is padding up to the frame's size.
"""

from __future__ import annotations

import json
import math
import random
import socket
import struct
import threading
import time
from array import array
from pathlib import Path

import numpy as np
from cgloop.lab.traffic.profiles import StreamSpec
from cgloop.lab.traffic.stats import Packets

RTP = struct.Struct("!BBHII")  # V/P/X/CC, M/PT, sequence, timestamp, SSRC
STAMP = struct.Struct("!QIHH")
HEADER_BYTES = RTP.size + STAMP.size
# A `ce_echo` stream's packets carry, after the stamp, the CE-marked packets received so far.
CE_ECHO = struct.Struct("!I")
CE_ECHO_PT = 102
RTP_CLOCK_HZ = 90_000
# A frame more than this many periods late is dropped, not sent: an encoder paces its frames
# and skips the stale ones (a game stream never replays the frames it missed; floods, whose
# spec says `catch_up`, keep their average rate instead). Without it, a
# sender starved of CPU for a few hundred ms (the lab's own load: 2 cores, load 10-18) sent
# every missed frame back to back, and that self-made burst of its own packets (138 ms of
# queue, seen in the end-to-end test) was the only congestion the loop then saw.
STALE_PERIODS = 2

SO_TIMESTAMPNS = getattr(socket, "SO_TIMESTAMPNS", 35)
SO_RXQ_OVFL = 40
SO_RCVBUFFORCE = 33
IP_RECVTOS = getattr(socket, "IP_RECVTOS", 13)
ECN_NAMES = ("not_ect", "ect1", "ect0", "ce")  # by the TOS byte's low two bits
_TIMESPEC = struct.Struct("qq")


def rtp_packet(
    seq: int, ts: int, ssrc: int, pt: int, marker: bool, stamp: bytes, size: int
) -> bytes:
    head = RTP.pack(0x80, (0x80 if marker else 0) | pt, seq & 0xFFFF, ts & 0xFFFFFFFF, ssrc)
    return head + stamp + bytes(max(size - RTP.size - len(stamp), 0))


def parse(data: bytes) -> tuple[int, int, int] | None:
    """(16-bit sequence, send_ns, payload type) of a lab RTP packet; None if it is not one."""
    if len(data) < HEADER_BYTES or data[0] >> 6 != 2:
        return None
    _, m_pt, seq, _, _ = RTP.unpack_from(data)
    send_ns, _, _, _ = STAMP.unpack_from(data, RTP.size)
    return seq, send_ns, m_pt & 0x7F


class Sender(threading.Thread):
    """Sends `spec` to `peer` from `sock` until `stop` is set or `duration` has passed."""

    def __init__(
        self,
        sock: socket.socket,
        peer: tuple[str, int],
        spec: StreamSpec,
        duration: float,
        stop: threading.Event,
        seed: int | None = None,
        start_at_ns: int | None = None,
        feedback: Receiver | None = None,
    ) -> None:
        super().__init__(name="sender", daemon=True)
        # the receiver on the same socket: CE counts to echo, or the peer's echo to react to
        self.feedback = feedback
        self.rate_factor = 1.0
        self.rate_cuts = 0
        self.min_rate_factor = 1.0
        self._ce_seen = 0
        self._last_change = 0.0
        self.sock, self.peer, self.spec, self.duration, self.stop = sock, peer, spec, duration, stop
        self.rng = random.Random(seed)
        self.ssrc = self.rng.getrandbits(32)
        self.start_at_ns = start_at_ns
        self.sent = 0
        self.sent_bytes = 0
        self.send_errors = 0
        self.frames_skipped = 0

    def run(self) -> None:
        spec = self.spec
        if spec.tos:
            self.sock.setsockopt(socket.IPPROTO_IP, socket.IP_TOS, spec.tos)
        frame_bytes = spec.rate_kbps * 1000 / 8 / spec.fps
        period = 1.0 / spec.fps
        pt = CE_ECHO_PT if spec.ce_echo else spec.payload_type
        if self.start_at_ns is not None:  # a scheduled start: the fault's onset is exact
            self.stop.wait(max(self.start_at_ns - time.time_ns(), 0) / 1e9)
        self.first_send_ns = time.time_ns()
        start = time.monotonic()
        frame = 0
        seq = self.rng.getrandbits(16)
        self.first_seq = seq
        while not self.stop.is_set():
            due = start + frame * period
            now = time.monotonic()
            if now - start >= self.duration:
                break
            if due > now:
                self.stop.wait(due - now)
                continue
            if not spec.catch_up and now - due > STALE_PERIODS * period:
                missed = int((now - start) / period) - frame
                self.frames_skipped += missed
                frame += missed
            if spec.responsive:
                self._react(now)
            size = self.rate_factor * (
                frame_bytes * max(0.2, self.rng.gauss(1.0, spec.size_cv))
                if spec.size_cv
                else (frame_bytes)
            )
            count = max(1, math.ceil(size / spec.payload_max))
            per_packet = max(HEADER_BYTES, min(spec.payload_max, math.ceil(size / count)))
            ts = int(frame * RTP_CLOCK_HZ / spec.fps)
            pace = 0.0 if spec.burst else period / count
            for i in range(count):
                stamp = STAMP.pack(time.time_ns(), frame, i, count)
                if spec.ce_echo and self.feedback is not None:
                    stamp += CE_ECHO.pack(self.feedback.ecn[3] & 0xFFFFFFFF)
                pkt = rtp_packet(
                    seq, ts, self.ssrc, pt, i == count - 1, stamp, per_packet
                )
                try:
                    self.sock.sendto(pkt, self.peer)
                    self.sent += 1
                    self.sent_bytes += len(pkt)
                except OSError:  # peer not up yet (ICMP unreachable) or a full queue
                    self.send_errors += 1
                seq += 1
                if pace:
                    time.sleep(pace)
            frame += 1
        self.frames = frame

    def _react(self, now: float) -> None:
        """Halve the rate when the peer echoes new CE marks (once per reaction interval, as an
        L4S sender reacts once per round trip), else grow back by 2 % per interval."""
        if self.feedback is None or now - self._last_change < self.spec.react_ms / 1000:
            return
        echoed = self.feedback.echoed_ce
        if echoed > self._ce_seen:
            self._ce_seen = echoed
            self.rate_factor = max(self.rate_factor / 2, 0.05)
            self.rate_cuts += 1
            self.min_rate_factor = min(self.min_rate_factor, self.rate_factor)
        else:
            self.rate_factor = min(1.0, self.rate_factor + 0.02)
        self._last_change = now


class Receiver:
    """Records every lab RTP packet that arrives on `sock` (kernel receive timestamps)."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
        sock.setsockopt(socket.SOL_SOCKET, SO_RXQ_OVFL, 1)
        sock.setsockopt(socket.IPPROTO_IP, IP_RECVTOS, 1)
        try:  # a deep buffer so a descheduled Python receiver never looks like network loss
            sock.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, 16 << 20)
        except PermissionError:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16 << 20)
        self.seq, self.send_ns = array("q"), array("q")
        self.recv_ns, self.size = array("q"), array("q")
        self.malformed = 0
        self.ecn = [0, 0, 0, 0]
        self.echoed_ce = 0  # the peer's count of CE marks it received (a ce_echo stream)
        self.socket_drops = 0
        self._max: int | None = None

    def _extend(self, seq16: int) -> int:
        # RFC 3550 A.1 in spirit: the extended number nearest the highest seen so far, so wraps
        # and late (reordered) packets both land on the right cycle.
        if self._max is None:
            self._max = seq16
            return seq16
        base = (self._max & ~0xFFFF) | seq16
        ext = min((base - 0x10000, base, base + 0x10000), key=lambda c: abs(c - self._max))
        self._max = max(self._max, ext)
        return ext

    def run(self, stop: threading.Event, until: float) -> None:
        self.sock.settimeout(0.2)
        cmsg_space = socket.CMSG_SPACE(_TIMESPEC.size) + 2 * socket.CMSG_SPACE(4)
        while not stop.is_set() and time.monotonic() < until:
            try:
                data, anc, _, _ = self.sock.recvmsg(2048, cmsg_space)
            except TimeoutError:
                continue
            except OSError:
                continue  # e.g. ECONNREFUSED surfaced from an earlier send: not fatal
            recv_ns, tos = None, None
            for level, kind, payload in anc:
                if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS:
                    sec, nsec = _TIMESPEC.unpack(payload[: _TIMESPEC.size])
                    recv_ns = sec * 1_000_000_000 + nsec
                elif level == socket.SOL_SOCKET and kind == SO_RXQ_OVFL:
                    self.socket_drops = struct.unpack("I", payload[:4])[0]
                elif level == socket.IPPROTO_IP and kind == socket.IP_TOS and payload:
                    tos = payload[0]
            parsed = parse(data)
            if parsed is None:
                self.malformed += 1
                continue
            seq16, send_ns, pt = parsed
            if pt == CE_ECHO_PT and len(data) >= HEADER_BYTES + CE_ECHO.size:
                self.echoed_ce = max(self.echoed_ce, CE_ECHO.unpack_from(data, HEADER_BYTES)[0])
            if tos is not None:
                self.ecn[tos & 0x3] += 1
            self.seq.append(self._extend(seq16))
            self.send_ns.append(send_ns)
            self.recv_ns.append(recv_ns if recv_ns is not None else time.time_ns())
            self.size.append(len(data))

    def packets(self) -> Packets:
        col = lambda a: np.frombuffer(a, dtype=np.int64).copy()  # noqa: E731
        return Packets(col(self.seq), col(self.send_ns), col(self.recv_ns), col(self.size))


# How long a generator waits for its start file before it begins on its own.
START_TIMEOUT_S = 120.0


def wait_for_start(path: Path, stop: threading.Event, timeout_s: float) -> tuple[int, str]:
    """(start ns, how): the number `path` holds once it exists ("signalled"), polled every
    10 ms; now if `stop` is set first ("stopped") or after `timeout_s` ("timeout")."""
    deadline = time.monotonic() + timeout_s
    while not stop.is_set():
        try:
            return int(path.read_text().strip()), "signalled"
        except (OSError, ValueError):
            pass  # not written yet (it is renamed into place whole)
        if time.monotonic() >= deadline:
            return time.time_ns(), "timeout"
        stop.wait(0.01)
    return time.time_ns(), "stopped"


def run_peer(
    bind: tuple[str, int],
    peer: tuple[str, int],
    send: StreamSpec | None,
    duration: float,
    out: Path | None,
    linger: float = 1.0,
    start_at_ns: int | None = None,
    stop: threading.Event | None = None,
    start_file: Path | None = None,
    start_offset_s: float = 0.0,
    start_timeout_s: float = START_TIMEOUT_S,
) -> dict:
    """Send `send` (if any) to `peer` for `duration` s while recording what arrives on `bind`;
    then write `<out>.npz` (per packet) and `<out>.json` (summary). Setting `stop` ends it early.

    With `start_at_ns` (CLOCK_REALTIME) the receiver is ready at once but sending (and the
    duration) starts at that instant, so start-up time of the process never shifts the traffic.
    With `start_file` instead, the socket bound, it creates `<out>.ready` and waits for the
    file to hold the start (ns), then begins `start_offset_s` after it: the runner fixes the
    start once every generator is ready (`cgloop.lab.sessions.StartSignal`).
    """
    stop = stop or threading.Event()
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(bind)
    start_waited = None
    if start_file is not None:
        if out:
            out.parent.mkdir(parents=True, exist_ok=True)
            (out.parent / f"{out.name}.ready").touch()
        start_ns, start_waited = wait_for_start(start_file, stop, start_timeout_s)
        start_at_ns = start_ns + int(start_offset_s * 1e9)
    receiver = Receiver(sock)
    sender = (
        Sender(sock, peer, send, duration, stop, start_at_ns=start_at_ns, feedback=receiver)
        if send
        else None
    )
    started_ns = time.time_ns()
    late_ms = (started_ns - start_at_ns) / 1e6 if start_at_ns else None
    delay = max((start_at_ns or started_ns) - started_ns, 0) / 1e9
    if sender:
        sender.start()
    receiver.run(stop, until=time.monotonic() + delay + duration + linger)
    stop.set()
    if sender:
        sender.join()
    packets = receiver.packets()
    result = {
        "bind": f"{bind[0]}:{bind[1]}",
        "peer": f"{peer[0]}:{peer[1]}",
        "started_ns": started_ns,
        "start_at_ns": start_at_ns,
        # with a start file: how it ended ("signalled", "timeout": began at once, "stopped")
        "start_wait": start_waited,
        "late_start_ms": late_ms if late_ms and late_ms > 0 else 0.0,
        "first_send_ns": getattr(sender, "first_send_ns", None),
        "ended_ns": time.time_ns(),
        "sent": sender.sent if sender else 0,
        "sent_bytes": sender.sent_bytes if sender else 0,
        "send_errors": sender.send_errors if sender else 0,
        "frames_skipped": sender.frames_skipped if sender else 0,
        "received": len(packets),
        "malformed": receiver.malformed,
        "socket_drops": receiver.socket_drops,
        "ecn": dict(zip(ECN_NAMES, receiver.ecn, strict=True)),
        "echoed_ce": receiver.echoed_ce,
        "rate_cuts": sender.rate_cuts if sender else 0,
        "min_rate_factor": sender.min_rate_factor if sender else 1.0,
        "summary": packets.summary().model_dump(),
    }
    if out:
        out.parent.mkdir(parents=True, exist_ok=True)
        packets.save(out.parent / f"{out.name}.npz")
        (out.parent / f"{out.name}.json").write_text(json.dumps(result, indent=1))
    return result
