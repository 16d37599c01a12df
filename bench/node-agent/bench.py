"""Node-agent benchmark: time from an RPC to its change taking effect on packets, and RPCs/s.

Lab: the namespaces of tests/test_node_agent_netns.py (release agent, mTLS over a Unix socket).
A sender process paces UDP packets (one every ~50 us) through the agent's HTB/cls_bpf
interface; the receiver reads kernel receive timestamps (SO_TIMESTAMPNS, CLOCK_REALTIME) and
the DSCP of each packet. Each RPC flips the DSCP the change imposes, so "effective" is the
kernel receive time of the first packet carrying the new DSCP, minus the time the RPC was sent.

Baseline, measured side by side: the same change made with the tc command line
(`tc class change`, `tc filter replace` with u32), as an operator or a shell-out agent would.

Clients, side by side: the Python gRPC client (as the policy engine) and a Rust tonic client
(`actuators/node-agent/examples/bench_client.rs`), so the agent's own share is visible. At the
end the agent is restarted with `journal_sync_ack = true` (the journal written before the
answer, as before group commit) and the Rust client's round trip is measured again.

Fair to a 2-core machine: the traffic source is a small Rust sender
(`actuators/node-agent/examples/udp_sender.rs`, clock_nanosleep pacing, no spinning) pinned
with taskset to the last CPU, and the agent is pinned to CPU 0.

Advanced functions (AF_XDP): one-way latency (sender's CLOCK_REALTIME stamp in the payload to
the receiver's kernel timestamp) of the same flow through three chains, interleaved in rounds
in the same run: [mark] (BPF only), [mark, dpi] and [mark, dpi, dpi] (user space). The added
latency per advanced function is compared with the CALVIN budget (20 us each).
"""

from __future__ import annotations

import math
import os
import socket
import statistics
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path
from tempfile import TemporaryDirectory

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from cgloop.v1 import node_agent_pb2 as na  # noqa: E402

from tests.test_node_agent_netns import (  # noqa: E402
    BULK,
    GAMING,
    LL,
    Lab,
    hierarchy,
    in_netns,
)

ITERATIONS = int(os.environ.get("CGLOOP_BENCH_ITERATIONS", "200"))
SO_TIMESTAMPNS = 35


def pct(values: list[float], p: float) -> float:
    v = sorted(values)
    return v[max(0, min(len(v) - 1, math.ceil(p * len(v)) - 1))]


def line(name: str, values_ns: list[float]) -> str:
    us = [v / 1e3 for v in values_ns]
    return f"{name:<44} p50 {pct(us, .5):9.1f} us   p99 {pct(us, .99):9.1f} us   n={len(us)}"


class TimedReceiver:
    """Records (kernel receive time ns, DSCP) of every datagram, in namespace B."""

    def __init__(self, lab: Lab, port: int) -> None:
        self.got: list[tuple[int, int]] = []
        self.stop_flag = threading.Event()
        ready = threading.Event()

        def run() -> None:
            s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            s.setsockopt(socket.IPPROTO_IP, socket.IP_RECVTOS, 1)
            s.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
            s.bind((lab.addr_b, port))
            s.settimeout(0.1)
            ready.set()
            while not self.stop_flag.is_set():
                try:
                    _, anc, _, _ = s.recvmsg(64, 256)
                except TimeoutError:
                    continue
                ts, tos = 0, 0
                for lvl, typ, d in anc:
                    if lvl == socket.SOL_SOCKET and typ == SO_TIMESTAMPNS:
                        sec, nsec = struct.unpack("qq", d[:16])
                        ts = sec * 1_000_000_000 + nsec
                    elif lvl == socket.IPPROTO_IP and typ == socket.IP_TOS:
                        tos = d[0]
                self.got.append((ts, tos >> 2))
            s.close()

        self.thread = threading.Thread(target=in_netns, args=(lab.ns_b, run), daemon=True)
        self.thread.start()
        ready.wait(5)

    def first_with(self, dscp: int, after_ns: int, timeout_s: float = 1.0) -> int | None:
        deadline = time.monotonic() + timeout_s
        start = 0
        while time.monotonic() < deadline:
            got = self.got
            for i in range(start, len(got)):
                ts, d = got[i]
                if ts >= after_ns and d == dscp:
                    return ts
            start = max(0, len(got) - 1)
            time.sleep(0.0002)
        return None


SENDER_CPU = str((os.cpu_count() or 2) - 1)
AGENT_CPU = "0"
ADV_BUDGET_US = 20.0


def pacer(lab: Lab, sport: int, dport: int, interval_us: int = 50, count: int = 0,
          payload: str = "") -> subprocess.Popen[bytes]:
    """The Rust sender (its own process, pinned to SENDER_CPU): one packet every interval_us."""
    return subprocess.Popen(
        ["ip", "netns", "exec", lab.ns_a, "taskset", "-c", SENDER_CPU,
         os.environ["CGLOOP_BENCH_SENDER"], f"{lab.addr_a}:{sport}", f"{lab.addr_b}:{dport}",
         str(interval_us), str(count), payload])


def pin_agent(lab: Lab) -> None:
    """All threads of the agent on AGENT_CPU (`ip netns exec` execs it: same pid)."""
    assert lab.proc is not None
    subprocess.run(["taskset", "-a", "-p", "-c", AGENT_CPU, str(lab.proc.pid)], check=True,
                   capture_output=True)


class OneWayReceiver:
    """Kernel receive time minus the sender's stamp (ns) of every datagram, in namespace B."""

    def __init__(self, lab: Lab, port: int) -> None:
        self.got: list[int] = []
        self.stop_flag = threading.Event()
        ready = threading.Event()

        def run() -> None:
            s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            s.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
            s.bind((lab.addr_b, port))
            s.settimeout(0.1)
            ready.set()
            while not self.stop_flag.is_set():
                try:
                    data, anc, _, _ = s.recvmsg(256, 256)
                except TimeoutError:
                    continue
                for lvl, typ, d in anc:
                    if lvl == socket.SOL_SOCKET and typ == SO_TIMESTAMPNS and len(data) >= 8:
                        sec, nsec = struct.unpack("qq", d[:16])
                        self.got.append(sec * 1_000_000_000 + nsec
                                        - struct.unpack("!Q", data[:8])[0])
            s.close()

        self.thread = threading.Thread(target=in_netns, args=(lab.ns_b, run), daemon=True)
        self.thread.start()
        ready.wait(5)


def advanced_latency(lab: Lab, stub) -> dict[int, list[float]]:
    """One-way latency through chains with 0, 1 and 2 dpi functions, interleaved rounds."""
    flow = lab.flow(47000, 9700)
    stub.SetFlowClass(na.SetFlowClassRequest(action_id="adv-f", rule=na.FlowClassRule(
        interface_name=lab.if_a, flow=flow, class_id=GAMING)), timeout=5)
    mark = na.ChainFunction(mark=na.Mark(dscp=10), kind=na.FUNCTION_KIND_BASIC)
    dpi = na.ChainFunction(dpi=na.Dpi(text="GAMEINPUT", mark_dscp=46),
                           kind=na.FUNCTION_KIND_ADVANCED)
    rx = OneWayReceiver(lab, 9700)
    out: dict[int, list[float]] = {0: [], 1: [], 2: []}
    per_round = max(50, ITERATIONS)
    try:
        for r in range(4):
            for n in (0, 1, 2):
                stub.SetChain(na.SetChainRequest(action_id=f"adv-{r}-{n}", chain=na.ServiceChain(
                    chain_id="adv", traffic_class="gaming", functions=[mark] + [dpi] * n)),
                    timeout=5)
                time.sleep(0.05)
                rx.got = []
                p = pacer(lab, 47000, 9700, interval_us=500, count=per_round,
                          payload="..GAMEINPUT..")
                p.wait(60)
                time.sleep(0.1)
                out[n].extend(rx.got[5:])  # the first few carry the chain change's warm-up
    finally:
        rx.stop_flag.set()
    return out


class RustClient:
    """The Rust bench client (tonic over the same Unix socket and mTLS certificates)."""

    def __init__(self, lab: Lab, binary: Path) -> None:
        self.proc = subprocess.Popen(
            [str(binary), str(lab.sock), str(lab.certs), lab.if_a, lab.addr_a, lab.addr_b],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1,
        )
        assert self.proc.stdout is not None and self.proc.stdin is not None
        ready = self.proc.stdout.readline()
        if ready.strip() != "ready":
            raise RuntimeError(f"bench_client did not start: {ready!r}")

    def ask(self, command: str) -> list[int]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(command + "\n")
        answer = self.proc.stdout.readline()
        if not answer:
            raise RuntimeError(f"bench_client died on {command!r}")
        return [int(x) for x in answer.split()]

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait(5)


def effect_latency(lab: Lab, rx: TimedReceiver, rpc, dscps: tuple[int, int]) -> list[float]:
    out = []
    for i in range(ITERATIONS):
        dscp = dscps[i % 2]
        t0 = time.time_ns()
        rpc(i, dscp)
        ts = rx.first_with(dscp, t0)
        if ts is not None:
            out.append(ts - t0)
    return out


def main() -> None:
    if os.geteuid() != 0:
        sys.exit("bench/node-agent needs root (network namespaces, BPF)")
    os.environ.setdefault("CGLOOP_BIN_DIR", str(ROOT / "target" / "release"))
    with TemporaryDirectory() as tmp:
        lab = Lab(Path(tmp))
        lab.binary = Path(os.environ["CGLOOP_BIN_DIR"]) / "cgloop-node-agent"
        try:
            lab.up()
            run(lab)
        finally:
            lab.down()


def run(lab: Lab) -> None:
    stub = lab.stub()
    stub.ApplyQueueHierarchy(
        na.ApplyQueueHierarchyRequest(action_id="h", hierarchy=hierarchy(lab.if_a)), timeout=10
    )
    pin_agent(lab)
    rust = RustClient(lab, Path(os.environ["CGLOOP_BENCH_CLIENT"]))
    rx = TimedReceiver(lab, 9500)
    sender = pacer(lab, 45000, 9500)
    time.sleep(0.5)
    try:
        flow = lab.flow(45000, 9500)
        agent_side: list[float] = []

        def reclassify(i: int, dscp: int) -> None:
            rule = na.FlowClassRule(
                interface_name=lab.if_a, flow=flow, class_id=LL if dscp == 46 else GAMING,
                rewrite_dscp=dscp,
            )
            resp = stub.SetFlowClass(
                na.SetFlowClassRequest(action_id=f"f{i}", rule=rule), timeout=5)
            agent_side.append(resp.outcome.apply_latency_ns)

        flows = effect_latency(lab, rx, reclassify, (46, 34))

        # The same reclassification from the Rust client: its own send timestamp.
        rust_flows, rust_rtt, rust_inside = [], [], []
        for i in range(ITERATIONS):
            dscp = (46, 34)[i % 2]
            t0, rtt, inside = rust.ask(
                f"F rf{i} {LL if dscp == 46 else GAMING} 45000 9500 {dscp}")
            rust_rtt.append(rtt)
            rust_inside.append(inside)
            ts = rx.first_with(dscp, t0)
            if ts is not None:
                rust_flows.append(ts - t0)

        def swap_chain(i: int, dscp: int) -> None:
            chain = na.ServiceChain(chain_id="bench", traffic_class="gaming", functions=[
                na.ChainFunction(mark=na.Mark(dscp=dscp), kind=na.FUNCTION_KIND_BASIC),
            ])
            stub.SetChain(na.SetChainRequest(action_id=f"c{i}", chain=chain), timeout=5)

        # Put the flow in "gaming" without a DSCP rewrite so the chain's marker decides.
        stub.SetFlowClass(na.SetFlowClassRequest(action_id="fg", rule=na.FlowClassRule(
            interface_name=lab.if_a, flow=flow, class_id=GAMING)), timeout=5)
        chains = effect_latency(lab, rx, swap_chain, (10, 12))
    finally:
        sender.kill()
        rx.stop_flag.set()

    adv = advanced_latency(lab, stub)

    # Class change: the RPC returns after the kernel's netlink ACK, so its round trip is the
    # time until HTB uses the new rate for the next dequeue.
    rates = []
    for i in range(ITERATIONS):
        t0 = time.perf_counter_ns()
        stub.SetClassRate(na.SetClassRateRequest(
            action_id=f"r{i}", interface_name=lab.if_a, class_id=BULK,
            rate_bps=5_000_000 + 1000 * (i % 2), ceil_bps=8_000_000), timeout=5)
        rates.append(time.perf_counter_ns() - t0)

    # Baseline: the tc command line doing the same changes.
    tc_class, tc_filter = [], []
    subprocess.run(["tc", "-n", lab.ns_a, "filter", "add", "dev", lab.if_a, "parent", "1:",
                    "protocol", "ip", "prio", "5", "handle", "800::1", "u32", "match", "ip",
                    "sport", "45000", "0xffff", "flowid", "1:10"], check=True)
    for i in range(min(ITERATIONS, 100)):
        t0 = time.perf_counter_ns()
        subprocess.run(["tc", "-n", lab.ns_a, "class", "change", "dev", lab.if_a, "classid",
                        "1:40", "htb", "rate", f"{5000 + i % 2}kbit", "ceil", "8mbit"], check=True)
        tc_class.append(time.perf_counter_ns() - t0)
        t0 = time.perf_counter_ns()
        subprocess.run(["tc", "-n", lab.ns_a, "filter", "replace", "dev", lab.if_a, "parent",
                        "1:", "protocol", "ip", "prio", "5", "handle", "800::1", "u32", "match",
                        "ip", "sport", "45000", "0xffff", "flowid",
                        "1:10" if i % 2 else "1:20"], check=True)
        tc_filter.append(time.perf_counter_ns() - t0)

    # The baseline's u32 filter points at 1:10: remove it so the hierarchy can be re-applied.
    subprocess.run(["tc", "-n", lab.ns_a, "filter", "del", "dev", lab.if_a, "parent", "1:",
                    "prio", "5"], check=True)

    # Throughput: sequential SetFlowClass RPCs from one client for 2 s.
    n, t_end = 0, time.monotonic() + 2.0
    t0 = time.monotonic()
    while time.monotonic() < t_end:
        stub.SetFlowClass(na.SetFlowClassRequest(action_id=f"t{n}", rule=na.FlowClassRule(
            interface_name=lab.if_a, flow=lab.flow(46000 + n % 1000, 9600), class_id=GAMING)),
            timeout=5)
        n += 1
    rps = n / (time.monotonic() - t0)
    t0 = time.monotonic()
    rust_seq = rust.ask(f"T {ITERATIONS} {GAMING} 0")
    rust_rps = len(rust_seq) / (time.monotonic() - t0)
    rust.close()

    # Previous mode, same machine, same run: the journal written before the answer.
    lab.kill()
    toml = lab.tmp / "agent.toml"
    toml.write_text("journal_sync_ack = true\n" + toml.read_text())
    # A fresh journal: restoring thousands of benchmark rules would only add start-up time.
    lab.journal = lab.tmp / "journal-sync.pb"
    lab.start()
    lab.stub().ApplyQueueHierarchy(
        na.ApplyQueueHierarchyRequest(action_id="h-sync", hierarchy=hierarchy(lab.if_a)),
        timeout=10,
    )
    rust = RustClient(lab, Path(os.environ["CGLOOP_BENCH_CLIENT"]))
    sync_seq = rust.ask(f"T {ITERATIONS} {GAMING} {ITERATIONS}")
    rust.close()

    print("node-agent benchmark (release agent, gRPC over mTLS on a Unix socket, netns veth)")
    print(f"agent pinned to CPU {AGENT_CPU}, Rust sender (clock_nanosleep) to CPU {SENDER_CPU}; "
          f"load average {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f}")
    print(line("SetFlowClass RPC -> first packet reclassified", flows))
    print(line("  of which inside the agent (apply)", agent_side))
    print(line("Rust client: RPC -> first packet reclassified", rust_flows))
    print(line("  Rust client: RPC round trip", rust_rtt))
    print(line("  of which inside the agent (apply)", rust_inside))
    print(line("Rust client, sequential RPC round trip", rust_seq))
    print(line("  same, journal written before the answer", sync_seq))
    print(line("SetChain RPC -> first packet through new chain", chains))
    print(line("SetClassRate RPC (kernel ACKed on return)", rates))
    print(line("baseline: tc filter replace (u32) command", tc_filter))
    print(line("baseline: tc class change command", tc_class))
    print(f"{'SetFlowClass RPCs/s (1 client, sequential)':<44} {rps:9.0f}")
    print(f"{'  Rust client':<44} {rust_rps:9.0f}")
    print(f"ratio reclassification p99, Rust client/Python client: "
          f"{pct(rust_flows, .99) / pct(flows, .99):.3f}")
    print(f"ratio RPC round trip p99, group commit/journal before answer: "
          f"{pct(rust_seq, .99) / pct(sync_seq, .99):.3f}")
    print(f"ratio flow reclassification p50, agent/tc-filter: "
          f"{pct(flows, .5) / pct(tc_filter, .5):.3f}")
    print(f"ratio class change p50, agent/tc-class: {pct(rates, .5) / pct(tc_class, .5):.3f}")
    print(f"targets: flow reclassification p99 <= 1 ms: Python client "
          f"{'met' if pct(flows, .99) <= 1e6 else 'NOT met'}, Rust client "
          f"{'met' if pct(rust_flows, .99) <= 1e6 else 'NOT met'}; "
          f"class change p99 <= 10 ms: {'met' if pct(rates, .99) <= 1e7 else 'NOT met'}")
    print(line("one-way latency, chain [mark] (BPF only)", adv[0]))
    print(line("  [mark, dpi] (1 advanced, AF_XDP)", adv[1]))
    print(line("  [mark, dpi, dpi] (2 advanced)", adv[2]))
    for q, name in ((.5, "p50"), (.99, "p99")):
        first = (pct(adv[1], q) - pct(adv[0], q)) / 1e3
        marginal = (pct(adv[2], q) - pct(adv[1], q)) / 1e3
        print(f"added latency {name}: first advanced function (AF_XDP hand-over + dpi) "
              f"{first:.1f} us, each further one {marginal:.1f} us; ratio to the CALVIN budget "
              f"({ADV_BUDGET_US:.0f} us each): {first / ADV_BUDGET_US:.2f} / "
              f"{marginal / ADV_BUDGET_US:.2f}; chain with/without advanced: "
              f"{pct(adv[1], q) / pct(adv[0], q):.2f}")
    lost = ITERATIONS * 3 - len(flows) - len(chains) - len(rust_flows)
    if lost:
        print(f"warning: {lost} changes never showed on packets within 1 s")
    print(f"(mean SetFlowClass effect {statistics.mean(flows) / 1e3:.1f} us)")


if __name__ == "__main__":
    main()
