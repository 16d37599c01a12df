"""Unit tests that need no root: topology, scenario, RTP framing, statistics, the BPF program."""

from __future__ import annotations

import ipaddress
import struct

import numpy as np
import pytest
from cgloop.lab.bpf import loss_program
from cgloop.lab.scenario import load_scenario
from cgloop.lab.topology import load_topology
from cgloop.lab.traffic.media import STAMP, Receiver, parse, rtp_packet
from cgloop.lab.traffic.profiles import PROFILES
from cgloop.lab.traffic.stats import Packets


def test_default_topology_is_lab_v2_and_routes_every_host_through_its_home_bottleneck():
    topo = load_topology()
    access = [(link.a, link.b) for link in topo.access_links()]
    core = [(link.a, link.b) for link in topo.core_links()]
    assert access == [("edge1", "cpe1"), ("edge2", "cpe2")]
    assert core == [("core", "edge1"), ("core", "edge2")]
    assert topo.bottleneck().a == "edge1"  # the first access link, as a one-edge lab had
    for link in topo.access_links():
        assert (link.bottleneck.down_mbit, link.bottleneck.up_mbit) == (100, 20)
        assert link.bottleneck.limit_packets == 1000
    # the core's links are faster than a home's: a home's traffic never queues at the core
    assert all(link.bottleneck.down_mbit > 100 for link in topo.core_links())
    # A client's only route is its default route to its cpe.
    gw = topo.link_between("cpe1", "cl1").addr_a
    assert topo.routes("cl1") == [(ipaddress.IPv4Network("0.0.0.0/0"), gw)]
    # The core reaches a home's subnets through that home's edge, and an edge the servers
    # and the other edge's homes through the core.
    core_routes = dict(topo.routes("core"))
    cl2_net = topo.link_between("cpe2", "cl2").subnet
    assert core_routes[topo.link_between("cpe1", "cl1").subnet] == topo.address_on("edge1", "core")
    assert core_routes[cl2_net] == topo.address_on("edge2", "core")
    edge1_routes = dict(topo.routes("edge1"))
    assert edge1_routes[cl2_net] == topo.address_on("core", "edge1")
    assert edge1_routes[topo.link_between("gs1", "core").subnet] == topo.address_on("core", "edge1")
    # each gaming packet queues at the core's egress towards its edge, then at its home's
    assert topo.path("gs1", "cl2") == ["gs1", "core", "edge2", "cpe2", "cl2"]
    assert topo.shaped_hops("gs1", "cl1") == [("core", "edge1"), ("edge1", "cpe1")]
    assert topo.shaped_hops("bulk", "edge2") == [("core", "edge2")]
    assert topo.access_link_of("home2").a == "edge2"
    with pytest.raises(KeyError, match="no access bottleneck"):
        topo.access_link_of("gs1")
    # an edge's own address faces the core (the core flood's sink binds there)
    assert topo.address("edge1") == topo.address_on("edge1", "core")
    assert topo.netns("edge1") == "cgl-edge1" and topo.egress_mbit("core", "edge1") == 200


def test_the_one_edge_lab_is_still_shipped():
    from cgloop.lab.scenario import V1_SCENARIO, check_scenario
    from cgloop.lab.topology import V1_TOPOLOGY

    topo = load_topology(shipped=V1_TOPOLOGY)
    assert (topo.bottleneck().a, topo.bottleneck().b) == ("edge", "cpe")
    assert topo.core_links() == []
    edge_routes = dict(topo.routes("edge"))
    assert edge_routes[ipaddress.IPv4Network("10.77.11.0/30")] == topo.bottleneck().addr_b
    check_scenario(load_scenario(shipped=V1_SCENARIO), topo)
    with pytest.raises(ValueError, match="no node 'home1'"):
        check_scenario(load_scenario(), topo)  # v2's scenario names v2's nodes


def test_lab_name_override_is_validated():
    assert load_topology(name="cgl-lab-123").netns("cl1") == "cgl-lab-123-cl1"
    with pytest.raises(ValueError, match="name"):
        load_topology(name="Bad Name!")


@pytest.mark.parametrize(
    ("yaml_text", "message"),
    [
        (
            "nodes: [{name: a, role: router}]\nlinks: [{a: a, b: z, subnet: 10.0.0.0/30}]",
            "unknown node 'z'",
        ),
        (
            "nodes: [{name: a, role: router}, {name: b, role: client}, {name: c, role: client}]\n"
            "links: [{a: a, b: b, subnet: 10.0.0.0/24}, {a: a, b: c, subnet: 10.0.0.0/30}]",
            "overlap",
        ),
        (
            "nodes: [{name: a, role: client}, {name: b, role: router}]\n"
            "links: [{a: a, b: b, subnet: 10.0.0.0/30, bottleneck: {down_mbit: 1, up_mbit: 1}}]",
            "must be a router",
        ),
        (
            "nodes: [{name: a, role: router}, {name: b, role: client}]\n"
            "links: [{a: a, b: b, subnet: 10.0.0.0/30,"
            " bottleneck: {down_mbit: 1, up_mbit: 1, tier: metro}}]",
            "tier",
        ),
        ("nodes: [{name: a, role: router}]\nlinks: [}", "not valid YAML"),
        ("nodes: [{name: a, role: wizard}]\nlinks: []", "role"),
    ],
)
def test_bad_topology_is_refused_with_the_file_and_reason(tmp_path, yaml_text, message):
    path = tmp_path / "topo.yaml"
    path.write_text(yaml_text)
    with pytest.raises(ValueError, match=message) as err:
        load_topology(path)
    assert str(path) in str(err.value)


def test_default_scenario_loads_and_bad_ones_are_refused(tmp_path):
    sc = load_scenario()
    assert {f.kind for f in sc.faults} == {
        "congestion", "core_congestion", "cpu_hog", "rate_cap", "loss", "ect1_abuse"
    }
    clients = {t.client for t in sc.traffic if t.kind == "gaming"}
    assert clients == {"cl1", "cl2"}  # gaming on both edges
    assert [t.at for t in sc.traffic if t.kind == "gaming" and t.at > 0]  # one joins late
    late = tmp_path / "late.yaml"
    late.write_text("duration: 5\nfaults: [{kind: loss, at: 4, duration: 3, percent: 5}]")
    with pytest.raises(ValueError, match="after the scenario"):
        load_scenario(late)
    unknown = tmp_path / "unknown.yaml"
    unknown.write_text("duration: 5\nfaults: [{kind: meteor, at: 1, duration: 1}]")
    with pytest.raises(ValueError, match=r"unknown\.yaml"):
        load_scenario(unknown)


def test_rtp_packet_round_trip_and_garbage():
    stamp = STAMP.pack(123456789, 7, 0, 3)
    pkt = rtp_packet(65535, 90000, 0xABCDEF, 96, True, stamp, 1200)
    assert len(pkt) == 1200
    assert pkt[0] >> 6 == 2 and pkt[1] & 0x80  # RTP v2, marker set
    assert parse(pkt) == (65535, 123456789, 96)
    assert parse(b"") is None
    assert parse(bytes(40)) is None  # version 0
    assert parse(pkt[:20]) is None  # too short for the stamp


def test_sequence_extension_handles_wrap_and_reordering():
    rx = Receiver.__new__(Receiver)
    rx._max = None
    seqs = [65533, 65534, 65535, 0, 65535 - 5, 1, 2]
    assert [rx._extend(s) for s in seqs] == [65533, 65534, 65535, 65536, 65530, 65537, 65538]


def test_summary_counts_loss_and_percentiles():
    seq = np.array([s for s in range(1000) if s % 10 != 0], dtype=np.int64)  # 10 % lost
    send = seq * 1_000_000
    recv = send + 2_000_000  # 2 ms one-way
    recv[-1] += 98_000_000  # one 100 ms outlier
    summ = Packets(seq, send, recv, np.full(len(seq), 1200)).summary()
    assert summ.expected == 999 and summ.lost == 99
    assert summ.p50_ms == pytest.approx(2.0)
    assert summ.max_ms == pytest.approx(100.0)
    window = Packets(seq, send, recv, np.full(len(seq), 1200)).window(0, 100_000_000)
    assert len(window) == 90


def test_loss_program_threshold_encodes_probability():
    for p in (0.05, 0.5, 1.0):
        code = loss_program(p)
        assert len(code) == 6 * 8
        # Instruction 1 is the JMP32 compare; its immediate is the unsigned drop threshold.
        _, _, _, imm = struct.unpack_from("<BBhi", code, 8)
        assert (imm & 0xFFFFFFFF) == min(int(p * 2**32) - 1, 2**32 - 1)
    with pytest.raises(ValueError):
        loss_program(0)


def test_gaming_profiles_follow_the_domain_notes():
    assert PROFILES["gfn"].down.rate_kbps == 33_000 and PROFILES["gfn"].down.fps == 60
    assert PROFILES["xc"].down.rate_kbps == 13_000
    assert PROFILES["psn"].up.fps == 100  # client input every 10 ms


def test_a_marked_gaming_session_sends_its_stream_with_the_dscp_and_the_input_unmarked(tmp_path):
    from cgloop.lab.sessions import GamingSpec, make_session
    from pydantic import ValidationError

    marked = make_session(None, "g", tmp_path, GamingSpec(platform="xc", dscp=46))
    assert marked.profile.down.tos == 46 << 2  # ECN bits left as the profile has them (0)
    assert marked.profile.up.tos == 0  # the client's input is the client's
    assert PROFILES["xc"].down.tos == 0  # the shared profile is not changed
    plain = make_session(None, "g", tmp_path, GamingSpec(platform="xc"))
    assert plain.profile is PROFILES["xc"]
    with pytest.raises(ValidationError, match="dscp"):
        GamingSpec(dscp=64)


def test_burst_flood_is_a_classic_unresponsive_flood_and_the_abuser_is_ect1():
    from cgloop.lab.faults import BurstFlood
    from cgloop.lab.scenario import Scenario
    from cgloop.lab.sessions import UdpBurstSpec
    from cgloop.lab.traffic.profiles import ect1_abuser, unresponsive_udp

    sc = Scenario.model_validate(
        {"duration": 5, "faults": [{"kind": "burst_flood", "at": 1, "duration": 2}]}
    )
    flood = sc.faults[0]
    assert isinstance(flood, BurstFlood) and (flood.rate_mbit, flood.burst_packets) == (80, 32)
    spec = unresponsive_udp(flood.rate_mbit, flood.burst_packets)
    assert spec.tos & 0x3 == 0 and spec.burst  # not ECT: best effort, whole bursts at once
    # one send event per burst: 80 Mbit/s in 32-packet (1200 B) bursts
    assert spec.fps == pytest.approx(80e6 / 8 / 1200 / 32)
    assert ect1_abuser(60).tos & 0x3 == 0x01
    with pytest.raises(ValueError, match="burst_packets"):
        UdpBurstSpec(burst_packets=0)


def test_scenario_naming_unknown_nodes_is_refused_before_anything_starts():
    from cgloop.lab.scenario import Scenario, check_scenario

    sc = Scenario.model_validate(
        {
            "duration": 5,
            "traffic": [{"kind": "gaming", "server": "gs9", "client": "cl1"}],
            "faults": [{"kind": "congestion", "at": 1, "duration": 1, "dst": "nowhere"}],
        }
    )
    with pytest.raises(ValueError, match=r"traffic\[0\]\.server: no node 'gs9'.*faults\[0\]\.dst"):
        check_scenario(sc, load_topology())
    check_scenario(load_scenario(), load_topology())  # the shipped pair fits


def _free_udp_port() -> int:
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_media_peers_over_loopback_measure_every_packet_and_survive_garbage(tmp_path):
    """Both generator ends on loopback (no root): cadence, loss, one-way delay, bad packets."""
    import socket
    import threading
    import time

    from cgloop.lab.traffic.media import run_peer

    a, b = _free_udp_port(), _free_udp_port()
    profile = PROFILES["test"]
    results = {}

    start_at = time.time_ns() + 300_000_000  # both bound before either sends, as in a scenario

    def peer(name, bind, to, spec):
        results[name] = run_peer(
            ("127.0.0.1", bind),
            ("127.0.0.1", to),
            spec,
            1.5,
            tmp_path / name,
            linger=0.5,
            start_at_ns=start_at,
        )

    threads = [
        threading.Thread(target=peer, args=("client", a, b, profile.up)),
        threading.Thread(target=peer, args=("server", b, a, profile.down)),
    ]
    for t in threads:
        t.start()
    time.sleep(0.2)  # both peers bound
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as junk:
        for payload in (b"", b"\x00" * 40, b"\x80garbage"):
            junk.sendto(payload, ("127.0.0.1", a))
    for t in threads:
        t.join(10)
    client, server = results["client"], results["server"]
    assert client["malformed"] == 3
    down = client["summary"]
    # 4 Mbit/s at 60 fps: ~8.3 kB frames, 7 packets each, ~90 frames in 1.5 s.
    assert server["sent"] > 400 and down["packets"] == server["sent"]
    assert down["loss_pct"] == 0 and 0 < down["p50_ms"] < 50
    assert client["ecn"]["not_ect"] == down["packets"]
    assert results["server"]["summary"]["packets"] == client["sent"] > 100  # input, 100 pps
    again = Packets.load(tmp_path / "client.npz")
    assert len(again) == down["packets"]


def test_responsive_l4s_sender_halves_on_echoed_ce_over_loopback(tmp_path):
    """The L4S sender's feedback path on loopback (no root): its packets leave marked CE (as a
    marking queue would mark them), the peer echoes the count, the sender halves its rate once
    per reaction interval; with its own ECT(1) and no marks it keeps its full rate."""
    import threading
    import time

    from cgloop.lab.traffic.media import run_peer
    from cgloop.lab.traffic.profiles import l4s_sender

    def session(tos: int) -> tuple[dict, dict]:
        profile = l4s_sender(8.0)
        down = profile.down.model_copy(update={"tos": tos})
        a, b = _free_udp_port(), _free_udp_port()
        results: dict = {}
        start_at = time.time_ns() + 300_000_000

        def peer(name, bind, to, spec):
            results[name] = run_peer(("127.0.0.1", bind), ("127.0.0.1", to), spec, 1.0,
                                     tmp_path / f"{name}{tos}", linger=0.3, start_at_ns=start_at)

        threads = [
            threading.Thread(target=peer, args=("client", a, b, profile.up)),
            threading.Thread(target=peer, args=("server", b, a, down)),
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(10)
        return results["client"], results["server"]

    client, server = session(0x03)  # every packet CE
    assert client["ecn"]["ce"] == client["received"] > 0
    assert server["echoed_ce"] > 0  # the echo came back
    # halved at most once per 20 ms over ~1 s, down to the 5 % floor
    assert 5 <= server["rate_cuts"] <= 60 and server["min_rate_factor"] <= 0.1
    quiet_client, quiet = session(0x01)  # ECT(1), never marked
    assert quiet_client["ecn"]["ect1"] == quiet_client["received"] > 0
    assert quiet["rate_cuts"] == 0 and quiet["echoed_ce"] == 0
    assert server["sent"] < quiet["sent"] / 3  # it really sent less


def test_a_sender_starved_of_cpu_drops_its_stale_frames_instead_of_bursting_them():
    """A sender held up 150 ms (as a loaded node starves a thread) resumes at the current
    frame: the ~15 frames it missed are counted as skipped, never sent back to back."""
    import threading
    import time

    from cgloop.lab.traffic.media import Sender
    from cgloop.lab.traffic.profiles import StreamSpec

    class StallingSocket:
        def __init__(self) -> None:
            self.sent_at: list[float] = []

        def setsockopt(self, *_: object) -> None:
            pass

        def sendto(self, data: bytes, peer: object) -> int:
            self.sent_at.append(time.monotonic())
            if len(self.sent_at) == 3:
                time.sleep(0.15)  # the thread loses the CPU mid-stream
            return len(data)

    spec = StreamSpec(rate_kbps=800, fps=100, payload_max=1200, size_cv=0)  # 1 packet a frame
    # a flood keeps its average rate: it sends what it missed
    flood = StallingSocket()
    Sender(flood, ("127.0.0.1", 9), spec.model_copy(update={"catch_up": True}), 0.5,  # type: ignore[arg-type]
           threading.Event(), seed=1).run()
    assert len(flood.sent_at) >= 45
    sock = StallingSocket()
    sender = Sender(sock, ("127.0.0.1", 9), spec, 0.5, threading.Event(), seed=1)  # type: ignore[arg-type]
    sender.run()
    resumed = sock.sent_at[2] + 0.15
    right_after = sum(1 for t in sock.sent_at[3:] if t < resumed + 0.02)
    assert sender.frames_skipped >= 10, sender.frames_skipped
    assert right_after <= 4, (right_after, sock.sent_at)  # a catch-up sends 15 at once
    assert len(sock.sent_at) + sender.frames_skipped == sender.frames  # sent or skipped, once


def test_new_fault_kinds_and_late_sessions_are_validated_with_file_and_field(tmp_path):
    from cgloop.lab.faults import CoreCongestion, CpuHog

    sc = load_scenario()
    hog = next(f for f in sc.faults if isinstance(f, CpuHog))
    assert (hog.node, hog.cores, hog.processes) == ("edge1", [1], 1)
    flood = next(f for f in sc.faults if isinstance(f, CoreCongestion))
    assert (flood.src, flood.dst) == ("bulk", "edge2")
    cases = {
        "faults: [{kind: cpu_hog, at: 1, duration: 1, node: edge1, cores: []}]": "cores",
        "faults: [{kind: cpu_hog, at: 1, duration: 1, node: edge1, cores: [1, 1]}]": "distinct",
        "faults: [{kind: cpu_hog, at: 1, duration: 1, cores: [0]}]": "node",
        "faults: [{kind: cpu_hog, at: 1, duration: 1, node: edge1, cores: [0], processes: 0}]":
            "processes",
        "faults: [{kind: rate_cap, at: 1, duration: 1, rate_mbit: 5, node: edge1}]":
            "both `node` and `peer`",
        "traffic: [{kind: gaming, at: 5}]": r"traffic\[0\] \(gaming\) starts at 5",
        "traffic: [{kind: gaming, at: -1}]": "at",
    }
    for i, (body, message) in enumerate(cases.items()):
        path = tmp_path / f"bad{i}.yaml"
        path.write_text(f"duration: 5\n{body}\n")
        with pytest.raises(ValueError, match=message) as err:
            load_scenario(path)
        assert str(path) in str(err.value), body


def test_scenario_that_does_not_fit_the_topology_or_machine_is_refused_naming_each_field():
    import os

    from cgloop.lab.scenario import Scenario, check_scenario

    beyond = max(os.sched_getaffinity(0)) + 1
    sc = Scenario.model_validate(
        {
            "duration": 5,
            "faults": [
                # TCP to a home is held back by the home's bottleneck: the core never queues
                {"kind": "core_congestion", "at": 1, "duration": 1, "dst": "home1"},
                {"kind": "cpu_hog", "at": 1, "duration": 1, "node": "edge1", "cores": [beyond]},
                {"kind": "rate_cap", "at": 1, "duration": 1, "rate_mbit": 5,
                 "node": "cpe1", "peer": "cl1"},
                {"kind": "loss", "at": 1, "duration": 1, "percent": 5,
                 "node": "edge1", "peer": "edge2"},
                {"kind": "core_congestion", "at": 1, "duration": 1, "src": "gs1", "dst": "core"},
            ],
        }
    )
    with pytest.raises(ValueError) as err:
        check_scenario(sc, load_topology())
    text = str(err.value)
    assert "faults[0].dst: bulk→home1 is limited by edge1→cpe1 (100 Mbit/s)" in text
    assert f"faults[1].cores: [{beyond}] not usable here" in text
    assert "faults[2]: the link cpe1-cl1 is not shaped" in text
    assert "faults[3].peer: edge1 has no link to 'edge2'" in text
    assert "faults[4].dst: gs1→core crosses no core link" in text


def test_generators_wait_for_the_start_signal_once_ready_and_begin_at_their_offset(tmp_path):
    """A generator with a start file binds, says it is ready, and sends only from the start
    the runner writes (plus its offset); one whose start never comes begins on its own."""
    import threading
    import time

    from cgloop.lab.sessions import StartSignal
    from cgloop.lab.traffic.media import run_peer

    a, b = _free_udp_port(), _free_udp_port()
    signal = StartSignal(tmp_path / "start.ns", 0.2)
    results = {}

    def peer(name, bind, to, spec, **kw):
        results[name] = run_peer(("127.0.0.1", bind), ("127.0.0.1", to), spec, 0.5,
                                 tmp_path / name, linger=0.3, **kw)

    threads = [
        threading.Thread(target=peer, args=("client", a, b, None),
                         kwargs={"start_file": signal.path}),
        threading.Thread(target=peer, args=("server", b, a, PROFILES["test"].down),
                         kwargs={"start_file": signal.path, "start_offset_s": 0.2}),
    ]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 10
    while not all((tmp_path / f"{n}.ready").exists() for n in ("client", "server")):
        assert time.monotonic() < deadline, "the generators never said they were ready"
        time.sleep(0.01)
    time.sleep(0.3)
    assert not results, "a generator went on before the start was fixed"
    start_ns = time.time_ns() + 100_000_000
    signal.fix(start_ns)
    for t in threads:
        t.join(10)
    server = results["server"]
    assert server["start_wait"] == "signalled"
    assert server["start_at_ns"] == start_ns + 200_000_000
    assert server["first_send_ns"] >= server["start_at_ns"] and server["sent"] > 0
    assert results["client"]["summary"]["packets"] == server["sent"]

    alone = run_peer(("127.0.0.1", _free_udp_port()), ("127.0.0.1", a), None, 0.1, None,
                     linger=0.0, start_file=tmp_path / "never.ns", start_timeout_s=0.05)
    assert alone["start_wait"] == "timeout"
