"""The node agent's INT source against the real kernel: the agent of test_node_agent_netns.py's
lab (namespace A, a veth to namespace B) with `[int_export]` on its shaped interface, UDP
traffic from A that first fits the class's rate and then floods it, and a UDP socket in A's
namespace on loopback standing in for the INT collector.

The datagrams are read at the fixed offsets of the encoder's RepMdBits (0x7e00: level-1
ports, hop latency, queue, ingress and egress timestamps, level-2 ports); that the INT
collector's own parser reads them the same way is the agent crate's unit test
(int_export::encode::tests::the_int_collectors_parser_decodes_the_postcards).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import socket
import statistics
import struct
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from cgloop.binaries import find_binary
from cgloop.contracts.ops import Daemon, default_metrics_addr
from cgloop.testing import scrape_metrics
from cgloop.v1 import node_agent_pb2 as na

from tests import test_node_agent_netns as netns

pytestmark = pytest.mark.root


ROOT, LEAF = 0x10001, 0x10010
LINK_BPS = 10_000_000
NODE_ID = 7
CONGESTED_NS = 5_000_000
SPORT, DPORT = 7301, 9301


@dataclass
class Postcard:
    seq: int
    node_id: int
    congested: bool
    ingress_port: int
    egress_port: int
    hop_latency_ns: int
    queue_id: int
    occupancy: int
    ingress_ts: int
    egress_ts: int
    sport: int
    dport: int
    at: float


def decode(d: bytes, at: float) -> list[Postcard]:
    """TR v2.0 group header + individual reports, as the agent lays them out."""
    w0, node_id = struct.unpack_from("!II", d, 0)
    assert w0 >> 28 == 2, f"version {w0 >> 28}"
    seq = w0 & 0x3FFFFF
    out, off = [], 8
    while off < len(d):
        rep_in, rep_len, md_len, flags = struct.unpack_from("!BBBB", d, off)
        # RepType INT, InType IPv4 or IPv6 (the veth's own IPv6 chatter is reported too)
        assert (rep_in >> 4, md_len) == (1, 9) and rep_in & 0xF in (4, 5), (rep_in, md_len)
        bits, = struct.unpack_from("!H", d, off + 4)
        assert bits == 0x7E00, hex(bits)
        ig, eg, lat, q, its, ets = struct.unpack_from("!HHIIQQ", d, off + 12)
        inner = off + 12 + 36
        ihl = (d[inner] & 0xF) * 4 if rep_in & 0xF == 4 else 40
        sport, dport = struct.unpack_from("!HH", d, inner + ihl)
        out.append(Postcard(seq, node_id, bool(flags & 0x40), ig, eg, lat, q >> 24, q & 0xFFFFFF,
                            its, ets, sport, dport, at))
        off += 4 + rep_len * 4
    return out


class Collector:
    """UDP socket on loopback in the agent's namespace; keeps every datagram."""

    def __init__(self, ns: str) -> None:
        self.datagrams: list[tuple[float, bytes]] = []
        self.port = 0
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=netns.in_netns, args=(ns, self._run), daemon=True)
        self._thread.start()
        assert self._ready.wait(5), "collector socket did not bind"

    def _run(self) -> None:
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
        s.bind(("127.0.0.1", 0))
        s.settimeout(0.1)
        self.port = s.getsockname()[1]
        self._ready.set()
        while not self._stop.is_set():
            try:
                d = s.recv(65535)
            except TimeoutError:
                continue
            self.datagrams.append((time.monotonic(), d))
        s.close()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)


def count(collector: Collector) -> int:
    return sum(len(decode(d, at)) for at, d in list(collector.datagrams))


def quiet_for(collector: Collector, seconds: float, timeout: float) -> None:
    """Until no datagram arrived for `seconds` (at most `timeout`)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        last = collector.datagrams[-1][0] if collector.datagrams else 0.0
        if time.monotonic() - last >= seconds:
            return
        time.sleep(0.1)


def paced(lab, rate_bps: float, size: int, seconds: float) -> None:
    """UDP from A to B at `rate_bps` (a send error, e.g. a full qdisc, is ignored)."""
    def run() -> None:
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind((lab.addr_a, SPORT))
        payload = b"\0" * size
        start = next_t = time.monotonic()
        while time.monotonic() - start < seconds:
            with contextlib.suppress(OSError):
                s.sendto(payload, (lab.addr_b, DPORT))
            next_t += size * 8 / rate_bps
            delay = next_t - time.monotonic()
            if delay > 0:
                time.sleep(delay)
        s.close()

    netns.in_netns(lab.ns_a, run)


def start_agent(lab, tmp_path: Path, collector_port: int) -> None:
    """The lab's agent restarted with `[int_export]` to 127.0.0.1:`collector_port` in its
    namespace, and a 10 Mbit/s hierarchy (one leaf, 1:10) on its interface."""
    lab.kill()
    toml = (tmp_path / "agent.toml").read_text()
    (tmp_path / "agent.toml").write_text(
        toml
        + "[int_export]\n"
        + f'collector = "127.0.0.1:{collector_port}"\n'
        + f"node_id = {NODE_ID}\n"
        + f'interfaces = ["{lab.if_a}"]\n'
        + "sample_every = 10\nreport_over_ns = 1000000\n"
        + f"congested_over_ns = {CONGESTED_NS}\nmax_reports_per_s = 2000\n"
    )
    lab.start()
    lab.stub().ApplyQueueHierarchy(na.ApplyQueueHierarchyRequest(
        action_id="h1",
        hierarchy=na.QueueHierarchy(
            interface_name=lab.if_a, default_class_id=LEAF,
            classes=[
                na.HtbClass(name="root", class_id=ROOT, rate_bps=LINK_BPS, ceil_bps=LINK_BPS),
                na.HtbClass(name="leaf", class_id=LEAF, parent_class_id=ROOT,
                            rate_bps=LINK_BPS, ceil_bps=LINK_BPS, priority=1),
            ],
        ),
    ), timeout=10)


def agent_metrics(lab) -> dict:
    return netns.in_netns(lab.ns_a, lambda: scrape_metrics(
        default_metrics_addr(Daemon.DAEMON_NODE_AGENT)))


@pytest.fixture
def ilab(tmp_path: Path):
    netns._skip_without_root()
    lab = netns.Lab(tmp_path)
    collector = None
    try:
        lab.up()
        collector = Collector(lab.ns_a)
        start_agent(lab, tmp_path, collector.port)
        yield lab, collector
    finally:
        if collector:
            collector.close()
        lab.down()


def test_postcards_report_the_queue_and_hop_latency_rises_with_it(ilab):
    lab, collector = ilab
    ifindex_a = netns.in_netns(lab.ns_a, lambda: socket.if_nametoindex(lab.if_a))
    time.sleep(1.0)  # the exporter reads the hierarchies about twice a second
    calm_from = time.monotonic()
    paced(lab, 0.2 * LINK_BPS, 1000, 1.2)  # well within the class's rate: no queue
    flood_from = time.monotonic()
    paced(lab, 3 * LINK_BPS, 1000, 2.2)  # three times its rate: the queue builds
    quiet_for(collector, 0.5, 5)  # the queue drained (at most ~1 s of it) and the last report left
    before = count(collector)
    metrics = agent_metrics(lab)
    time.sleep(0.3)
    cards = [c for at, d in list(collector.datagrams) for c in decode(d, at)]
    ours = [c for c in cards if (c.sport, c.dport) == (SPORT, DPORT)]
    calm = [c for c in ours if calm_from <= c.at < flood_from]
    flood = [c for c in ours if c.at >= flood_from + 1.0]  # after a second of flooding
    assert len(calm) >= 10 and len(flood) >= 20, (len(calm), len(flood), len(cards))

    # Every report names the switch, the queue (class 1:10) and the egress interface; the
    # timestamps are the sojourn's ends, on the wall clock.
    now_ns = time.time_ns()
    for c in ours:
        assert (c.node_id, c.queue_id, c.egress_port, c.ingress_port) == (NODE_ID, 0x10,
                                                                          ifindex_a, 0)
        assert c.egress_ts - c.ingress_ts == c.hop_latency_ns
        assert abs(c.egress_ts - now_ns) < 60e9
        assert c.congested == (c.hop_latency_ns >= CONGESTED_NS)

    calm_lat = statistics.median(c.hop_latency_ns for c in calm)
    flood_lat = statistics.median(c.hop_latency_ns for c in flood)
    assert flood_lat >= 20_000_000, f"flood median hop latency {flood_lat} ns"
    assert flood_lat >= 20 * max(calm_lat, 1), (calm_lat, flood_lat)
    assert statistics.median(c.occupancy for c in flood) > 10 * max(
        statistics.median(c.occupancy for c in calm), 1)
    assert any(c.congested for c in flood) and not any(c.congested for c in calm)

    # Sequence numbers count reports: each datagram starts where the previous one ended.
    seqs = [(struct.unpack_from("!I", d)[0] & 0x3FFFFF, len(decode(d, at)))
            for at, d in collector.datagrams]
    for (s0, n0), (s1, _) in itertools.pairwise(seqs):
        assert s1 == (s0 + n0) & 0x3FFFFF, seqs[:10]

    # What the agent counts as sent is what arrived (the veth's own chatter may add a few
    # reports between the two counts).
    sent = metrics["cgloop_node_agent_int_reports_sent_total"][()]
    assert before <= sent <= len(cards), (before, sent, len(cards))
    # The datapath's counters are folded in every 200 ms: each report was a candidate first.
    deadline = time.monotonic() + 2
    while metrics["cgloop_node_agent_int_candidates_total"][()] < before:
        assert time.monotonic() < deadline, {k: v for k, v in metrics.items() if "_int_" in k}
        time.sleep(0.2)
        metrics = agent_metrics(lab)
    assert metrics["cgloop_node_agent_int_interfaces"][()] == 1
    assert metrics["cgloop_node_agent_int_send_errors_total"][()] == 0


def test_an_interface_outside_the_bounds_is_refused_by_name(tmp_path: Path):
    netns._skip_without_root()
    lab = netns.Lab(tmp_path)
    try:
        lab.up()
        lab.kill()
        toml = (tmp_path / "agent.toml").read_text()
        (tmp_path / "agent.toml").write_text(
            toml + f'[int_export]\nnode_id = 1\ninterfaces = ["{lab.if_a}", "eth-nope"]\n')
        refused = r"int_export.interfaces: \[\"eth-nope\"\] not managed"
        with pytest.raises(RuntimeError, match=refused):
            lab.start()
    finally:
        lab.down()


def test_the_int_collector_binary_parses_every_report_the_agent_sends(tmp_path: Path):
    """The real collector (`cgloop-int-collector run`, no Kafka: records counted) in the
    agent's namespace: every report the agent counts as sent is parsed, none malformed, and
    the flow and its queue make records."""
    netns._skip_without_root()
    lab = netns.Lab(tmp_path)
    proc = None
    try:
        lab.up()
        proc = subprocess.Popen(
            ["ip", "netns", "exec", lab.ns_a, str(find_binary("cgloop-int-collector",
                                                              prefer_release=False)),
             "run", "--listen", "127.0.0.1:0", "--workers", "1", "--duration", "12",
             "--metrics-addr", "off", "--congestion-on-cells", "200",
             "--congestion-off-cells", "50"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert proc.stderr is not None
        listening = json.loads(proc.stderr.readline())  # the readiness line, on stderr
        assert listening["event"] == "listening", listening
        start_agent(lab, tmp_path, int(listening["listen"].rsplit(":", 1)[1]))
        time.sleep(1.0)
        paced(lab, 3 * LINK_BPS, 1000, 1.5)
        time.sleep(1.5)
        sent = agent_metrics(lab)["cgloop_node_agent_int_reports_sent_total"][()]
        out, _ = proc.communicate(timeout=30)
        summary = json.loads(out.strip().splitlines()[-1])  # the exit summary, on stdout
        # the veth's own chatter is reported too, until the collector exits
        sent_after = agent_metrics(lab)["cgloop_node_agent_int_reports_sent_total"][()]
    finally:
        if proc and proc.poll() is None:
            proc.kill()
        lab.down()
    assert sent > 100, sent
    assert summary["malformed"] == 0, summary["malformed_by_reason"]
    assert sent <= summary["reports"] <= sent_after, (summary, sent, sent_after)
    assert summary["flows"] >= 1 and summary["records"] >= 2, summary
