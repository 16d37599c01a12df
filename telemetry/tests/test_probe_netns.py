"""The XDP/tc flow probe on a real kernel datapath: a veth pair between two network namespaces
made by this module (`cgl-probe-<pid>-a|b`), traffic with known content sent from `a`, the probe
on `b`'s end. One run of traffic (≈5 s) feeds every assertion below:

* RTP-like UDP with planted sequence gaps, reordering, a duplicate, markers and timing jitter;
* ECN-marked UDP (10 packets of each codepoint, DSCP EF); IPv6 UDP; 802.1Q-tagged UDP;
* a TCP bulk transfer, checked against the kernel's own TCP segment counters;
* malformed and hostile frames (bad IHL, bad lengths, zero-length UDP, fragments, IPv6
  extension chains, bad TCP offset) interleaved with the good traffic.

The same frames, captured on `b` by an AF_PACKET recorder into a pcap, go through the pcap twin:
the test checks both paths give the same flows. Needs root; skipped otherwise.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections import defaultdict
from pathlib import Path

import pytest
from cgloop.telemetry.probe_cli import read_batches, run_pcap
from cgloop.v1.common_pb2 import DIRECTION_EGRESS, DIRECTION_INGRESS

pytestmark = [
    pytest.mark.root,
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root (network namespaces, BPF)"),
]

PID = os.getpid()
NS_A, NS_B = f"cgl-probe-{PID}-a", f"cgl-probe-{PID}-b"
IF_A, IF_B = f"cpa{PID}"[:15], f"cpb{PID}"[:15]
A4, B4 = "10.213.0.1", "10.213.0.2"
A6, B6 = "fd00:213::1", "fd00:213::2"
RTP_PORT, ECN_PORT, V6_PORT, VLAN_PORT, TCP_PORT = 5004, 7000, 7006, 7042, 9000
TCP_BYTES = 2_000_000
MALFORMED_EACH = 5
# Reason -> how many frames of that kind the sender emits.
MALFORMED = {
    "ipv4_truncated": MALFORMED_EACH,
    "ipv4_bad_ihl": MALFORMED_EACH,
    "ip_bad_length": MALFORMED_EACH,
    "udp_bad_length": 2 * MALFORMED_EACH,  # zero length, and longer than the IP payload
    "udp_truncated": MALFORMED_EACH,
    "fragment": 2 * MALFORMED_EACH,  # IPv4 offset != 0, IPv6 fragment header offset != 0
    "ipv6_ext_too_deep": MALFORMED_EACH,
    "ipv6_ext_truncated": MALFORMED_EACH,
    "tcp_bad_offset": MALFORMED_EACH,
    "ip_version_mismatch": MALFORMED_EACH,
}
# The RTP plan: sequence numbers start near the 16-bit wrap; these are never sent, these pairs
# are sent swapped (back to back), this one twice.
RTP_COUNT, RTP_FIRST_SEQ, RTP_PERIOD_NS, RTP_TICKS = 400, 65_400, 2_000_000, 180
RTP_SKIPPED = {100, 150, 200, 201, 202, 203, 320}
RTP_SWAPPED = [(50, 51), (250, 251)]
RTP_DUPLICATED = 120
JITTER_TOLERANCE_NS = 250_000


def sh(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(args, check=check, capture_output=True, text=True, timeout=30)


SENDER = textwrap.dedent(
    r"""
    import json, random, socket, struct, sys, time
    A4, B4, A6, B6, IF_A, plan = sys.argv[1:7]
    plan = json.loads(plan)
    random.seed(7)
    log = {"rtp": []}
    raw = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
    raw.bind((IF_A, 0))
    mac_b = bytes.fromhex(plan["mac_b"].replace(":", ""))
    mac_a = bytes.fromhex(plan["mac_a"].replace(":", ""))

    def csum(b):
        if len(b) % 2: b += b"\0"
        s = sum(struct.unpack(f"!{len(b)//2}H", b)); s = (s >> 16) + (s & 0xffff)
        return (~(s + (s >> 16))) & 0xffff

    def ip4(proto, payload, tot=None, ihl=5, frag=0, ver=4):
        tot = 20 + len(payload) if tot is None else tot
        h = struct.pack("!BBHHHBBH4s4s", (ver << 4) | ihl, 0, tot, 1, frag, 64, proto, 0,
                        socket.inet_aton(A4), socket.inet_aton(B4))
        return h[:10] + struct.pack("!H", csum(h)) + h[12:] + payload

    def eth(ethertype, body, vlan=None):
        head = mac_b + mac_a
        if vlan is not None:
            head += struct.pack("!HH", 0x8100, vlan)
        return head + struct.pack("!H", ethertype) + body

    def udp(sport, dport, data, length=None):
        length = 8 + len(data) if length is None else length
        return struct.pack("!HHHH", sport, dport, length, 0) + data

    def ip6(nh, payload):
        return (struct.pack("!IHBB", 6 << 28, len(payload), nh, 64)
                + socket.inet_pton(socket.AF_INET6, A6) + socket.inet_pton(socket.AF_INET6, B6)
                + payload)

    malformed = []
    n = plan["each"]
    for _ in range(n):
        malformed += [
            eth(0x0800, ip4(17, udp(1, 2, b""))[:10]),                       # ipv4_truncated
            eth(0x0800, ip4(17, udp(1, 2, b"x" * 8), ihl=3)),                # ipv4_bad_ihl
            eth(0x0800, ip4(17, udp(1, 2, b"x" * 8), tot=400)),              # ip_bad_length
            eth(0x0800, ip4(17, udp(1, 2, b"x" * 8, length=0))),             # udp_bad_length
            eth(0x0800, ip4(17, udp(1, 2, b"x" * 8, length=300))),           # udp_bad_length
            eth(0x0800, ip4(17, b"\x00\x01\x00")),                           # udp_truncated
            eth(0x0800, ip4(17, b"y" * 40, frag=0x2000 | 185)),              # fragment
            eth(0x86DD, ip6(44, struct.pack("!BBHI", 17, 0, 185 << 3, 9) + b"z" * 16)),  # fragment
            eth(0x86DD, ip6(0, b"".join(struct.pack("!BB6x", 60, 0) for _ in range(7))
                            + udp(1, 2, b""))),                              # ipv6_ext_too_deep
            eth(0x86DD, ip6(0, struct.pack("!BB6x", 60, 4))),                # ipv6_ext_truncated
            eth(0x0800, ip4(6, struct.pack("!HHIIBBHHH", 1, 2, 0, 0, 0x30, 2, 0, 0, 0))),  # doff 3
            eth(0x0800, ip4(17, udp(1, 2, b"v"), ver=6)),                    # version mismatch
        ]
    vlan_frames = [eth(0x0800, ip4(17, udp(40042, int(plan["vlan_port"]), b"v" * 64)), vlan=42)
                   for _ in range(15)]

    u4 = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    u4.bind((A4, 40000))
    # RTP: 90 kHz clock, one packet per period, random extra delay (the planted jitter).
    seqs = [i for i in range(plan["rtp_count"]) if i not in set(plan["skipped"])]
    for a, b in plan["swapped"]:
        ia, ib = seqs.index(a), seqs.index(b)
        seqs[ia], seqs[ib] = seqs[ib], seqs[ia]
    seqs.insert(seqs.index(plan["duplicated"]) + 1, plan["duplicated"])
    start = time.monotonic_ns() + 50_000_000
    mal = iter(malformed)
    prev = None
    for k, i in enumerate(seqs):
        swapped_second = prev is not None and any(prev == b and i == a for a, b in plan["swapped"])
        if not swapped_second and prev != i:  # swapped pairs and the duplicate go back to back
            target = start + i * plan["period_ns"] + random.randrange(0, 1_000_000)
            while time.monotonic_ns() < target:
                pass
        seq = (plan["first_seq"] + i) & 0xFFFF
        ts = (i * plan["ticks"]) & 0xFFFFFFFF
        marker = 0x80 if i % 10 == 0 else 0
        hdr = struct.pack("!BBHII", 0x80, marker | 96, seq, ts, 0xC0FFEE)
        log["rtp"].append([time.monotonic_ns(), i, seq, ts, marker != 0])
        u4.sendto(hdr + bytes(160), (B4, plan["rtp_port"]))
        prev = i
        if k % 4 == 0:
            frame = next(mal, None)
            if frame is not None:
                raw.send(frame)
        if k % 20 == 0 and vlan_frames:
            raw.send(vlan_frames.pop())
    for frame in list(mal) + vlan_frames:
        raw.send(frame)

    # ECN: 10 packets of each codepoint, DSCP EF (46).
    e = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    for ecn in (0, 2, 1, 3):
        e.setsockopt(socket.IPPROTO_IP, socket.IP_TOS, (46 << 2) | ecn)
        for _ in range(10):
            e.sendto(b"e" * 100, (B4, plan["ecn_port"]))
    # IPv6 UDP, ECT(0), 200-byte payloads.
    u6 = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
    u6.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_TCLASS, 2)
    for _ in range(20):
        u6.sendto(b"6" * 200, (B6, plan["v6_port"]))
    # TCP bulk.
    t = socket.create_connection((B4, plan["tcp_port"]), timeout=10)
    t.sendall(b"t" * plan["tcp_bytes"])
    t.shutdown(socket.SHUT_WR)
    while t.recv(65536):
        pass
    t.close()
    json.dump(log, sys.stdout)
    """
)

RECEIVER = textwrap.dedent(
    """
    import socket, sys
    srv = socket.create_server((sys.argv[1], int(sys.argv[2])))
    print("ready", flush=True)
    conn, _ = srv.accept()
    total = 0
    while data := conn.recv(65536):
        total += len(data)
    conn.close()
    print(total, flush=True)
    """
)

# Captures frames arriving on an interface into a pcap, putting back the VLAN tag the kernel
# moved into packet metadata (PACKET_AUXDATA), so the pcap holds the frames as XDP saw them.
RECORDER = textwrap.dedent(
    r"""
    import signal, socket, struct, sys, time
    ifname, out = sys.argv[1], sys.argv[2]
    s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(3))
    s.bind((ifname, 0))
    s.setsockopt(263, 8, 1)  # SOL_PACKET, PACKET_AUXDATA
    s.setsockopt(socket.SOL_SOCKET, 33, 64 << 20)  # SO_RCVBUFFORCE: keep up with TCP bulk
    s.setsockopt(socket.SOL_SOCKET, 35, 1)  # SO_TIMESTAMPNS: the kernel's receive time
    s.settimeout(0.2)
    stop = []
    signal.signal(signal.SIGTERM, lambda *a: stop.append(1))
    f = open(out, "wb")
    f.write(struct.pack("<IHHiIII", 0xA1B23C4D, 2, 4, 0, 0, 65535, 1))
    print("ready", flush=True)
    while not stop:
        try:
            data, anc, _, addr = s.recvmsg(65535, 256)
        except (socket.timeout, InterruptedError):
            continue
        if addr[2] == socket.PACKET_OUTGOING:
            continue
        ns = time.time_ns()
        for level, kind, val in anc:
            if level == socket.SOL_SOCKET and kind == 35 and len(val) >= 16:
                sec, nsec = struct.unpack("<qq", val[:16])
                ns = sec * 10**9 + nsec
            if level == 263 and kind == 8 and len(val) >= 20:
                status, _, _, _, _, tci, tpid = struct.unpack("<IIIHHHH", val[:20])
                if status & 0x10:  # TP_STATUS_VLAN_VALID
                    data = data[:12] + struct.pack("!HH", tpid or 0x8100, tci) + data[12:]
        f.write(struct.pack("<IIII", ns // 10**9, ns % 10**9, len(data), len(data)) + data)
    f.close()
    """
)


def netns_up() -> None:
    sh("ip", "netns", "add", NS_A)
    sh("ip", "netns", "add", NS_B)
    sh(
        "ip",
        "link",
        "add",
        IF_A,
        "netns",
        NS_A,
        "type",
        "veth",
        "peer",
        "name",
        IF_B,
        "netns",
        NS_B,
    )
    for ns, ifname, a4, a6 in ((NS_A, IF_A, A4, A6), (NS_B, IF_B, B4, B6)):
        sh("ip", "-n", ns, "addr", "add", f"{a4}/24", "dev", ifname)
        sh("ip", "-n", ns, "addr", "add", f"{a6}/64", "dev", ifname, "nodad")
        sh("ip", "-n", ns, "link", "set", ifname, "up")
        sh("ip", "-n", ns, "link", "set", "lo", "up")
        # One wire segment per TCP packet, so TCP counts compare with the kernel's own.
        sh(
            "ip",
            "netns",
            "exec",
            ns,
            "ethtool",
            "-K",
            ifname,
            "tso",
            "off",
            "gso",
            "off",
            "gro",
            "off",
            check=False,
        )


def netns_down() -> None:
    for ns in (NS_A, NS_B):
        sh("ip", "netns", "del", ns, check=False)


def mac(ns: str, ifname: str) -> str:
    link = json.loads(sh("ip", "-j", "-n", ns, "link", "show", ifname).stdout)
    return link[0]["address"]


def tcp_segments(ns: str) -> tuple[int, int]:
    """(InSegs, OutSegs) of the namespace's TCP stack."""
    out = sh("ip", "netns", "exec", ns, "cat", "/proc/net/snmp").stdout.splitlines()
    head, values = [line.split() for line in out if line.startswith("Tcp:")][:2]
    row = dict(zip(head[1:], values[1:], strict=True))
    return int(row["InSegs"]), int(row["OutSegs"])


def in_ns(ns: str, *cmd: str, **kw) -> subprocess.Popen:
    return subprocess.Popen(["ip", "netns", "exec", ns, *cmd], text=True, **kw)


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory, probe_binary: Path):
    tmp = tmp_path_factory.mktemp("probe")
    netns_down()
    netns_up()
    procs: list[subprocess.Popen] = []
    try:
        records_path, pcap_path = tmp / "records.bin", tmp / "seen.pcap"
        recorder = in_ns(NS_B, sys.executable, "-c", RECORDER, IF_B, str(pcap_path),
                         stdout=subprocess.PIPE)  # fmt: skip
        procs.append(recorder)
        probe = in_ns(
            NS_B, str(probe_binary), "run", "--iface", IF_B, "--output", str(records_path),
            "--pin-dir", f"/sys/fs/bpf/cgl-probe-{PID}", "--function", f"edge={IF_B}",
            stderr=subprocess.PIPE,
        )  # fmt: skip
        procs.append(probe)
        receiver = in_ns(NS_B, sys.executable, "-c", RECEIVER, B4, str(TCP_PORT),
                         stdout=subprocess.PIPE)  # fmt: skip
        procs.append(receiver)
        for p in (recorder, receiver):
            assert p.stdout is not None and p.stdout.readline().strip() == "ready"
        # The probe is attached once it says so on stderr.
        assert probe.stderr is not None
        deadline = time.monotonic() + 30
        while "observing" not in (line := probe.stderr.readline()):
            assert line and time.monotonic() < deadline, "probe did not start"
        tcp_before = tcp_segments(NS_B)
        plan = {
            "mac_a": mac(NS_A, IF_A), "mac_b": mac(NS_B, IF_B), "each": MALFORMED_EACH,
            "rtp_count": RTP_COUNT, "first_seq": RTP_FIRST_SEQ, "period_ns": RTP_PERIOD_NS,
            "ticks": RTP_TICKS, "skipped": sorted(RTP_SKIPPED), "swapped": RTP_SWAPPED,
            "duplicated": RTP_DUPLICATED, "rtp_port": RTP_PORT, "ecn_port": ECN_PORT,
            "v6_port": V6_PORT, "vlan_port": VLAN_PORT, "tcp_port": TCP_PORT,
            "tcp_bytes": TCP_BYTES,
        }  # fmt: skip
        sender = subprocess.run(
            ["ip", "netns", "exec", NS_A, sys.executable, "-c", SENDER, A4, B4, A6, B6, IF_A,
             json.dumps(plan)],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert sender.returncode == 0, sender.stderr
        received = int(receiver.communicate(timeout=30)[0].strip())
        time.sleep(0.3)  # let the last packets reach a sweep
        tcp_after = tcp_segments(NS_B)
        recorder.send_signal(signal.SIGTERM)
        recorder.wait(10)
        probe.send_signal(signal.SIGTERM)
        _, probe_err = probe.communicate(timeout=30)
        assert probe.returncode == 0, probe_err
        with records_path.open("rb") as f:
            records = [r for b in read_batches(f) for r in b.records]
        # After SIGTERM the programs are gone from the interface.
        link = json.loads(sh("ip", "-j", "-n", NS_B, "link", "show", IF_B).stdout)[0]
        tc = sh("ip", "netns", "exec", NS_B, "tc", "filter", "show", "dev", IF_B, "egress").stdout
        yield {
            "records": records,
            "stats": json.loads(probe_err.strip().splitlines()[-1]),
            "log": json.loads(sender.stdout),
            "tcp": (tcp_after[0] - tcp_before[0], tcp_after[1] - tcp_before[1]),
            "tcp_received": received,
            "pcap": pcap_path,
            "xdp_after": link.get("xdp"),
            "tc_after": tc,
        }
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        netns_down()


@pytest.fixture(scope="module")
def probe_binary() -> Path:
    from cgloop.binaries import BinaryNotFound, find_binary

    try:
        return find_binary("cgloop-probe")
    except BinaryNotFound as exc:
        pytest.fail(str(exc))


def flows(records, direction=None) -> dict[tuple, list]:
    """Records grouped by (src, sport, dst, dport, proto, vlan)."""
    out = defaultdict(list)
    for r in records:
        if direction is not None and r.direction != direction:
            continue
        t = r.five_tuple
        key = (bytes(t.src_addr), t.src_port, bytes(t.dst_addr), t.dst_port, t.ip_protocol,
               r.vlan_id)  # fmt: skip
        out[key].append(r)
    return out


def find(records, direction, dport, proto=17, vlan=0) -> list:
    hits = [
        recs
        for key, recs in flows(records, direction).items()
        if key[3] == dport and key[4] == proto and key[5] == vlan
    ]
    assert len(hits) == 1, f"expected one flow to port {dport}, found {len(hits)}"
    return hits[0]


def total(recs, field: str) -> int:
    return sum(getattr(r, field) for r in recs)


def test_rtp_counts_loss_reorder_and_jitter(run):
    recs = find(run["records"], DIRECTION_INGRESS, RTP_PORT)
    sent = len(run["log"]["rtp"])
    assert total(recs, "packets") == sent == RTP_COUNT - len(RTP_SKIPPED) + 1
    assert total(recs, "bytes") == sent * (20 + 8 + 12 + 160)
    assert {r.size_min_bytes for r in recs if r.packets} == {200}
    assert recs[-1].is_final and not any(r.is_final for r in recs[:-1])
    rtp = [r.rtp for r in recs if r.HasField("rtp")]
    assert {x.ssrc for x in rtp} == {0xC0FFEE} and {x.payload_type for x in rtp} == {96}
    assert sum(x.lost_packets for x in rtp) == len(RTP_SKIPPED)
    assert sum(x.reordered_packets for x in rtp) == len(RTP_SWAPPED)
    assert sum(x.duplicate_packets for x in rtp) == 1
    # Forward jumps: one per run of skipped numbers, one per swapped pair.
    assert sum(x.sequence_gaps for x in rtp) == 4 + len(RTP_SWAPPED)
    # Markers on every 10th packet, counted after the confirming (4th) packet.
    assert sum(x.marker_packets for x in rtp) == sum(1 for e in run["log"]["rtp"][4:] if e[4])
    assert rtp[-1].extended_highest_sequence == (1 << 16) + (RTP_FIRST_SEQ + RTP_COUNT - 1) % 65536
    # RFC 3550 jitter from the send log (send time standing in for arrival, over a veth).
    j, prev = 0.0, None
    for sent_ns, _, _, ts, _ in run["log"]["rtp"][3:]:  # from the confirming packet on
        transit = sent_ns - ts * 1e9 / 90_000
        if prev is not None:
            j += (abs(transit - prev) - j) / 16
        prev = transit
    assert abs(rtp[-1].jitter_ns - j) <= JITTER_TOLERANCE_NS, (rtp[-1].jitter_ns, j)
    assert j > 100_000  # the planted jitter is there to be measured


def test_ecn_dscp_ipv6_and_vlan(run):
    ecn = find(run["records"], DIRECTION_INGRESS, ECN_PORT)
    assert [total(ecn, f) for f in ("ecn_not_ect_packets", "ecn_ect0_packets",
            "ecn_ect1_packets", "ecn_ce_packets")] == [10, 10, 10, 10]  # fmt: skip
    assert ecn[-1].last_dscp == 46
    v6 = find(run["records"], DIRECTION_INGRESS, V6_PORT)
    assert total(v6, "packets") == 20 and total(v6, "bytes") == 20 * (40 + 8 + 200)
    assert total(v6, "ecn_ect0_packets") == 20
    assert len(v6[0].five_tuple.src_addr) == 16
    vlan = find(run["records"], DIRECTION_INGRESS, VLAN_PORT, vlan=42)
    assert total(vlan, "packets") == 15 and total(vlan, "bytes") == 15 * (20 + 8 + 64)


def test_tcp_bulk_matches_kernel_segment_counters(run):
    assert run["tcp_received"] == TCP_BYTES
    data = find(run["records"], DIRECTION_INGRESS, TCP_PORT, proto=6)
    acks = flows(run["records"], DIRECTION_EGRESS)
    back = [r for k, rs in acks.items() if k[1] == TCP_PORT and k[4] == 6 for r in rs]
    in_segs, out_segs = run["tcp"]
    # InSegs also counts the bad-offset segments, which TCP drops after counting them.
    assert total(data, "packets") == in_segs - MALFORMED["tcp_bad_offset"]
    assert total(back, "packets") == out_segs
    assert total(data, "bytes") > TCP_BYTES
    flags = 0
    for r in data:
        flags |= r.tcp_flags_seen
    assert flags & 0x13 == 0x13  # FIN, SYN, ACK
    for r in data:  # internal consistency of every interval record
        assert r.size_sum_bytes == r.bytes
        assert sum(r.size_histogram_bytes.buckets) == r.packets


def test_malformed_frames_counted_by_reason(run):
    stats = run["stats"]
    for reason, count in MALFORMED.items():
        assert stats[reason] == count, (reason, stats)
    for reason in ("eth_truncated", "vlan_truncated", "map_update_failed"):
        assert stats[reason] == 0
    assert stats["packets"] >= stats["accounted"] + sum(MALFORMED.values())


def test_probe_detached_cleanly(run):
    assert run["xdp_after"] is None
    assert "cgloop" not in run["tc_after"]


def test_pcap_twin_agrees_with_probe(run):
    twin = run_pcap(run["pcap"], "--direction", "ingress", "--interval-ms", "0")
    ours = {RTP_PORT, ECN_PORT, V6_PORT, VLAN_PORT, TCP_PORT}
    # Only the test's flows: neighbour discovery may start before or end after the recorder.
    probe_flows = {
        k: v for k, v in flows(run["records"], DIRECTION_INGRESS).items() if k[3] in ours
    }
    twin_flows = {k: v for k, v in flows(twin.records, DIRECTION_INGRESS).items() if k[3] in ours}
    assert len(probe_flows) == 5
    assert set(twin_flows) == set(probe_flows)
    exact = ("packets", "bytes", "size_sum_bytes", "size_sum_squares_bytes2", "ecn_not_ect_packets",
             "ecn_ect0_packets", "ecn_ect1_packets", "ecn_ce_packets")  # fmt: skip
    for key, precs in probe_flows.items():
        (trec,) = twin_flows[key]
        for f in exact:
            assert getattr(trec, f) == total(precs, f), (key, f)
        assert trec.last_dscp == precs[-1].last_dscp
        sizes = [0] * 16
        for r in precs:
            for i, n in enumerate(r.size_histogram_bytes.buckets):
                sizes[i] += n
        assert (
            list(trec.size_histogram_bytes.buckets)
            == sizes[: len(trec.size_histogram_bytes.buckets)]
        )
        if trec.HasField("rtp"):
            p = [r.rtp for r in precs if r.HasField("rtp")]
            assert trec.rtp.lost_packets == sum(x.lost_packets for x in p)
            assert trec.rtp.reordered_packets == sum(x.reordered_packets for x in p)
            assert trec.rtp.duplicate_packets == sum(x.duplicate_packets for x in p)
            assert trec.rtp.extended_highest_sequence == p[-1].extended_highest_sequence
            # Timing differs by where each path stamps a packet (XDP vs the recorder socket).
            assert abs(trec.rtp.jitter_ns - p[-1].jitter_ns) <= JITTER_TOLERANCE_NS
    for reason in MALFORMED:
        assert twin.summary[reason] == run["stats"][reason], reason
