"""Active probes end to end: the real agent probes a real reflector over loopback and its
ProbeRecordBatches arrive on cgloop.probes.v1 in the real broker, strictly decodable."""

from __future__ import annotations

import itertools
import os
import select
import socket
import struct
import subprocess
import time
import uuid
from pathlib import Path

import grpc
import pytest
from cgloop.binaries import find_binary
from cgloop.bus.kafka import BatchConsumer
from cgloop.v1 import node_agent_pb2 as na
from cgloop.v1 import node_agent_pb2_grpc, probe_pb2

pytestmark = pytest.mark.root


def _start(args: list[str], ready: str) -> subprocess.Popen[str]:
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if select.select([proc.stdout], [], [], 0.5)[0] and ready in proc.stdout.readline():
            return proc
        if proc.poll() is not None:
            raise RuntimeError(f"{args[1]} exited: {proc.stderr.read()}")  # type: ignore[union-attr]
    proc.kill()
    raise RuntimeError(f"{args[1]} not ready within 20 s")


def test_udp_echo_probe_records_reach_kafka(stack_settings, tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root (the agent loads its BPF datapath)")
    binary = str(find_binary("cgloop-node-agent", prefer_release=False))
    certs = tmp_path / "certs"
    subprocess.run([binary, "certs", "--out", str(certs)], check=True, capture_output=True)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    (tmp_path / "agent.toml").write_text("[bounds]\ninterfaces = []\n")
    sock = tmp_path / "agent.sock"
    procs = [
        _start([binary, "reflect", "--listen", f"127.0.0.1:{port}"], "reflecting"),
        _start(
            [
                binary,
                "serve",
                "--config",
                str(tmp_path / "agent.toml"),
                "--listen",
                f"unix:{sock}",
                "--tls-dir",
                str(certs),
                "--journal",
                str(tmp_path / "journal.pb"),
                "--node-id",
                "probe-test",
                "--kafka",
                stack_settings.bootstrap_servers,
            ],
            "listening on",
        ),
    ]
    probe_id = f"p-{uuid.uuid4().hex[:8]}"
    consumer = BatchConsumer(
        stack_settings.bootstrap_servers, f"na-{probe_id}", ["cgloop.probes.v1"]
    )
    try:
        creds = grpc.ssl_channel_credentials(
            root_certificates=(certs / "ca.pem").read_bytes(),
            private_key=(certs / "client.key").read_bytes(),
            certificate_chain=(certs / "client.pem").read_bytes(),
        )
        stub = node_agent_pb2_grpc.NodeAgentServiceStub(
            grpc.secure_channel(
                f"unix:{sock}", creds, options=[("grpc.ssl_target_name_override", "localhost")]
            )
        )
        spec = na.ProbeSpec(
            probe_id=probe_id,
            method=probe_pb2.PROBE_METHOD_UDP_ECHO,
            target_addr=bytes([127, 0, 0, 1]),
            target_port=port,
            dscp=46,
            interval_ns=5_000_000,
            interval_jitter_ns=2_000_000,
            packet_bytes=120,
            timeout_ns=500_000_000,
        )
        stub.StartProbe(na.StartProbeRequest(action_id="s1", spec=spec), timeout=10)
        records: list[probe_pb2.ProbeRecord] = []
        deadline = time.monotonic() + 30
        while len(records) < 20 and time.monotonic() < deadline:
            item = consumer.poll(1.0)
            if item and item[2].key() == probe_id.encode():
                records.extend(item[1].records)
        state = stub.GetState(na.GetStateRequest(), timeout=10).state
        stub.StopProbe(na.StopProbeRequest(action_id="s2", probe_id=probe_id), timeout=10)
    finally:
        consumer.close()
        for p in procs:
            p.kill()
            p.wait(10)
    assert len(records) >= 20, f"{len(records)} probe records arrived"
    assert all(r.probe_id == probe_id and r.rtt_ns > 0 and not r.lost for r in records)
    assert all(r.dscp == 46 and r.packet_bytes == 120 for r in records)
    assert records[0].header.source_id.startswith("probe-test/probe/")
    status = state.probe_status[0]
    assert status.probe_id == probe_id and status.received_packets >= 20
    assert 0 < status.rtt.p50_ns <= status.rtt.p99_ns <= status.rtt.max_ns


def test_node_samples_reach_kafka(stack_settings, tmp_path: Path) -> None:
    """The agent's NodeSampleBatches arrive on cgloop.nodes.v1, strictly decodable, one per
    interval with increasing sequence and every core's utilization within 0..1."""
    if os.geteuid() != 0:
        pytest.skip("needs root (the agent loads its BPF datapath)")
    from cgloop.v1 import node_pb2  # noqa: F401  (the codec resolves the type by name)

    binary = str(find_binary("cgloop-node-agent", prefer_release=False))
    certs = tmp_path / "certs"
    subprocess.run([binary, "certs", "--out", str(certs)], check=True, capture_output=True)
    node_id = f"nodes-{uuid.uuid4().hex[:8]}"
    (tmp_path / "agent.toml").write_text(
        "node_sample_interval_ms = 100\n[bounds]\ninterfaces = []\n"
    )
    consumer = BatchConsumer(stack_settings.bootstrap_servers, f"na-{node_id}", ["cgloop.nodes.v1"])
    proc = _start(
        [
            binary,
            "serve",
            "--config",
            str(tmp_path / "agent.toml"),
            "--listen",
            f"unix:{tmp_path / 'agent.sock'}",
            "--tls-dir",
            str(certs),
            "--journal",
            str(tmp_path / "journal.pb"),
            "--node-id",
            node_id,
            "--kafka",
            stack_settings.bootstrap_servers,
        ],
        "listening on",
    )
    samples = []
    try:
        deadline = time.monotonic() + 30
        while len(samples) < 5 and time.monotonic() < deadline:
            item = consumer.poll(1.0)
            if item and item[2].key() == node_id.encode():
                samples.extend(item[1].records)
    finally:
        consumer.close()
        proc.kill()
        proc.wait(10)
    assert len(samples) >= 5, f"{len(samples)} node samples arrived"
    seqs = [s.header.sequence for s in samples]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
    assert all(
        s.node_id == node_id and s.header.source_id == f"{node_id}/node-agent" for s in samples
    )
    cores = os.cpu_count() or 1
    assert all(len(s.cores) == cores for s in samples)
    assert all(0.0 <= c.utilization <= 1.0 for s in samples for c in s.cores)
    gaps = [
        (b.header.timestamp_ns - a.header.timestamp_ns) / 1e6
        for a, b in itertools.pairwise(samples)
    ]
    assert all(50 <= g <= 1000 for g in gaps), gaps


def _probe_request(seq: int, length: int = 60) -> bytes:
    """A probe request as the agent's prober writes it (docs/node-agent.md, Reflector)."""
    header = struct.pack("!4sBBHIQQ", b"cglp", 1, 0, length, 0xFEED, seq, time.time_ns())
    return header.ljust(length, b"\0")


def test_reflector_answers_probe_requests_only_and_defaults_to_loopback() -> None:
    """issue 17 finding 3: the reflector echoed any payload (two of them and one datagram made
    263,754 datagrams in 2 s) and listened on every interface by default."""
    binary = str(find_binary("cgloop-node-agent", prefer_release=False))
    usage = subprocess.run([binary, "reflect", "--help"], capture_output=True, text=True).stdout
    assert "[default: 127.0.0.1:7799]" in usage, usage
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = _start([binary, "reflect", "--listen", f"127.0.0.1:{port}"], "reflecting")
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as c:
            c.settimeout(0.5)
            c.connect(("127.0.0.1", port))
            request = _probe_request(7)
            reply = request[:5] + b"\x01" + request[6:]
            for unanswered in (b"hello", b"\0" * 64, reply, request[:40]):
                c.send(unanswered)
            c.send(request)
            got = c.recv(2048)
            assert got == reply, "the first answer is the reply to the request, flagged"
            with pytest.raises(TimeoutError):
                c.recv(2048)
    finally:
        proc.kill()
        proc.wait(10)
