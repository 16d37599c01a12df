"""The agent's queue monitor and the L4S class's RFC 9957 queue protection against the real
kernel: HTB in a network namespace pair (the lab of test_node_agent_netns.py, reused), the
agent configured with `[queue_protection]`, ECT(1) UDP senders in namespace A.

The datapath's per-flow sanction counters (qprot_flows) and per-class state (qmon_stats) are
read with bpftool, as an operator would.
"""

from __future__ import annotations

import json
import socket
import struct
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from cgloop.v1 import node_agent_pb2 as na

from tests import test_node_agent_netns as netns

pytestmark = pytest.mark.root


ROOT, LL, CLASSIC = 0x10001, 0x10040, 0x10010
ECT1 = 0x01
CE = 0x03
LINK_BPS = 20_000_000


def hierarchy(iface: str) -> na.QueueHierarchy:
    """A 20 Mbit/s link: classic 1:10 (default) and low-latency 1:40, both able to borrow it."""
    return na.QueueHierarchy(
        interface_name=iface,
        default_class_id=CLASSIC,
        classes=[
            na.HtbClass(name="root", class_id=ROOT, rate_bps=LINK_BPS, ceil_bps=LINK_BPS),
            na.HtbClass(name="classic", class_id=CLASSIC, parent_class_id=ROOT,
                        rate_bps=LINK_BPS // 2, ceil_bps=LINK_BPS, priority=1),
            na.HtbClass(name="l4s", class_id=LL, parent_class_id=ROOT,
                        rate_bps=LINK_BPS // 2, ceil_bps=LINK_BPS, priority=1),
        ],
    )


def bpf_map(name: str) -> list[dict]:
    """Every entry of every BPF map called `name` (bpftool JSON, keys/values as byte lists)."""
    out = subprocess.run(["bpftool", "-j", "map", "dump", "name", name], check=True,
                         capture_output=True, text=True, timeout=20).stdout
    entries = json.loads(out or "[]")
    # Several maps of that name: bpftool nests each map's entries.
    flat: list[dict] = []
    for e in entries:
        flat.extend(e.get("elements", [e]) if isinstance(e, dict) else [])
    return flat


def as_bytes(v: list) -> bytes:
    return bytes(int(x, 16) if isinstance(x, str) else x for x in v)


def sanctions(lab, sport: int) -> int:
    """Packets of the flow from `sport` that queue protection sent to the classic class."""
    src = socket.inet_aton(lab.addr_a)
    total = 0
    for e in bpf_map("qprot_flows"):
        k, v = as_bytes(e["key"]), as_bytes(e["value"])
        # struct cgl_flow_key: ifindex u32, family u8, proto u8, sport u16, dport u16, pad, src
        _, _, _, ksport, _, _ = struct.unpack_from("<IBBHHH", k)
        if ksport == sport and k[12:16] == src:
            total += struct.unpack_from("<Q", v)[0]
    return total


class Paced:
    """ECT(1) UDP from namespace A at `rate_bps`; `responsive` halves the rate on each CE the
    receiver saw (at most once per 20 ms, like a congestion controller's once per RTT) and adds
    back 5 % every 20 ms without one."""

    def __init__(self, lab, sport: int, dport: int, rate_bps: float, size: int,
                 responsive: bool) -> None:
        self.lab, self.sport, self.dport, self.size = lab, sport, dport, size
        self.rate, self.max_rate, self.responsive = rate_bps, rate_bps, responsive
        self.ce_seen = 0
        self.sent = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=netns.in_netns, args=(lab.ns_a, self._run),
                                       daemon=True)

    def _run(self) -> None:
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.setsockopt(socket.IPPROTO_IP, socket.IP_TOS, ECT1)
        s.bind((self.lab.addr_a, self.sport))
        payload = b"\0" * self.size
        next_t = time.monotonic()
        last_ce, last_adjust = 0, time.monotonic()
        while not self.stop.is_set():
            now = time.monotonic()
            if self.responsive and now - last_adjust >= 0.02:
                if self.ce_seen > last_ce:
                    self.rate = max(self.rate / 2, 50_000)
                else:
                    self.rate = min(self.rate * 1.05, self.max_rate)
                last_ce, last_adjust = self.ce_seen, now
            try:
                s.sendto(payload, (self.lab.addr_b, self.dport))
                self.sent += 1
            except OSError:
                pass
            next_t += self.size * 8 / self.rate
            delay = next_t - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            else:
                next_t = time.monotonic()
        s.close()


class EcnReceiver:
    """Counts datagrams per destination port and the CE marks on them; tells senders."""

    def __init__(self, lab, ports: dict[int, Paced]) -> None:
        self.lab, self.ports = lab, ports
        self.got = {p: 0 for p in ports}
        self.ce = {p: 0 for p in ports}
        self.stop = threading.Event()
        ready = threading.Event()
        self.threads = [
            threading.Thread(target=netns.in_netns,
                             args=(lab.ns_b, lambda p=p: self._run(p, ready)), daemon=True)
            for p in ports
        ]
        for t in self.threads:
            t.start()
            ready.wait(5)
            ready.clear()

    def _run(self, port: int, ready: threading.Event) -> None:
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.setsockopt(socket.IPPROTO_IP, socket.IP_RECVTOS, 1)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
        s.bind((self.lab.addr_b, port))
        s.settimeout(0.1)
        ready.set()
        while not self.stop.is_set():
            try:
                _, anc, _, _ = s.recvmsg(2048, socket.CMSG_SPACE(4))
            except TimeoutError:
                continue
            tos = next((d[0] for lvl, typ, d in anc
                        if lvl == socket.IPPROTO_IP and typ == socket.IP_TOS), 0)
            self.got[port] += 1
            if tos & 3 == CE:
                self.ce[port] += 1
                self.ports[port].ce_seen += 1
        s.close()

    def close(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(5)


def start_lab(tmp_path: Path, top: str = "") -> netns.Lab:
    """The lab, its agent restarted with `[queue_protection]` (and the `top` keys)."""
    lab = netns.Lab(tmp_path)
    lab.up()
    lab.kill()
    toml = (tmp_path / "agent.toml").read_text()
    (tmp_path / "agent.toml").write_text(
        top
        + toml
        + "[queue_protection]\n"
        + f"ll_class_id = {LL}\nclassic_class_id = {CLASSIC}\n"
        + f'interfaces = ["{lab.if_a}"]\n'
    )
    lab.start()
    lab.stub().ApplyQueueHierarchy(
        na.ApplyQueueHierarchyRequest(action_id="h1", hierarchy=hierarchy(lab.if_a)),
        timeout=10,
    )
    return lab


@pytest.fixture
def qlab(tmp_path: Path) -> Iterator:
    netns._skip_without_root()
    lab = netns.Lab(tmp_path)
    try:
        lab = start_lab(tmp_path)
        yield lab
    finally:
        lab.down()


def class_packets(lab) -> dict[int, int]:
    return netns.Lab.class_packets(lab, lab.stub())


def test_ect1_goes_to_the_ll_class_and_not_ect_stays_classic(qlab):
    before = class_packets(qlab)
    for tos, sport in ((ECT1, 7001), (0, 7002)):
        def send(tos: int = tos, sport: int = sport) -> None:
            s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            s.setsockopt(socket.IPPROTO_IP, socket.IP_TOS, tos)
            s.bind((qlab.addr_a, sport))
            for _ in range(50):
                s.sendto(b"x" * 100, (qlab.addr_b, 9000))
            s.close()

        netns.in_netns(qlab.ns_a, send)
    time.sleep(0.3)
    after = class_packets(qlab)
    assert after[LL] - before[LL] == 50, (before, after)
    assert after[CLASSIC] - before[CLASSIC] >= 50, (before, after)


def test_unresponsive_ect1_flood_is_sanctioned_and_a_responsive_sender_is_not(qlab):
    flood = Paced(qlab, 7101, 9101, rate_bps=1.5 * LINK_BPS, size=1200, responsive=False)
    good = Paced(qlab, 7102, 9102, rate_bps=1_000_000, size=400, responsive=True)
    rx = EcnReceiver(qlab, {9101: flood, 9102: good})
    try:
        good.thread.start()
        time.sleep(0.5)
        flood.thread.start()
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and sanctions(qlab, 7101) < 200:
            time.sleep(0.5)
        time.sleep(2)
    finally:
        flood.stop.set()
        good.stop.set()
        flood.thread.join(5)
        good.thread.join(5)
        rx.close()
    assert sanctions(qlab, 7101) >= 200, "the unresponsive ECT(1) flood was not sanctioned"
    assert sanctions(qlab, 7102) == 0, (
        f"the responsive sender was sanctioned (sent {good.sent}, CE {rx.ce[9102]})"
    )
    assert rx.got[9102] > 0.9 * good.sent, (rx.got, good.sent)

