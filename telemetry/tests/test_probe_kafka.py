"""The probe exporting to the real Kafka broker (conftest `stack_settings`), its Prometheus
endpoint, its behaviour when the broker is unreachable, the per-function map contract read back
through the pins, and its refusals. The probe runs in the root namespace on the root end of a
veth pair whose other end is in a namespace made here (`cgl-probe-<pid>-k`), so it reaches the
broker on loopback. Needs root; skipped otherwise."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from cgloop.binaries import BinaryNotFound, find_binary

pytestmark = pytest.mark.root
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (namespaces, BPF)")

PID = os.getpid()
NS = f"cgl-probe-{PID}-k"
IF_HOST, IF_NS = f"cpk{PID}"[:15], f"cpn{PID}"[:15]
HOST4, NS4 = "10.214.0.1", "10.214.0.2"
PORT = 7777
PACKETS = 30
PIN_DIR = Path(f"/sys/fs/bpf/cgl-probe-{PID}-k")


def sh(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(args, check=check, capture_output=True, text=True, timeout=30)


@pytest.fixture(scope="module")
def binary() -> Path:
    try:
        return find_binary("cgloop-probe")
    except BinaryNotFound as exc:
        pytest.fail(str(exc))


@pytest.fixture
def veth():
    sh("ip", "netns", "del", NS, check=False)
    sh("ip", "netns", "add", NS)
    try:
        sh("ip", "link", "add", IF_HOST, "type", "veth", "peer", "name", IF_NS, "netns", NS)
        sh("ip", "addr", "add", f"{HOST4}/24", "dev", IF_HOST)
        sh("ip", "link", "set", IF_HOST, "up")
        sh("ip", "-n", NS, "addr", "add", f"{NS4}/24", "dev", IF_NS)
        sh("ip", "-n", NS, "link", "set", IF_NS, "up")
        yield
    finally:
        sh("ip", "link", "del", IF_HOST, check=False)
        sh("ip", "netns", "del", NS, check=False)
        shutil.rmtree(PIN_DIR, ignore_errors=True)


def send_udp(count: int = PACKETS) -> None:
    code = (
        "import socket,time\n"
        "s=socket.socket(socket.AF_INET,socket.SOCK_DGRAM)\n"
        f"for _ in range({count}):\n"
        f"    s.sendto(b'k'*100,('{HOST4}',{PORT})); time.sleep(0.002)\n"
    )
    sh("ip", "netns", "exec", NS, sys.executable, "-c", code)


def start_probe(binary: Path, *extra: str) -> subprocess.Popen:
    proc = subprocess.Popen(
        [str(binary), "run", "--iface", IF_HOST, "--pin-dir", str(PIN_DIR), *extra],
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stderr is not None
    deadline = time.monotonic() + 30
    while "observing" not in (line := proc.stderr.readline()):
        assert line and time.monotonic() < deadline, "probe did not start"
    return proc


def stop_probe(proc: subprocess.Popen) -> dict:
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    return json.loads(err.strip().splitlines()[-1])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


FN_FIELDS = ("rx_packets", "rx_bytes", "tx_packets", "tx_bytes", "rx_last_ns", "tx_last_ns")


def raw(hex_bytes: list[str]) -> bytes:
    return bytes(int(x, 16) for x in hex_bytes)


def percpu_sum(entry: dict) -> dict[str, int]:
    """One fn_stats entry decoded with the contract layout (cgloop_fn_stats.h: six __u64),
    summed over CPUs (max for the *_last_ns timestamps), as the power manager reads it."""
    out = dict.fromkeys(FN_FIELDS, 0)
    for cpu in entry["values"]:
        for name, value in zip(FN_FIELDS, struct.unpack("<6Q", raw(cpu["value"])), strict=True):
            out[name] = max(out[name], value) if name.endswith("_ns") else out[name] + value
    return out


@needs_root
@pytest.mark.kafka
def test_records_reach_kafka_and_decode(binary, veth, stack_settings):
    from cgloop.bus.kafka import BatchConsumer

    bootstrap = stack_settings.bootstrap_servers
    metrics_port = free_port()
    proc = start_probe(
        binary, "--kafka", bootstrap, "--metrics-addr", f"127.0.0.1:{metrics_port}",
        "--function", f"edge={IF_HOST}", "--source-id", f"test-{PID}",
    )  # fmt: skip
    try:
        send_udp()
        time.sleep(0.4)
        metrics = httpx.get(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5).text
        # The per-function contract, read back by another process through the pins.
        dump = json.loads(
            sh("bpftool", "-j", "map", "dump", "pinned", str(PIN_DIR / "fn_stats")).stdout
        )
        if_fn = json.loads(
            sh("bpftool", "-j", "map", "dump", "pinned", str(PIN_DIR / "if_fn")).stdout
        )
    finally:
        stats = stop_probe(proc)
    wanted = ("records_total", "flows_live", "flow_table_fill_ratio", "evictions_total",
              "sweep_duration_seconds_bucket", "kafka_queue_depth", "packets_total")  # fmt: skip
    for name in wanted:
        assert f"cgloop_probe_{name}" in metrics, name
    ifindex = socket.if_nametoindex(IF_HOST)
    assert [(raw(e["key"]), raw(e["value"])) for e in if_fn] == [
        (struct.pack("<I", ifindex), struct.pack("<I", 1))
    ]
    fns = {struct.unpack("<I", raw(e["key"]))[0]: percpu_sum(e) for e in dump}
    # The pins are read before the probe stops, and the kernel may send a few packets of its own
    # (IPv6 neighbour discovery) on the veth in between: the read-back is bounded, not equal.
    assert PACKETS <= fns[1]["rx_packets"] + fns[1]["tx_packets"] <= stats["packets"]
    assert fns[1]["rx_last_ns"] > 0
    assert fns[0]["rx_packets"] == fns[0]["tx_packets"] == 0
    assert stats["kafka_records_dropped"] == 0
    assert stats["kafka_records_delivered"] == stats["records"] > 0

    consumer = BatchConsumer(bootstrap, f"probe-test-{PID}", ["cgloop.flows.v1"])
    try:
        found, deadline = [], time.monotonic() + 30
        while time.monotonic() < deadline:
            got = consumer.poll(1.0)
            if got is None:
                if found:
                    break
                continue
            _, batch, msg = got
            assert msg.key().startswith(b"flows-")
            found += [r for r in batch.records if r.header.source_id == f"test-{PID}"]
    finally:
        consumer.close()
    ours = [r for r in found if r.five_tuple.dst_port == PORT]
    assert sum(r.packets for r in ours) == PACKETS
    assert sum(r.bytes for r in ours) == PACKETS * 128
    assert ours[-1].is_final and ours[-1].interface_name == IF_HOST
    seqs = [r.header.sequence for r in found]
    assert len(seqs) == len(set(seqs))


@needs_root
def test_kafka_outage_is_survived_and_counted(binary, veth):
    dead = f"127.0.0.1:{free_port()}"  # nothing listens there
    proc = start_probe(binary, "--kafka", dead, "--kafka-timeout-s", "1")
    send_udp(10)
    time.sleep(0.3)
    stats = stop_probe(proc)
    assert stats["records"] > 0
    assert stats["kafka_records_delivered"] == 0
    assert stats["kafka_records_dropped"] == stats["records"]


@needs_root
def test_refuses_missing_interface(binary):
    out = subprocess.run(
        [str(binary), "run", "--iface", "nosuchif0", "--pin-dir", str(PIN_DIR)],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert out.returncode == 1
    assert 'interface "nosuchif0" not found in this network namespace' in out.stderr


@needs_root
def test_refuses_without_privileges(binary):
    if shutil.which("setpriv") is None:
        pytest.skip("setpriv (util-linux) missing")
    out = subprocess.run(
        ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--inh-caps=-all",
         "--bounding-set=-all", str(binary), "run", "--iface", "lo"],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert out.returncode == 1, out.stderr
    assert "insufficient privileges" in out.stderr


def test_interval_below_10ms_is_refused(binary):
    out = subprocess.run(
        [str(binary), "run", "--iface", "lo", "--interval-ms", "5"],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert out.returncode != 0 and "interval-ms" in out.stderr
