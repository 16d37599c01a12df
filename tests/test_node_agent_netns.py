"""The node agent against the real kernel: HTB + cls_bpf in network namespaces, driven over
gRPC with mutual TLS from the Python bindings (the policy engine's side of the contract).

The lab: two network namespaces joined by a veth pair, the real agent binary serving mutual TLS
on a Unix socket inside namespace A, UDP traffic from A to B. Everything is named after the
test's pid so parallel runs never collide, and torn down on exit (also on failure).
"""

from __future__ import annotations

import ctypes
import os
import select
import socket
import struct
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import grpc
import pytest
from cgloop.binaries import find_binary
from cgloop.policy.planners import calvin, catalogue
from cgloop.v1 import common_pb2, node_agent_pb2, node_agent_pb2_grpc
from cgloop.v1 import node_agent_pb2 as na

pytestmark = pytest.mark.root

T = TypeVar("T")
CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL("libc.so.6", use_errno=True)

# The hierarchy every test starts from (class ids are major << 16 | minor).
ROOT, LL, GAMING, DEFAULT, BULK = 0x10001, 0x10010, 0x10020, 0x10030, 0x10040


def in_netns(ns: str, fn: Callable[[], T]) -> T:
    """Run fn on a fresh thread that has joined network namespace ns (sockets it opens live
    there); setns only affects the calling thread, so the test thread stays where it is."""
    out: dict[str, object] = {}

    def run() -> None:
        fd = os.open(f"/var/run/netns/{ns}", os.O_RDONLY)
        try:
            if _libc.setns(fd, CLONE_NEWNET) != 0:
                out["error"] = OSError(ctypes.get_errno(), f"setns {ns}")
                return
            out["value"] = fn()
        except BaseException as exc:  # re-raised on the caller's thread
            out["error"] = exc
        finally:
            os.close(fd)

    t = threading.Thread(target=run)
    t.start()
    t.join()
    if "error" in out:
        raise out["error"]  # type: ignore[misc]
    return out["value"]  # type: ignore[return-value]


def sh(*args: str) -> None:
    subprocess.run(args, check=True, capture_output=True, timeout=20)


def hierarchy(iface: str) -> node_agent_pb2.QueueHierarchy:
    def cls(name: str, cid: int, parent: int, rate: int, prio: int) -> node_agent_pb2.HtbClass:
        return node_agent_pb2.HtbClass(
            name=name, class_id=cid, parent_class_id=parent, rate_bps=rate, ceil_bps=100_000_000,
            priority=prio,
        )

    return node_agent_pb2.QueueHierarchy(
        interface_name=iface,
        default_class_id=DEFAULT,
        classes=[
            node_agent_pb2.HtbClass(
                name="root", class_id=ROOT, rate_bps=100_000_000, ceil_bps=100_000_000
            ),
            cls("latency-critical", LL, ROOT, 20_000_000, 0),
            cls("gaming", GAMING, ROOT, 40_000_000, 1),
            cls("default", DEFAULT, ROOT, 20_000_000, 3),
            cls("bulk", BULK, ROOT, 10_000_000, 7),
        ],
    )


@dataclass
class Lab:
    tmp: Path
    tag: str = field(default_factory=lambda: f"{os.getpid() % 100000}")
    proc: subprocess.Popen[str] | None = None
    # A directory laid out like /sys/devices/system/cpu/cpufreq (this VM has no cpufreq).
    cpufreq_root: Path | None = None
    # Extra [power] keys (TOML lines), e.g. a fake cpuidle root.
    power_extra: str = ""

    def __post_init__(self) -> None:
        self.ns_a = f"cgl-na-{self.tag}-a"
        self.ns_b = f"cgl-na-{self.tag}-b"
        self.if_a = f"cgla{self.tag}"
        self.if_b = f"cglb{self.tag}"
        self.addr_a = "10.231.0.1"
        self.addr_b = "10.231.0.2"
        self.sock = self.tmp / "agent.sock"
        self.journal = self.tmp / "journal.pb"
        self.certs = self.tmp / "certs"
        self.binary = find_binary("cgloop-node-agent", prefer_release=False)

    # --- set-up and tear-down ---------------------------------------------------------------

    def up(self) -> Lab:
        self.down_net()
        sh("ip", "netns", "add", self.ns_a)
        sh("ip", "netns", "add", self.ns_b)
        sh("ip", "link", "add", self.if_a, "netns", self.ns_a, "type", "veth", "peer", "name",
           self.if_b, "netns", self.ns_b)
        for ns, iface, addr in ((self.ns_a, self.if_a, self.addr_a),
                                (self.ns_b, self.if_b, self.addr_b)):
            sh("ip", "-n", ns, "addr", "add", f"{addr}/24", "dev", iface)
            sh("ip", "-n", ns, "link", "set", iface, "up")
            sh("ip", "-n", ns, "link", "set", "lo", "up")
        subprocess.run([str(self.binary), "certs", "--out", str(self.certs)], check=True,
                       capture_output=True, timeout=30)
        (self.tmp / "agent.toml").write_text(
            f'node_id = "lab-{self.tag}"\n'
            "[bounds]\n"
            f'interfaces = ["{self.if_a}"]\n'
            "max_rate_bps = 1000000000\n"
            "max_drop_fraction = 0.6\n"
            + (f'[power]\ncpufreq_root = "{self.cpufreq_root}"\n{self.power_extra}'
               if self.cpufreq_root else "")
        )
        self.start()
        return self

    def start(self) -> None:
        self.proc = subprocess.Popen(
            ["ip", "netns", "exec", self.ns_a, str(self.binary), "serve",
             "--config", str(self.tmp / "agent.toml"), "--listen", f"unix:{self.sock}",
             "--tls-dir", str(self.certs), "--journal", str(self.journal)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        assert self.proc.stdout is not None
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            ready, _, _ = select.select([self.proc.stdout], [], [], 0.5)
            if ready:
                line = self.proc.stdout.readline()
                if "listening on" in line:
                    return
            if self.proc.poll() is not None:
                raise RuntimeError(f"agent exited: {self.proc.stderr.read()}")  # type: ignore[union-attr]
        raise RuntimeError("agent did not start within 20 s")

    def kill(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)
        self.proc = None

    def terminate(self) -> int:
        """SIGTERM (orderly shutdown); returns the exit status."""
        assert self.proc is not None
        self.proc.terminate()
        code = self.proc.wait(timeout=20)
        self.proc = None
        return code

    def down_net(self) -> None:
        for ns in (self.ns_a, self.ns_b):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=20)

    def down(self) -> None:
        self.kill()
        self.down_net()

    # --- gRPC ------------------------------------------------------------------------------

    def credentials(self, with_client_cert: bool = True) -> grpc.ChannelCredentials:
        ca = (self.certs / "ca.pem").read_bytes()
        if not with_client_cert:
            return grpc.ssl_channel_credentials(root_certificates=ca)
        return grpc.ssl_channel_credentials(
            root_certificates=ca,
            private_key=(self.certs / "client.key").read_bytes(),
            certificate_chain=(self.certs / "client.pem").read_bytes(),
        )

    def stub(self, creds: grpc.ChannelCredentials | None = None
             ) -> node_agent_pb2_grpc.NodeAgentServiceStub:
        channel = grpc.secure_channel(
            f"unix:{self.sock}", creds or self.credentials(),
            options=[("grpc.ssl_target_name_override", "localhost")],
        )
        return node_agent_pb2_grpc.NodeAgentServiceStub(channel)

    def flow(self, sport: int, dport: int) -> common_pb2.FiveTuple:
        return common_pb2.FiveTuple(
            src_addr=socket.inet_aton(self.addr_a), dst_addr=socket.inet_aton(self.addr_b),
            src_port=sport, dst_port=dport, ip_protocol=17,
        )

    def class_packets(self, stub: node_agent_pb2_grpc.NodeAgentServiceStub) -> dict[int, int]:
        state = stub.GetState(node_agent_pb2.GetStateRequest(), timeout=10).state
        return {c.class_id: c.sent_packets for q in state.queues for c in q.classes}

    # --- traffic ---------------------------------------------------------------------------

    def send(self, sport: int, dport: int, count: int, gap_s: float = 0.0,
             size: int = 64, payload: bytes = b"") -> None:
        def run() -> None:
            s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind((self.addr_a, sport))
            for i in range(count):
                s.sendto((struct.pack("!Q", i) + payload).ljust(size, b"\0"), (self.addr_b, dport))
                if gap_s:
                    time.sleep(gap_s)
            s.close()

        in_netns(self.ns_a, run)


class Receiver:
    """UDP receiver in namespace B that records (sequence, DSCP) of every datagram."""

    def __init__(self, lab: Lab, port: int) -> None:
        self.got: list[tuple[int, int]] = []
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=in_netns, args=(lab.ns_b, self._run), daemon=True)
        self._lab, self._port = lab, port
        self._thread.start()
        self._ready.wait(5)

    def _run(self) -> None:
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.setsockopt(socket.IPPROTO_IP, socket.IP_RECVTOS, 1)
        s.bind((self._lab.addr_b, self._port))
        s.settimeout(0.1)
        self._ready.set()
        while not self._stop.is_set():
            try:
                data, anc, _, _ = s.recvmsg(2048, socket.CMSG_SPACE(4))
            except TimeoutError:
                continue
            tos = next((d[0] for lvl, typ, d in anc
                        if lvl == socket.IPPROTO_IP and typ == socket.IP_TOS), 0)
            self.got.append((struct.unpack("!Q", data[:8])[0], tos >> 2))
        s.close()

    def stop(self) -> list[tuple[int, int]]:
        time.sleep(0.2)
        self._stop.set()
        self._thread.join(5)
        return self.got


def _skip_without_root() -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root (network namespaces, BPF)")


@pytest.fixture
def lab(tmp_path: Path) -> Iterator[Lab]:
    _skip_without_root()
    lab = Lab(tmp_path)
    try:
        yield lab.up()
    finally:
        lab.down()


def apply(stub, lab: Lab, action: str = "h1") -> na.ApplyQueueHierarchyResponse:
    return stub.ApplyQueueHierarchy(
        na.ApplyQueueHierarchyRequest(action_id=action, hierarchy=hierarchy(lab.if_a)), timeout=10
    )


def set_flow(stub, lab: Lab, action: str, sport: int, dport: int, class_id: int, **kw):
    rule = na.FlowClassRule(
        interface_name=lab.if_a, flow=lab.flow(sport, dport), class_id=class_id, **kw
    )
    return stub.SetFlowClass(na.SetFlowClassRequest(action_id=action, rule=rule), timeout=10)


def test_traffic_lands_in_the_class_of_its_flow_and_reclassification_hits_the_next_packet(lab):
    stub = lab.stub()
    resp = apply(stub, lab)
    assert resp.outcome.changed and not resp.HasField("previous")
    assert {c.class_id for c in resp.applied.classes} >= {LL, GAMING, DEFAULT, BULK}

    before = lab.class_packets(stub)
    lab.send(40001, 9000, 50)
    after = lab.class_packets(stub)
    assert after[DEFAULT] - before[DEFAULT] >= 50, "unclassified traffic goes to the default"

    set_flow(stub, lab, "f1", 40001, 9000, GAMING)
    before = after
    lab.send(40001, 9000, 50)
    lab.send(40002, 9000, 20)  # another flow stays in the default class
    after = lab.class_packets(stub)
    assert after[GAMING] - before[GAMING] == 50
    assert after[DEFAULT] - before[DEFAULT] >= 20

    # Reclassify while packets flow: every packet sent after the RPC returned carries the new
    # class's DSCP rewrite, i.e. the change is in force from the next packet on.
    rx = Receiver(lab, 9001)
    seq_at_return: list[int] = []
    sender_started = threading.Event()

    def pump() -> None:
        sender_started.set()
        lab.send(40003, 9001, 3000, gap_s=0.0002)

    t = threading.Thread(target=pump)
    t.start()
    sender_started.wait()
    time.sleep(0.1)
    t0 = time.monotonic_ns()
    resp = set_flow(stub, lab, "f2", 40003, 9001, LL, rewrite_dscp=46)
    rpc_ns = time.monotonic_ns() - t0
    seq_at_return.append(len(rx.got))
    t.join()
    got = rx.stop()
    assert got, "receiver saw nothing"
    first_marked = next(i for i, (_, dscp) in enumerate(got) if dscp == 46)
    assert all(dscp == 46 for _, dscp in got[first_marked:]), "a packet slipped back"
    assert first_marked <= seq_at_return[0], "packets after the RPC returned were not reclassified"
    print(f"reclassification RPC {rpc_ns / 1e6:.3f} ms, agent apply "
          f"{resp.outcome.apply_latency_ns / 1e3:.1f} us")

    state = stub.GetState(na.GetStateRequest(), timeout=10).state
    rules = {(r.flow.src_port, r.class_id): r for r in state.flow_classes if r.HasField("flow")}
    assert rules[(40001, GAMING)].matched_packets == 50
    assert rules[(40003, LL)].rewrite_dscp == 46
    assert state.classifiers[0].bpf_prog_id > 0


def test_class_rate_change_is_read_back_from_the_kernel(lab):
    stub = lab.stub()
    apply(stub, lab)
    resp = stub.SetClassRate(
        na.SetClassRateRequest(action_id="r1", interface_name=lab.if_a, class_id=BULK,
                               rate_bps=5_000_000, ceil_bps=8_000_000), timeout=10)
    assert resp.outcome.changed
    assert resp.previous.rate_bps == 10_000_000
    out = subprocess.run(["tc", "-n", lab.ns_a, "class", "show", "dev", lab.if_a],
                         capture_output=True, text=True, check=True).stdout
    assert "class htb 1:40" in out and "rate 5Mbit ceil 8Mbit" in out, out
    state = stub.GetState(na.GetStateRequest(), timeout=10).state
    bulk = next(c for c in state.queues[0].classes if c.class_id == BULK)
    assert (bulk.rate_bps, bulk.ceil_bps, bulk.name) == (5_000_000, 8_000_000, "bulk")


def fn(spec: dict | str, kind: int = 0, core: int = 0) -> na.ChainFunction:
    """A chain function from its policy form ({"mark": {"dscp": 46}}), kind and core set."""
    out = catalogue.function(spec)
    out.kind, out.core = kind, core
    return out


def scaled(f: na.ChainFunction, instances: int, cores: list[int] | None = None
           ) -> na.ChainFunction:
    """`f` run by `instances` instances (Natif's scale-out), pinned to `cores` when given."""
    f.instances = instances
    f.instance_cores.extend(cores or [])
    return f


def chain(cls: str, *fns: na.ChainFunction) -> na.ServiceChain:
    return na.ServiceChain(chain_id=f"{cls}-chain", traffic_class=cls, functions=fns)


def test_chain_filters_marks_and_limits_and_calvin_refuses_payload_work(lab):
    stub = lab.stub()
    apply(stub, lab)
    set_flow(stub, lab, "f1", 41000, 9100, GAMING)
    set_flow(stub, lab, "f2", 41001, 9101, GAMING)
    basic = na.FUNCTION_KIND_BASIC
    resp = stub.SetChain(na.SetChainRequest(action_id="c1", chain=chain(
        "gaming",
        fn({"acl": {"proto": 17, "dst_port": 9101}}, basic),
        fn({"mark": {"dscp": 34, "ecn": 1}}, basic),
        fn("forward", na.FUNCTION_KIND_ELEMENTARY),
    )), timeout=10)
    assert resp.outcome.changed
    rx_ok, rx_denied = Receiver(lab, 9100), Receiver(lab, 9101)
    lab.send(41000, 9100, 40)
    lab.send(41001, 9101, 40)
    ok, denied = rx_ok.stop(), rx_denied.stop()
    assert len(ok) == 40 and all(dscp == 34 for _, dscp in ok)
    assert denied == [], "the ACL let denied packets through"

    # Swap in a token bucket: 200 kbit/s with a 3000-byte burst passes about the burst.
    stub.SetChain(na.SetChainRequest(action_id="c2", chain=chain(
        "gaming", fn({"rate_limit": {"rate_bps": 200_000, "burst_bytes": 3000}}, basic),
    )), timeout=10)
    rx = Receiver(lab, 9100)
    lab.send(41000, 9100, 200, size=972)  # 1000-byte IP packets, sent back to back
    passed = len(rx.stop())
    assert 2 <= passed <= 20, f"token bucket passed {passed} of 200"
    state = stub.GetState(na.GetStateRequest(), timeout=10).state
    got_fn = state.chains[0].functions[0]
    assert catalogue.name_of(got_fn) == "rate_limit" and got_fn.rate_limit.rate_bps == 200_000
    assert got_fn.dropped_packets == 200 - passed

    with pytest.raises(grpc.RpcError) as err:
        stub.SetChain(na.SetChainRequest(action_id="c3", chain=chain(
            "gaming", fn({"dpi": {"text": "x", "drop": {}}}, basic))), timeout=10)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "CALVIN" in err.value.details()
    with pytest.raises(grpc.RpcError) as err:
        stub.SetChain(na.SetChainRequest(action_id="c4", chain=chain(
            "gaming", fn("acl", na.FUNCTION_KIND_ADVANCED))), timeout=10)
    assert "CALVIN" in err.value.details()


def test_advanced_dpi_runs_in_user_space_behind_af_xdp_and_swaps_atomically(lab):
    stub = lab.stub()
    apply(stub, lab)
    set_flow(stub, lab, "f1", 43000, 9300, GAMING)
    adv, basic = na.FUNCTION_KIND_ADVANCED, na.FUNCTION_KIND_BASIC
    stub.SetChain(na.SetChainRequest(action_id="a1", chain=chain(
        "gaming",
        fn({"mark": {"dscp": 10}}, basic),
        fn({"dpi": {"text": "GAMEINPUT", "mark_dscp": 46}}, adv),
    )), timeout=10)
    rx = Receiver(lab, 9300)
    lab.send(43000, 9300, 30, payload=b"..GAMEINPUT..")
    lab.send(43000, 9300, 30, payload=b"video frame")
    got = rx.stop()
    # The payload function's effect is visible on the far side: DSCP 46 on the matching
    # packets only; the others keep the BPF prefix's mark.
    assert sorted(d for _, d in got) == [10] * 30 + [46] * 30, got
    state = stub.GetState(na.GetStateRequest(), timeout=10).state
    fns = state.chains[0].functions
    assert [(catalogue.name_of(f), f.kind) for f in fns] == [("mark", basic), ("dpi", adv)]
    assert fns[1].dpi.text == "GAMEINPUT" and fns[1].dpi.mark_dscp == 46
    assert fns[0].packets == 60 and fns[1].packets == 60, "every packet went through user space"

    # Atomic swap under traffic. Chain A drops everything in user space (the pattern is in every
    # packet); chain B marks 20 and passes. A mix (A's prefix with B's suffix) would deliver
    # DSCP 10: it must never appear.
    stub.SetChain(na.SetChainRequest(action_id="a2", chain=chain(
        "gaming", fn({"mark": {"dscp": 10}}, basic),
        fn({"dpi": {"text": "SEQ", "drop": {}}}, adv),
    )), timeout=10)
    rx = Receiver(lab, 9300)
    sender = threading.Thread(target=lab.send, args=(43000, 9300, 3000),
                              kwargs={"gap_s": 0.0002, "payload": b"SEQ"})
    sender.start()
    time.sleep(0.15)
    stub.SetChain(na.SetChainRequest(action_id="a3", chain=chain(
        "gaming", fn({"mark": {"dscp": 20}}, basic),
        fn({"dpi": {"text": "NEVER", "drop": {}}}, adv),
    )), timeout=10)
    sender.join(60)
    got = rx.stop()
    seen = {d for _, d in got}
    assert seen == {20}, f"DSCP values on the far side: {seen}"
    first = min(seq for seq, _ in got)
    assert first > 0 and len(got) >= 0.9 * (3000 - first), (first, len(got))

    with pytest.raises(grpc.RpcError) as err:  # a basic function after an advanced one
        stub.SetChain(na.SetChainRequest(action_id="a4", chain=chain(
            "gaming", fn({"dpi": {"text": "x", "mark_dscp": 1}}, adv),
            fn({"mark": {"dscp": 1}}, basic),
        )), timeout=10)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "CALVIN" in err.value.details()
    with pytest.raises(grpc.RpcError) as err:  # no function set: the catalogue is listed
        stub.SetChain(na.SetChainRequest(action_id="a5", chain=chain(
            "gaming", na.ChainFunction(kind=adv))), timeout=10)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "dpi (advanced)" in err.value.details()

    # A killed agent leaves its AF_XDP port behind; the restarted one replaces it and restores
    # the chain (prefix in BPF, dpi in user space) from its journal.
    stub.GetState(na.GetStateRequest(), timeout=10)  # durability barrier
    lab.kill()
    lab.start()
    stub = lab.stub()
    rx = Receiver(lab, 9300)
    lab.send(43000, 9300, 20, payload=b"SEQ")
    got = rx.stop()
    assert len(got) == 20 and {d for _, d in got} == {20}, got
    fns = stub.GetState(na.GetStateRequest(), timeout=10).state.chains[0].functions
    assert [catalogue.name_of(f) for f in fns] == ["mark", "dpi"] and fns[1].packets == 20


def test_impairment_drops_about_the_configured_fraction(lab):
    stub = lab.stub()
    apply(stub, lab)
    stub.SetImpairment(na.SetImpairmentRequest(action_id="i1", impairment=na.Impairment(
        interface_name=lab.if_a, flow=lab.flow(42000, 9200), drop_fraction=0.5)), timeout=10)
    rx = Receiver(lab, 9200)
    lab.send(42000, 9200, 1000, gap_s=0.0001)
    got = len(rx.stop())
    imp = stub.GetState(na.GetStateRequest(), timeout=10).state.impairments[0]
    assert imp.seen_packets == 1000
    # Binomial(1000, 0.5): +-6 sigma is +-95.
    assert 405 <= imp.dropped_packets <= 595, imp.dropped_packets
    # What BPF passed arrives (a loaded receiver may miss a few, never gain any).
    passed = 1000 - imp.dropped_packets
    assert 0.9 * passed <= got <= passed, (got, passed)
    with pytest.raises(grpc.RpcError) as err:
        stub.SetImpairment(na.SetImpairmentRequest(action_id="i2", impairment=na.Impairment(
            interface_name=lab.if_a, flow=lab.flow(42000, 9200), drop_fraction=0.9)), timeout=10)
    assert err.value.code() == grpc.StatusCode.OUT_OF_RANGE


def test_bounds_idempotency_and_dry_run(lab):
    stub = lab.stub()
    dry = stub.ApplyQueueHierarchy(na.ApplyQueueHierarchyRequest(
        action_id="d1", dry_run=True, hierarchy=hierarchy(lab.if_a)), timeout=10)
    assert dry.outcome.dry_run and not dry.outcome.changed and "tc class" in dry.outcome.message
    assert not stub.GetState(na.GetStateRequest(), timeout=10).state.queues, "dry run applied"

    first = apply(stub, lab, "h1")
    again = apply(stub, lab, "h1")
    assert again.outcome.replayed and not again.outcome.changed
    assert again.applied == first.applied

    def refused(req_fn, code: grpc.StatusCode, needle: str) -> None:
        with pytest.raises(grpc.RpcError) as err:
            req_fn()
        assert err.value.code() == code, err.value.details()
        assert needle in err.value.details(), err.value.details()

    big = hierarchy(lab.if_a)
    big.classes[1].rate_bps = 10_000_000_000
    big.classes[1].ceil_bps = 10_000_000_000
    refused(lambda: stub.ApplyQueueHierarchy(na.ApplyQueueHierarchyRequest(
        action_id="h2", hierarchy=big), timeout=10), grpc.StatusCode.OUT_OF_RANGE, "rate_bps")
    other = hierarchy("lo")
    refused(lambda: stub.ApplyQueueHierarchy(na.ApplyQueueHierarchyRequest(
        action_id="h3", hierarchy=other), timeout=10), grpc.StatusCode.PERMISSION_DENIED, "lo")
    refused(lambda: set_flow(stub, lab, "h1", 1, 2, GAMING),
            grpc.StatusCode.ALREADY_EXISTS, "action_id")
    refused(lambda: set_flow(stub, lab, "", 1, 2, GAMING),
            grpc.StatusCode.INVALID_ARGUMENT, "action_id")
    refused(lambda: set_flow(stub, lab, "x1", 1, 2, 0x10099),
            grpc.StatusCode.NOT_FOUND, "1:99")
    refused(lambda: set_flow(stub, lab, "x2", 1, 70000, GAMING),
            grpc.StatusCode.INVALID_ARGUMENT, "dst_port")


def test_bounds_hold_for_chain_targets_cores_and_child_rates(lab):
    """issue 17 finding 5: with `[bounds] interfaces` set to the lab's interface, a mirror to
    `lo` was installed, a function pinned to core 9999 accepted, and a child class at
    500 Mbit/s under a 100 Mbit/s parent applied. Each is refused by name, and nothing of it
    reaches the kernel."""
    stub = lab.stub()
    apply(stub, lab)
    basic, adv = na.FUNCTION_KIND_BASIC, na.FUNCTION_KIND_ADVANCED

    def refused(action: str, req_fn, code: grpc.StatusCode, *needles: str) -> None:
        with pytest.raises(grpc.RpcError) as err:
            req_fn(action)
        assert err.value.code() == code, err.value.details()
        for needle in needles:
            assert needle in err.value.details(), err.value.details()

    for target in ("lo", lab.if_b):  # lo, and an interface of the other namespace's name
        refused(f"m-{target}", lambda a, t=target: stub.SetChain(na.SetChainRequest(
            action_id=a, chain=chain("gaming", fn({"mirror": {"interface": t}}, basic))),
            timeout=10),
            grpc.StatusCode.PERMISSION_DENIED, f'interface "{target}"', lab.if_a)
    pinned = chain("gaming", fn({"dpi": {"text": "x", "mark_dscp": 1}}, adv, core=9999))
    refused("core", lambda a: stub.SetChain(na.SetChainRequest(action_id=a, chain=pinned),
                                            timeout=10),
            grpc.StatusCode.INVALID_ARGUMENT, "core 9999")
    assert not stub.GetState(na.GetStateRequest(), timeout=10).state.chains, "a chain went in"

    fast = hierarchy(lab.if_a)
    fast.classes[2].rate_bps = fast.classes[2].ceil_bps = 500_000_000  # gaming, under 100M
    refused("fast", lambda a: stub.ApplyQueueHierarchy(na.ApplyQueueHierarchyRequest(
        action_id=a, hierarchy=fast), timeout=10),
            grpc.StatusCode.INVALID_ARGUMENT, "gaming", "500000000", "100000000")
    refused("fast-rate", lambda a: stub.SetClassRate(na.SetClassRateRequest(
        action_id=a, interface_name=lab.if_a, class_id=GAMING, rate_bps=500_000_000,
        ceil_bps=500_000_000), timeout=10),
            grpc.StatusCode.INVALID_ARGUMENT, "500000000", "100000000")
    gaming = next(c for c in stub.GetState(na.GetStateRequest(), timeout=10).state.queues[0]
                  .classes if c.class_id == GAMING)
    assert gaming.ceil_bps == 100_000_000, "the kernel got the faster class"


# Policy files the product ships (the engine's defaults and the loop's).
ROOT_DIR = Path(__file__).resolve().parents[1]
SHIPPED_POLICIES = [
    *sorted((ROOT_DIR / "policy-engine/src/cgloop/policy/policies").glob("*.yaml")),
    *sorted((ROOT_DIR / "loop/src/cgloop/loop/data/policies").glob("*.yaml")),
]


def shipped_chains(online: list[int]) -> list[tuple[str, na.ServiceChain]]:
    """Every chain the shipped policies can order, CALVIN-placed as the engine places it
    (calvin.place_service_chain). A set_chain policy names its chain literally: no template
    field reaches the chain. Its free cores are an edge node's; on a machine without them the
    placement gets this machine's cores (the core bound is tested on its own)."""
    import yaml

    out = []
    for path in SHIPPED_POLICIES:
        for p in yaml.safe_load(path.read_text()).get("policies", []):
            action = p.get("action", {})
            if action.get("operation") != "set_chain":
                continue
            params = action["parameters"]
            cores = [c for c in params.get("free_cores", []) if c in online] or online[1:]
            placed = calvin.place_service_chain(
                [catalogue.function(f) for f in params["functions"]],
                chain_id=params["chain_id"],
                traffic_class=params["traffic_class"],
                base_rtt_s=params.get("base_rtt_us", 0) * 1e-6,
                free_cores=cores,
                processing_s=[us * 1e-6 for us in params.get("processing_us", [])] or None,
            )
            out.append((f"{path.name}:{p['id']}", placed))
    return out


def test_every_chain_the_shipped_policies_order_passes_the_real_agents_dry_run(lab):
    """issue 18: the shipped chain policy asked for nat, packet_filter and network_coding,
    which the agent refuses as unknown; the tests passed because the fake accepted any name."""
    stub = lab.stub()
    apply(stub, lab)
    online = sorted(os.sched_getaffinity(0))
    chains = shipped_chains(online)
    assert chains, "no shipped policy orders a chain: the test would prove nothing"
    for where, placed in chains:
        resp = stub.SetChain(
            na.SetChainRequest(action_id=f"dry-{where}", dry_run=True, chain=placed), timeout=10
        )
        assert resp.outcome.dry_run, where
    assert not stub.GetState(na.GetStateRequest(), timeout=10).state.chains, "dry run applied"


def bad_chains(lab: Lab) -> dict[str, na.ServiceChain]:
    """Chains the agent must refuse, one reason each (catalogue, CALVIN, bounds, state)."""
    basic, adv = na.FUNCTION_KIND_BASIC, na.FUNCTION_KIND_ADVANCED
    kind9 = fn("forward")
    kind9.kind = 9
    return {
        "no function set": chain("gaming", na.ChainFunction()),
        "mark without dscp or ecn": chain("gaming", fn({"mark": {}})),
        "dscp 64": chain("gaming", fn({"mark": {"dscp": 64}})),
        "port 70000": chain("gaming", fn({"acl": {"dst_port": 70000}})),
        "rate 0": chain("gaming", fn({"rate_limit": {"burst_bytes": 3000}})),
        "burst 10": chain("gaming", fn({"rate_limit": {"rate_bps": 1_000_000, "burst_bytes": 10}})),
        "rate over the bounds": chain(
            "gaming", fn({"rate_limit": {"rate_bps": 2_000_000_000, "burst_bytes": 3000}})
        ),
        "mirror to lo": chain("gaming", fn({"mirror": {"interface": "lo"}}, basic)),
        "mirror to the peer": chain("gaming", fn({"mirror": {"interface": lab.if_b}})),
        "mirror to no interface": chain("gaming", fn({"mirror": {}})),
        "dpi without an action": chain("gaming", fn({"dpi": {"text": "GAME"}})),
        "dpi without a pattern": chain("gaming", fn({"dpi": {"mark_dscp": 46}})),
        "dpi pattern of 65 bytes": chain("gaming", fn({"dpi": {"text": "x" * 65, "drop": {}}})),
        "dpi bad hex": chain("gaming", fn({"dpi": {"hex": "zz", "drop": {}}})),
        "dpi depth 0": chain("gaming", fn({"dpi": {"text": "G", "depth": 0, "drop": {}}})),
        "dpi in BPF": chain("gaming", fn({"dpi": {"text": "G", "drop": {}}}, basic)),
        "acl in user space": chain("gaming", fn("acl", adv)),
        "kind 9": chain("gaming", kind9),
        "basic after advanced": chain(
            "gaming", fn({"dpi": {"text": "G", "drop": {}}}), fn({"mark": {"dscp": 1}})
        ),
        "core 9999": chain("gaming", fn({"dpi": {"text": "x", "mark_dscp": 1}}, adv, 9999)),
        # Natif's scale-out (ChainFunction.instances / instance_cores).
        "instances on a basic function": chain("gaming", scaled(fn({"mark": {"dscp": 1}}), 2)),
        "instances over the bound": chain(
            "gaming", scaled(fn({"dpi": {"text": "x", "drop": {}}}), 5)
        ),
        "instance_cores of another length": chain(
            "gaming", scaled(fn({"dpi": {"text": "x", "drop": {}}}), 2, [0])
        ),
        "instance core 9999": chain(
            "gaming", scaled(fn({"dpi": {"text": "x", "drop": {}}}), 2, [0, 9999])
        ),
        "nine functions": chain("gaming", *[fn("forward")] * 9),
        "no traffic class": chain("", fn("forward")),
        "class no hierarchy has": chain("no-such-class", fn("forward")),
    }


def test_the_memory_agent_refuses_what_the_real_agent_refuses(lab):
    """The policy engine's tests run against MemoryNodeAgent (cgloop.policy.fake_agent): a
    double that accepted what the real agent refuses hid a broken contract before. The same
    requests go to both, with the same bounds and queues: bad chains are refused by both with
    the same status code and the same message, out-of-bounds class rates with the same code,
    and the good requests (every shipped chain, a rate in bounds) are accepted by both, which
    then report the same chains in GetState."""
    from cgloop.policy.testing import AgentBounds, AgentServer, MemoryNodeAgent

    real = lab.stub()
    apply(real, lab)
    online = sorted(os.sched_getaffinity(0))
    fake_agent = MemoryNodeAgent(
        "fake",
        bounds=AgentBounds(interfaces=[lab.if_a], max_rate_bps=1_000_000_000),
        hierarchies=[hierarchy(lab.if_a)],  # what `apply` gave the real agent
    )

    def rate(bps: int, iface: str = lab.if_a) -> na.SetClassRateRequest:
        return na.SetClassRateRequest(
            interface_name=iface, class_id=GAMING, rate_bps=bps, ceil_bps=bps)

    requests = {  # name: (method, request, expected status, same message)
        "child over its parent": ("SetClassRate", rate(500_000_000),
                                  grpc.StatusCode.INVALID_ARGUMENT, False),
        "below the minimum rate": ("SetClassRate", rate(1_000), grpc.StatusCode.OUT_OF_RANGE,
                                   False),
        "interface out of bounds": ("SetClassRate", rate(10_000_000, "lo"),
                                    grpc.StatusCode.PERMISSION_DENIED, False),
        "in bounds": ("SetClassRate", rate(10_000_000), grpc.StatusCode.OK, False),
    }
    for name, bad in bad_chains(lab).items():
        requests[name] = ("SetChain", na.SetChainRequest(chain=bad), None, True)
    for where, good in shipped_chains(online):
        requests[where] = ("SetChain", na.SetChainRequest(chain=good), grpc.StatusCode.OK, True)
    # Last, so GetState compares a scaled-out function's read-back (instances, instance_cores).
    two = scaled(fn({"dpi": {"text": "G", "mark_dscp": 46}}), 2, [online[0], online[-1]])
    requests["dpi on two instances"] = (
        "SetChain", na.SetChainRequest(chain=chain("gaming", fn({"mark": {"dscp": 1}}), two)),
        grpc.StatusCode.OK, True,
    )
    with AgentServer(fake_agent) as server:
        fake = node_agent_pb2_grpc.NodeAgentServiceStub(grpc.insecure_channel(server.address))
        for name, (method, request, expected, same_message) in requests.items():
            answers = []
            for who, stub in (("real", real), ("fake", fake)):
                req = type(request)()
                req.CopyFrom(request)
                req.action_id = f"{who}-{name}"
                try:
                    getattr(stub, method)(req, timeout=10)
                    answers.append((grpc.StatusCode.OK, ""))
                except grpc.RpcError as err:
                    answers.append((err.code(), err.details()))
            (real_code, real_msg), (fake_code, fake_msg) = answers
            if expected is None:  # a bad chain: refused, as the agent's validation refuses it
                assert real_code in (
                    grpc.StatusCode.INVALID_ARGUMENT,
                    grpc.StatusCode.OUT_OF_RANGE,
                    grpc.StatusCode.PERMISSION_DENIED,
                    grpc.StatusCode.FAILED_PRECONDITION,
                ), f"{name}: the real agent answered {real_code} {real_msg}"
            else:
                assert real_code == expected, f"{name}: real agent {real_code} {real_msg}"
            assert fake_code == real_code, f"{name}: real {real_code}, fake {fake_code} {fake_msg}"
            if same_message:
                assert fake_msg == real_msg, f"{name}: real {real_msg!r}, fake {fake_msg!r}"
        # What was applied reads back alike (the fake's GetState is what rollbacks compare).
        got = [s.GetState(na.GetStateRequest(), timeout=10).state for s in (real, fake)]
    for c in got[0].chains:
        for f in c.functions:
            f.packets = f.dropped_packets = 0
    assert list(got[1].chains) == list(got[0].chains)
    assert [(q.interface_name, q.default_class_id) for q in got[1].queues] == [
        (q.interface_name, q.default_class_id) for q in got[0].queues
    ]


def test_mutual_tls_refuses_clients_without_a_lab_certificate(lab, tmp_path):
    no_cert = lab.stub(lab.credentials(with_client_cert=False))
    with pytest.raises(grpc.RpcError) as err:
        no_cert.GetState(na.GetStateRequest(), timeout=5)
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE

    other_ca = tmp_path / "other"
    subprocess.run([str(lab.binary), "certs", "--out", str(other_ca)], check=True,
                   capture_output=True, timeout=30)
    creds = grpc.ssl_channel_credentials(
        root_certificates=(lab.certs / "ca.pem").read_bytes(),
        private_key=(other_ca / "client.key").read_bytes(),
        certificate_chain=(other_ca / "client.pem").read_bytes(),
    )
    with pytest.raises(grpc.RpcError) as err:
        lab.stub(creds).GetState(na.GetStateRequest(), timeout=5)
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    assert lab.stub().GetState(na.GetStateRequest(), timeout=5).state.node_id.startswith("lab-")


def test_restarted_agent_restores_the_journal_into_the_kernel(lab):
    stub = lab.stub()
    apply(stub, lab)
    set_flow(stub, lab, "f1", 43000, 9300, GAMING)
    stub.SetChain(na.SetChainRequest(action_id="c1", chain=chain(
        "gaming", fn({"mark": {"dscp": 10}}, na.FUNCTION_KIND_BASIC))), timeout=10)
    # The journal is written behind the RPCs (group commit); GetState answers once every
    # change acknowledged before it is in the journal, so after it a crash loses nothing.
    stub.GetState(na.GetStateRequest(), timeout=10)
    lab.kill()
    # Lose the kernel state too (as a reboot of the datapath would).
    subprocess.run(["tc", "-n", lab.ns_a, "qdisc", "del", "dev", lab.if_a, "root"], check=True)
    subprocess.run(["tc", "-n", lab.ns_a, "qdisc", "del", "dev", lab.if_a, "clsact"], check=True)
    lab.start()
    stub = lab.stub()
    state = stub.GetState(na.GetStateRequest(), timeout=10).state
    assert {c.name for c in state.queues[0].classes} >= {"gaming", "bulk"}
    assert state.classifiers[0].bpf_prog_id > 0
    assert any(r.flow.src_port == 43000 and r.class_id == GAMING for r in state.flow_classes)
    # The action ids survive too: a retry of f1 is answered, not re-applied.
    assert set_flow(stub, lab, "f1", 43000, 9300, GAMING).outcome.replayed
    before = lab.class_packets(stub)
    rx = Receiver(lab, 9300)
    lab.send(43000, 9300, 30)
    got = rx.stop()
    assert lab.class_packets(stub)[GAMING] - before[GAMING] == 30
    assert len(got) == 30 and all(dscp == 10 for _, dscp in got)


def slow_commits(lab: Lab) -> None:
    """Restart the agent with a 1 s group-commit window, so "not yet written" lasts."""
    lab.kill()
    toml = lab.tmp / "agent.toml"
    toml.write_text("journal_commit_delay_us = 1000000\n" + toml.read_text())
    lab.start()


def test_sigterm_right_after_changes_keeps_them_in_the_journal(lab):
    slow_commits(lab)
    stub = lab.stub()
    apply(stub, lab)
    for i in range(20):
        set_flow(stub, lab, f"g{i}", 44000 + i, 9400, GAMING if i % 2 else BULK)
    # No barrier: the orderly shutdown commits what the writer had not written yet.
    assert lab.terminate() == 0
    lab.start()
    stub = lab.stub()
    state = stub.GetState(na.GetStateRequest(), timeout=10).state
    rules = {r.flow.src_port: r.class_id for r in state.flow_classes if r.HasField("flow")}
    assert rules == {44000 + i: GAMING if i % 2 else BULK for i in range(20)}
    # Every action id is remembered: a retry replays, the id with a new request conflicts.
    assert set_flow(stub, lab, "g19", 44019, 9400, GAMING).outcome.replayed
    with pytest.raises(grpc.RpcError) as err:
        set_flow(stub, lab, "g0", 44000, 9400, GAMING)
    assert err.value.code() == grpc.StatusCode.ALREADY_EXISTS


def test_a_crash_loses_only_changes_inside_the_commit_window(lab):
    slow_commits(lab)
    stub = lab.stub()
    apply(stub, lab)
    set_flow(stub, lab, "w1", 43200, 9300, GAMING)
    stub.GetState(na.GetStateRequest(), timeout=10)  # barrier: w1 is in the journal
    set_flow(stub, lab, "w2", 43201, 9300, BULK)
    lab.kill()  # SIGKILL well inside w2's 1 s window
    lab.start()
    stub = lab.stub()
    state = stub.GetState(na.GetStateRequest(), timeout=10).state
    rules = {r.flow.src_port: r.class_id for r in state.flow_classes if r.HasField("flow")}
    assert rules == {43200: GAMING}, "w1 survives, w2 was acknowledged but not yet written"
    assert set_flow(stub, lab, "w1", 43200, 9300, GAMING).outcome.replayed
    # The caller retries w2 with its action id: applied again, not refused.
    again = set_flow(stub, lab, "w2", 43201, 9300, BULK).outcome
    assert not again.replayed and again.changed


def test_crash_after_the_commit_delay_loses_nothing(lab):
    stub = lab.stub()
    apply(stub, lab)
    set_flow(stub, lab, "k1", 43100, 9300, GAMING)
    set_flow(stub, lab, "k2", 43101, 9300, BULK)
    # The documented bound: a change is in the journal within journal_commit_delay_us (1 ms)
    # plus one write. Half a second is far beyond it, even on a loaded machine.
    time.sleep(0.5)
    lab.kill()
    lab.start()
    stub = lab.stub()
    state = stub.GetState(na.GetStateRequest(), timeout=10).state
    rules = {r.flow.src_port: r.class_id for r in state.flow_classes if r.HasField("flow")}
    assert rules == {43100: GAMING, 43101: BULK}
    assert set_flow(stub, lab, "k2", 43101, 9300, BULK).outcome.replayed


def fake_cpufreq(root: Path) -> Path:
    """policy0 (cpu0) with a P-state table, laid out like the kernel's cpufreq sysfs."""
    p = root / "cpufreq" / "policy0"
    p.mkdir(parents=True)
    files = {
        "affected_cpus": "0", "related_cpus": "0", "cpuinfo_min_freq": "1200000",
        "cpuinfo_max_freq": "3000000", "cpuinfo_transition_latency": "10000",
        "scaling_available_frequencies": "3000000 2400000 1800000 1200000",
        "scaling_available_governors": "performance powersave userspace schedutil",
        "scaling_driver": "acpi-cpufreq", "scaling_governor": "schedutil",
        "scaling_min_freq": "1200000", "scaling_max_freq": "3000000",
        "scaling_cur_freq": "3000000", "scaling_setspeed": "<unsupported>",
    }
    for name, value in files.items():
        (p / name).write_text(value + "\n")
    (root / "cpu0").mkdir()
    (root / "cpu0" / "cpufreq").symlink_to("../cpufreq/policy0")
    return root / "cpufreq"


def test_power_policy_over_grpc_writes_the_cpufreq_tree(tmp_path):
    _skip_without_root()
    lab = Lab(tmp_path)
    lab.cpufreq_root = fake_cpufreq(tmp_path / "cpu")
    try:
        stub = lab.up().stub()
        resp = stub.SetPowerPolicy(na.SetPowerPolicyRequest(action_id="p1", policy=na.PowerPolicy(
            cores=[0], governor="userspace", min_frequency_khz=1_200_000,
            max_frequency_khz=2_400_000, xman_mode=na.XMAN_MODE_PINNED_MAX)), timeout=10)
        assert list(resp.applied.cores) == [0]
        assert resp.previous[0].governor == "schedutil"
        policy = lab.cpufreq_root / "policy0"
        assert (policy / "scaling_governor").read_text().strip() == "userspace"
        assert (policy / "scaling_max_freq").read_text().strip() == "2400000"
        assert (policy / "scaling_setspeed").read_text().strip() == "2400000"
        state = stub.GetPowerState(na.GetPowerStateRequest(cores=[0]), timeout=10)
        assert state.cores[0].governor == "userspace"
        assert state.policies[0].xman_mode == na.XMAN_MODE_PINNED_MAX
        with pytest.raises(grpc.RpcError) as err:  # X-MAN needs the probe's pinned counters
            stub.SetPowerPolicy(na.SetPowerPolicyRequest(action_id="p2", policy=na.PowerPolicy(
                cores=[0], governor="userspace", xman_mode=na.XMAN_MODE_LOAD)), timeout=10)
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "fn_stats" in err.value.details()
    finally:
        lab.down()


def fake_cpuidle(root: Path, cpus: tuple[int, ...] = (0, 1)) -> Path:
    """cpuN/cpuidle/stateK laid out like this VM's kernel: POLL, then C1 and C6."""
    for cpu in cpus:
        for k, (name, latency) in enumerate((("POLL", 0), ("C1", 2), ("C6", 133))):
            d = root / f"cpu{cpu}" / "cpuidle" / f"state{k}"
            d.mkdir(parents=True)
            for f, v in (("name", name), ("latency", latency), ("disable", 0)):
                (d / f).write_text(f"{v}\n")
    return root


def disabled_states(root: Path, cpu: int) -> list[int]:
    d = root / f"cpu{cpu}" / "cpuidle"
    return [int((d / f"state{k}" / "disable").read_text()) for k in range(3)]


def test_forbid_cstates_writes_cpuidle_is_bounded_survives_a_restart_and_rolls_back(tmp_path):
    _skip_without_root()
    lab = Lab(tmp_path)
    lab.cpufreq_root = fake_cpufreq(tmp_path / "cpu")
    idle = fake_cpuidle(tmp_path / "cpu")
    lab.power_extra = f'cpuidle_root = "{idle}"\nmax_cstate_forbidden_cores = 1\n'

    def policy(cores: list[int], forbid: bool) -> na.PowerPolicy:
        # What the policy engine's power planner sends for latency-critical cores.
        return na.PowerPolicy(cores=cores, governor="performance", min_frequency_khz=3_000_000,
                              max_frequency_khz=3_000_000, xman_mode=na.XMAN_MODE_PINNED_MAX,
                              forbid_cstates=forbid)

    try:
        stub = lab.up().stub()
        dry = stub.SetPowerPolicy(na.SetPowerPolicyRequest(
            action_id="c0", dry_run=True, policy=policy([0], True)), timeout=10)
        assert dry.applied.forbid_cstates and disabled_states(idle, 0) == [0, 0, 0]
        resp = stub.SetPowerPolicy(na.SetPowerPolicyRequest(
            action_id="c1", policy=policy([0], True)), timeout=10)
        assert resp.applied.forbid_cstates
        assert [p.forbid_cstates for p in resp.previous] == [False]
        assert disabled_states(idle, 0) == [0, 1, 1]  # POLL stays: the idle loop spins in C0
        assert disabled_states(idle, 1) == [0, 0, 0]
        state = stub.GetPowerState(na.GetPowerStateRequest(cores=[0]), timeout=10)
        assert state.idle[0].cstates_forbidden
        assert list(state.idle[0].enabled_idle_states) == ["POLL"]
        assert [p.forbid_cstates for p in state.policies] == [True]
        # The hard bound: a second core out of C-states is refused before anything is written.
        with pytest.raises(grpc.RpcError) as err:
            stub.SetPowerPolicy(na.SetPowerPolicyRequest(
                action_id="c2", policy=policy([1], True)), timeout=10)
        assert err.value.code() == grpc.StatusCode.OUT_OF_RANGE
        assert "max_cstate_forbidden_cores = 1" in err.value.details()
        assert disabled_states(idle, 1) == [0, 0, 0]
        # A reboot clears cpuidle; the restarted agent restores the forbid from its journal.
        assert lab.terminate() == 0
        for k in (1, 2):
            (idle / "cpu0" / "cpuidle" / f"state{k}" / "disable").write_text("0\n")
        lab.start()
        stub = lab.stub()
        assert disabled_states(idle, 0) == [0, 1, 1]
        state = stub.GetPowerState(na.GetPowerStateRequest(cores=[0]), timeout=10)
        assert state.idle[0].cstates_forbidden
        # Rollback = the policy engine re-sends `previous`: C-states are allowed again.
        back = stub.SetPowerPolicy(na.SetPowerPolicyRequest(
            action_id="c1-rollback", policy=resp.previous[0]), timeout=10)
        assert not back.applied.forbid_cstates
        assert disabled_states(idle, 0) == [0, 0, 0]
        state = stub.GetPowerState(na.GetPowerStateRequest(cores=[0]), timeout=10)
        assert not state.idle[0].cstates_forbidden
        assert list(state.idle[0].enabled_idle_states) == ["POLL", "C1", "C6"]
    finally:
        lab.down()


def test_power_rpcs_name_the_missing_cpufreq(lab):
    with pytest.raises(grpc.RpcError) as err:
        lab.stub().GetPowerState(na.GetPowerStateRequest(), timeout=10)
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "cpufreq" in err.value.details()


def test_the_memory_agent_protects_flows_as_the_real_agent_does(lab):
    """ProtectFlows (the node micro loop's latency guard): the policy engine's double
    (cgloop.policy.fake_guard) refuses what the real agent refuses, with the same status code
    and a message naming the same field, and both read back the same protections."""
    from cgloop.policy.testing import AgentBounds, AgentServer, MemoryNodeAgent

    real = lab.stub()
    apply(real, lab)
    probe = na.ProtectFlowsRequest(action_id="probe", dry_run=True)  # no flows: refused
    try:
        real.ProtectFlows(probe, timeout=10)
    except grpc.RpcError as err:
        if err.code() == grpc.StatusCode.UNIMPLEMENTED:
            pytest.skip("this agent build has no latency guard yet (ProtectFlows unimplemented)")
    fake_agent = MemoryNodeAgent(
        "fake", bounds=AgentBounds(interfaces=[lab.if_a]), hierarchies=[hierarchy(lab.if_a)]
    )

    def pf(**kw) -> na.ProtectedFlow:
        fields = dict(
            interface_name=lab.if_a, flow=lab.flow(5004, 40000), latency_slo_ns=20_000_000,
            class_id=GAMING, rewrite_dscp=46, ttl_ns=30_000_000_000,
        )
        fields.update(kw)
        return na.ProtectedFlow(**fields)

    invalid, denied = grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.PERMISSION_DENIED
    requests = {  # name: (protection, expected status, the field the refusal names)
        "slo too short": (pf(latency_slo_ns=99_999), invalid, "flows[0].latency_slo_ns"),
        "slo too long": (pf(latency_slo_ns=10_000_000_001), invalid, "flows[0].latency_slo_ns"),
        "ttl too short": (pf(ttl_ns=999_999_999), invalid, "flows[0].ttl_ns"),
        "ttl too long": (pf(ttl_ns=3_600_000_000_001), invalid, "flows[0].ttl_ns"),
        "dscp 64": (pf(rewrite_dscp=64), invalid, "flows[0].rewrite_dscp"),
        "class 0": (pf(class_id=0), invalid, "flows[0].class_id"),
        "no such class": (pf(class_id=0x10099), grpc.StatusCode.FAILED_PRECONDITION, "1:99"),
        "not a leaf": (pf(class_id=ROOT), grpc.StatusCode.FAILED_PRECONDITION, "1:1"),
        "interface lo": (pf(interface_name="lo"), denied, "flows[0].interface_name"),
        "no flow": (na.ProtectedFlow(interface_name=lab.if_a, ttl_ns=30_000_000_000), invalid,
                    "flows[0].flow"),
        "protect": (pf(), grpc.StatusCode.OK, ""),
        "renew": (pf(), grpc.StatusCode.OK, ""),
        "another": (pf(flow=lab.flow(5004, 40001), class_id=LL), grpc.StatusCode.OK, ""),
        "remove another": (na.ProtectedFlow(interface_name=lab.if_a, flow=lab.flow(5004, 40001)),
                           grpc.StatusCode.OK, ""),
    }
    with AgentServer(fake_agent) as server:
        fake = node_agent_pb2_grpc.NodeAgentServiceStub(grpc.insecure_channel(server.address))
        for name, (flow_, expected, field_) in requests.items():
            answers = []
            for who, stub in (("real", real), ("fake", fake)):
                req = na.ProtectFlowsRequest(action_id=f"{who}-{name}", flows=[flow_])
                try:
                    reply = stub.ProtectFlows(req, timeout=10)
                    code, msg = grpc.StatusCode.OK, reply.outcome.message
                except grpc.RpcError as err:
                    code, msg = err.code(), err.details()
                assert code == expected, f"{name}: the {who} agent answered {code} {msg}"
                assert field_ in msg, f"{name}: the {who} agent's {msg!r} names no {field_}"
                answers.append(msg)
            # Refusals in the same words; outcomes too ("latency guard: 1 flow(s) protected").
            assert answers[0] == answers[1], f"{name}: real {answers[0]!r}, fake {answers[1]!r}"
        got = [s.GetState(na.GetStateRequest(), timeout=10).state for s in (real, fake)]
    # The same protection in both (times and the guard's counters are each agent's own).
    for state in got:
        for p in state.protected_flows:
            p.expires_ns = p.promotions = 0
            p.promoted = False
    assert list(got[1].protected_flows) == list(got[0].protected_flows)
    assert [p.flow.dst_port for p in got[0].protected_flows] == [40000]
