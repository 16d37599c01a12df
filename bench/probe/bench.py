"""Benchmark of the XDP flow probe (issue: XDP probe). One command, as root:

    uv run python bench/probe/bench.py            # ≈1 min; --packets to change the replay size

It builds nothing: it uses the release `cgloop-probe` if present (else debug; build with
`cargo build --release -p cgloop-probe`). Three measurements, printed with their targets:

1. In-kernel cost per packet of the XDP program, from the kernel's BPF run-time statistics
   (`kernel.bpf_stats_enabled`, run_time_ns / run_cnt), at 1, 10 k and 100 k active flows, with
   RTP parsing on (the traffic carries RTP headers) and off (`--no-rtp`). Each measurement is the
   second replay of the same capture, so the flows already exist (steady state, no inserts).
2. Side by side on the same replayed traffic: CPU time per packet of cgloop's probe (BPF run time
   + the exporter process's user+system time) vs softflowd (Debian package, libpcap flow
   exporter; its process user+system time), both attached to the same interface during one
   replay. Ratio = softflowd / cgloop. Not counted for either: the kernel's shared receive path
   (for softflowd this leaves out the copy of every packet to its AF_PACKET ring in softirq,
   so the ratio is conservative for cgloop).
3. Export rate: flow records per second of exporter CPU time (sweep with batched map reads,
   deltas, protobuf encoding, write), with 100 k flows refreshed by a looping replay.

Traffic is replayed with tcpreplay (topspeed) from a namespace into a veth pair
(`cgl-probe-bench-<pid>-a|b`); the probe and softflowd run on the `b` end.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from cgloop.binaries import find_binary

PID = os.getpid()
NS_A, NS_B = f"cgl-probe-bench-{PID}-a", f"cgl-probe-bench-{PID}-b"
IF_A, IF_B = f"cba{PID}"[:15], f"cbb{PID}"[:15]
CLK_TCK = os.sysconf("SC_CLK_TCK")


def sh(*args: str, check: bool = True, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(args, check=check, capture_output=True, text=True, timeout=timeout)


def netns_up() -> str:
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
    for ns, ifname, addr in ((NS_A, IF_A, "10.215.0.1/16"), (NS_B, IF_B, "10.215.0.2/16")):
        sh("ip", "-n", ns, "addr", "add", addr, "dev", ifname)
        sh("ip", "-n", ns, "link", "set", ifname, "up")
        sh("ip", "-n", ns, "link", "set", "lo", "up")
    return json.loads(sh("ip", "-j", "-n", NS_B, "link", "show", IF_B).stdout)[0]["address"]


def netns_down() -> None:
    for ns in (NS_A, NS_B):
        sh("ip", "netns", "del", ns, check=False)


def write_pcap(path: Path, flows: int, packets: int, mac_b: str) -> None:
    """UDP packets round-robin over `flows` five-tuples, each with an RTP header (per-flow
    sequence) and 100 bytes of payload: 154-byte frames."""
    dst_mac = bytes.fromhex(mac_b.replace(":", ""))
    eth = dst_mac + bytes.fromhex("020000000001") + b"\x08\x00"
    payload = bytes(100)
    frames = []
    for f in range(flows):
        src = socket.inet_aton(f"10.215.{100 + f // 60000}.{1 + (f % 60000) // 250}")
        sport = 1024 + f % 250
        ip = struct.pack("!BBHHHBBH4s4s", 0x45, 1, 20 + 8 + 12 + 100, 0, 0, 64, 17, 0, src,
                         socket.inet_aton("10.215.0.2"))  # fmt: skip
        udp = struct.pack("!HHHH", sport, 5004, 8 + 12 + 100, 0)
        frames.append((eth + ip + udp, f))
    with path.open("wb") as out:
        out.write(struct.pack("<IHHiIII", 0xA1B2C3D4, 2, 4, 0, 0, 65535, 1))
        seq = [0] * flows
        for i in range(packets):
            head, f = frames[i % flows]
            rtp = struct.pack("!BBHII", 0x80, 96, seq[f] & 0xFFFF, seq[f] * 1500, 0x1000 + f)
            seq[f] += 1
            frame = head + rtp + payload
            out.write(struct.pack("<IIII", i // 1_000_000, i % 1_000_000, len(frame), len(frame)))
            out.write(frame)


def replay(pcap: Path, loop: int = 1) -> None:
    sh("ip", "netns", "exec", NS_A, "tcpreplay", "-q", "--topspeed", f"--loop={loop}",
       "-i", IF_A, str(pcap))  # fmt: skip


def xdp_prog_id() -> int:
    link = json.loads(sh("ip", "-j", "-n", NS_B, "link", "show", IF_B).stdout)[0]
    return int(link["xdp"]["prog"]["id"])


def prog_stats(prog_id: int) -> tuple[int, int]:
    info = json.loads(sh("bpftool", "-j", "prog", "show", "id", str(prog_id)).stdout)
    return int(info.get("run_time_ns", 0)), int(info.get("run_cnt", 0))


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK  # utime + stime


class Probe:
    def __init__(self, binary: Path, *extra: str, metrics_port: int | None = None) -> None:
        cmd = ["ip", "netns", "exec", NS_B, str(binary), "run", "--iface", IF_B, "--no-egress",
               "--output", "/dev/null", "--max-flows", "262144",
               "--pin-dir", f"/sys/fs/bpf/cgl-probe-bench-{PID}", *extra]  # fmt: skip
        if metrics_port:
            cmd += ["--metrics-addr", f"127.0.0.1:{metrics_port}"]
        self.proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
        assert self.proc.stderr is not None
        deadline = time.monotonic() + 30
        while "observing" not in (line := self.proc.stderr.readline()):
            if not line or time.monotonic() > deadline:
                raise RuntimeError(f"probe did not start: {line}{self.proc.stderr.read()}")
        self.prog = xdp_prog_id()

    def stop(self) -> dict:
        self.proc.send_signal(signal.SIGTERM)
        _, err = self.proc.communicate(timeout=60)
        return json.loads(err.strip().splitlines()[-1])


def one_cost(binary: Path, pcap: Path, rtp: bool, *extra: str) -> float:
    probe = Probe(binary, *([] if rtp else ["--no-rtp"]), *extra)
    try:
        replay(pcap)  # warm-up: creates the flows
        t0, c0 = prog_stats(probe.prog)
        replay(pcap)
        t1, c1 = prog_stats(probe.prog)
    finally:
        probe.stop()
    return (t1 - t0) / max(c1 - c0, 1)


def kernel_cost(
    binary: Path, pcaps: dict[int, Path], baseline: Path | None
) -> tuple[dict[tuple[int, bool], float], dict[tuple[int, bool], float]]:
    """cgloop's cost per case; with a baseline build, the baseline's right after it (same load)."""
    out, base = {}, {}
    for flows, pcap in pcaps.items():
        for rtp in (True, False):
            out[(flows, rtp)] = per = one_cost(binary, pcap, rtp)
            mode = "on " if rtp else "off"
            line = f"  {flows:>7} flows, RTP parsing {mode}: {per:7.1f} ns/packet"
            if baseline is not None:
                base[(flows, rtp)] = old = one_cost(baseline, pcap, rtp)
                line += f"   baseline {old:7.1f} ns/packet, baseline / cgloop {old / per:.2f}x"
            print(line, flush=True)
    return out, base


def floor_cost(pcap: Path, tmp: Path) -> dict[str, float]:
    """bpf_stats of an empty XDP program and of one that only reads the clock, same replay."""
    vmlinux = tmp / "vmlinux.h"
    vmlinux.write_text(sh("bpftool", "btf", "dump", "file", "/sys/kernel/btf/vmlinux", "format",
                          "c").stdout)  # fmt: skip
    obj = tmp / "floor.o"
    sh("clang", "-O2", "-g", "-target", "bpf", f"-I{tmp}", "-c",
       str(Path(__file__).with_name("floor.bpf.c")), "-o", str(obj))  # fmt: skip
    out = {}
    for prog in ("floor_empty", "floor_clock"):
        sh("ip", "-n", NS_B, "link", "set", IF_B, "xdpdrv", "obj", str(obj), "program", prog)
        try:
            replay(pcap)
            t0, c0 = prog_stats(xdp_prog_id())
            replay(pcap)
            t1, c1 = prog_stats(xdp_prog_id())
        finally:
            sh("ip", "-n", NS_B, "link", "set", IF_B, "xdpdrv", "off")
        out[prog] = (t1 - t0) / max(c1 - c0, 1)
    return out


def versus_softflowd(
    binary: Path, pcap: Path, packets: int, tmp: Path, interval_ms: int
) -> tuple[float, float]:
    probe = Probe(binary, "--interval-ms", str(interval_ms))
    soft = subprocess.Popen(
        ["ip", "netns", "exec", NS_B, "softflowd", "-d", "-i", IF_B, "-n", "127.0.0.1:9995",
         "-m", "262144", "-B", str(64 << 20), "-p", str(tmp / "sf.pid"), "-c", str(tmp / "sf.ctl"),
         "-v", "9"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        time.sleep(1.5)  # softflowd opens its capture
        if soft.poll() is not None:
            raise RuntimeError(f"softflowd exited: {soft.stderr.read() if soft.stderr else ''}")
        replay(pcap)  # warm-up for both
        time.sleep(0.5)
        p_cpu0, s_cpu0 = cpu_seconds(probe.proc.pid), cpu_seconds(soft.pid)
        t0, c0 = prog_stats(probe.prog)
        replay(pcap)
        time.sleep(1.0)  # let softflowd drain its capture buffer
        t1, c1 = prog_stats(probe.prog)
        p_cpu1, s_cpu1 = cpu_seconds(probe.proc.pid), cpu_seconds(soft.pid)
    finally:
        soft.send_signal(signal.SIGTERM)
        soft.wait(20)
        probe.stop()
    n = c1 - c0
    cgloop_ns = ((t1 - t0) + (p_cpu1 - p_cpu0) * 1e9) / n
    softflowd_ns = (s_cpu1 - s_cpu0) * 1e9 / n
    return cgloop_ns, softflowd_ns


def export_rate(binary: Path, pcap: Path, seconds: float) -> tuple[float, int]:
    port = free_port()
    probe = Probe(binary, metrics_port=port)
    try:
        replay(pcap)
        cpu0 = cpu_seconds(probe.proc.pid)
        rec0 = metric(port, "cgloop_probe_records_total")
        player = subprocess.Popen(["ip", "netns", "exec", NS_A, "tcpreplay", "-q", "--topspeed",
                                   "--loop=0", "-i", IF_A, str(pcap)],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
        time.sleep(seconds)
        player.send_signal(signal.SIGINT)
        player.wait(20)
        rec1 = metric(port, "cgloop_probe_records_total")
        cpu1 = cpu_seconds(probe.proc.pid)
    finally:
        probe.stop()
    records = int(rec1 - rec0)
    return records / max(cpu1 - cpu0, 1 / CLK_TCK), records


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def metric(port: int, name: str) -> float:
    # The endpoint is inside the probe's namespace: ask from there.
    url = f"http://127.0.0.1:{port}/metrics"
    code = f"import urllib.request; print(urllib.request.urlopen({url!r}).read().decode())"
    text = sh("ip", "netns", "exec", NS_B, sys.executable, "-c", code).stdout
    m = re.search(rf"^{name} (\S+)$", text, re.M)
    return float(m.group(1)) if m else 0.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--packets", type=int, default=300_000, help="packets per replay")
    parser.add_argument("--export-seconds", type=float, default=4.0)
    parser.add_argument(
        "--baseline",
        type=Path,
        default=None,
        help="a previous cgloop-probe build, measured side by side (1. and 3.)",
    )
    args = parser.parse_args()
    if os.geteuid() != 0:
        sys.exit("bench/probe needs root (network namespaces, BPF)")
    for tool in ("tcpreplay", "softflowd", "bpftool"):
        if shutil.which(tool) is None:
            sys.exit(f"{tool} missing: run `make setup` (scripts/bootstrap.d/probe.apt lists it)")
    binary = find_binary("cgloop-probe")
    print(f"cgloop-probe: {binary}")
    if args.baseline is not None:
        print(f"baseline:     {args.baseline}")
    old_stats = Path("/proc/sys/kernel/bpf_stats_enabled").read_text().strip()
    Path("/proc/sys/kernel/bpf_stats_enabled").write_text("1")
    netns_down()
    try:
        mac_b = netns_up()
        with tempfile.TemporaryDirectory(prefix="cgl-probe-bench-") as d:
            tmp = Path(d)
            pcaps = {}
            for flows in (1, 10_000, 100_000):
                pcaps[flows] = tmp / f"udp-rtp-{flows}.pcap"
                write_pcap(pcaps[flows], flows, args.packets, mac_b)
            print("\n1. XDP program cost in the kernel (bpf_stats: run_time_ns / run_cnt)")
            cost, _ = kernel_cost(binary, pcaps, args.baseline)
            lru = cost[(100_000, True)]
            hashed = one_cost(binary, pcaps[100_000], True, "--flow-table", "hash")
            print(f"  100000 flows, RTP on, --flow-table hash: {hashed:7.1f} ns/packet"
                  f" (LRU just before: {lru:.1f}, LRU / hash {lru / hashed:.2f}x)")  # fmt: skip
            floor = floor_cost(pcaps[1], tmp)
            print(f"  baseline: empty XDP program {floor['floor_empty']:.1f} ns/packet, "
                  f"clock read only {floor['floor_clock']:.1f} ns/packet")  # fmt: skip
            print("\n2. CPU per packet, same replay (10 k flows), cgloop probe vs softflowd")
            side = {}
            for interval in (100, 1000):
                cg, sf = versus_softflowd(binary, pcaps[10_000], args.packets, tmp, interval)
                side[interval] = (cg, sf)
                print(f"  probe sweeping every {interval:>4} ms: cgloop (BPF + exporter) "
                      f"{cg:8.1f} ns/packet, softflowd (process CPU) {sf:8.1f} ns/packet, "
                      f"ratio {sf / cg:.2f}x")  # fmt: skip
            print("\n3. Export rate (100 k flows refreshed by a looping replay)")
            rate, records = export_rate(binary, pcaps[100_000], args.export_seconds)
            print(f"  {records} records, {rate:,.0f} records per exporter CPU second")
            if args.baseline is not None:
                old, old_records = export_rate(args.baseline, pcaps[100_000], args.export_seconds)
                print(f"  baseline: {old_records} records, {old:,.0f} records per exporter CPU "
                      f"second; cgloop / baseline {rate / old:.2f}x")  # fmt: skip
    finally:
        netns_down()
        Path("/proc/sys/kernel/bpf_stats_enabled").write_text(old_stats)
        shutil.rmtree(f"/sys/fs/bpf/cgl-probe-bench-{PID}", ignore_errors=True)

    worst = cost[(100_000, True)]
    print("\nSummary (target in brackets)")
    print(f"  in-kernel ns/packet at 100 k flows, RTP on : {worst:.1f} (≤ 100) "
          f"-> {'met' if worst <= 100 else 'NOT met'}")  # fmt: skip
    print(f"  RTP parsing overhead at 100 k flows       : "
          f"{cost[(100_000, True)] - cost[(100_000, False)]:+.1f} ns/packet")  # fmt: skip
    empty, clock = floor["floor_empty"], floor["floor_clock"]
    print(f"  ... above the empty-program floor         : {worst - empty:.1f}"
          f" (floor {empty:.1f}, clock read {clock:.1f})")  # fmt: skip
    for interval, (cg, sf) in side.items():
        verdict = "met" if sf / cg >= 10 else "NOT met"
        print(f"  softflowd / cgloop CPU per packet ({interval:>4} ms sweeps): "
              f"{sf / cg:.2f}x (≥ 10x) -> {verdict}")  # fmt: skip
    print(f"  export records/s per core                 : {rate:,.0f} (≥ 200,000) "
          f"-> {'met' if rate >= 200_000 else 'NOT met'}")  # fmt: skip


if __name__ == "__main__":
    main()
