"""Every field round-trips generator → collector → Kafka → Python decode, for every report
format (Telemetry Report v2.0 INT-MD and INT-MX, v1.0, v0.5), through the real broker.

Four collectors (one per format) run side by side on free loopback ports, each fed by its own
generator with a congestion episode and drops planted; the records are read back from
`cgloop.int.v1` with cgloop's own consumer (strict decode) and compared with the generator's
description of its flows.
"""

from __future__ import annotations

import json
import socket
import subprocess
import time
import uuid
from collections import defaultdict

import pytest
from cgloop.bus.kafka import BatchConsumer
from cgloop.telemetry.int_cli import collector_binary, collector_command
from cgloop.v1.int_pb2 import IntEventReason

pytestmark = pytest.mark.kafka

FORMATS = [("v2.0", "md"), ("v2.0", "mx"), ("v1.0", "md"), ("v0.5", "md")]
GEN_OPTS = ["--flows", "2", "--hops", "3", "--no-jitter", "--congestion", "1:40:80"]
GEN_OPTS += ["--drop-every", "25", "--drop-hop", "1", "--drop-reason", "71"]


def free_udp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def describe(fmt: str, mode: str) -> dict:
    out = subprocess.run(
        [str(collector_binary()), "gen", "--describe", "--format", fmt, "--mode", mode, *GEN_OPTS],
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    )
    return json.loads(out.stdout)


def start_collector(bootstrap: str, source: str) -> tuple[subprocess.Popen, int]:
    """A collector on a free port, and the port. The port is free when chosen, but the
    generators already running send from ephemeral UDP ports that may take it before the
    collector binds (CI once met "Address already in use"): another port is tried then."""
    for _ in range(5):
        port = free_udp_port()
        cmd = collector_command(f"127.0.0.1:{port}", bootstrap, 1, 6.0, [])
        cmd += ["--source-id", source, "--hop-records", "--summary-interval", "1"]
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        line = proc.stderr.readline()  # {"event": "listening", ...} once the sockets are bound
        if '"listening"' in line:
            return proc, port
        rest = proc.stderr.read()
        proc.wait(10)
        assert "Address already in use" in line + rest, line + rest
    raise AssertionError("no free UDP port held long enough for the collector to bind")


def consume(bootstrap: str, sources: set[str], want_stats: dict[str, int]) -> dict:
    """Records of our collectors, grouped by source prefix and kind."""
    got: dict = defaultdict(lambda: defaultdict(list))
    consumer = BatchConsumer(bootstrap, f"int-rt-{uuid.uuid4().hex}", ["cgloop.int.v1"])
    deadline = time.monotonic() + 60
    try:
        while time.monotonic() < deadline:
            item = consumer.poll(0.5)
            if item is None:
                if all(sum(map(len, got[s].values())) >= n for s, n in want_stats.items()):
                    break
                continue
            _, batch, msg = item
            consumer.commit(msg)
            for rec in batch.records:
                kind = rec.WhichOneof("record")
                r = getattr(rec, kind)
                prefix = r.header.source_id.split("/")[0]
                if prefix in sources:
                    got[prefix][kind].append(r)
    finally:
        consumer.close()
    return got


def test_generator_to_python_every_format(stack_settings) -> None:
    bootstrap = stack_settings.bootstrap_servers
    run_id = uuid.uuid4().hex[:8]
    runs = []
    for fmt, mode in FORMATS:
        source = f"int-rt-{run_id}-{fmt}-{mode}"
        proc, port = start_collector(bootstrap, source)
        gen = subprocess.Popen(
            [
                *(str(collector_binary()), "gen", "--target", f"127.0.0.1:{port}"),
                *("--format", fmt, "--mode", mode, "--count", "0", "--duration", "3"),
                *("--rate", "600", *GEN_OPTS),
            ],
            stdout=subprocess.PIPE,
            text=True,
        )
        runs.append((fmt, mode, source, proc, gen))
    stats = {}
    for _, _, source, proc, gen in runs:
        assert gen.wait(30) == 0
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
        stats[source] = json.loads(out.strip().splitlines()[-1])
    for source, s in stats.items():
        assert s["reports"] > 500 and s["malformed"] == 0, (source, s)
        assert s["filter_ratio"] > 5, (source, s)  # most reports folded into state
    records = consume(bootstrap, set(stats), {s: st["records"] for s, st in stats.items()})

    for fmt, mode, source, _, _ in runs:
        truth = describe(fmt, mode)
        recs = records[source]
        assert sum(map(len, recs.values())) == stats[source]["records"], source
        check_headers(source, recs)
        check_flows(fmt, mode, truth, recs)
        check_queues(recs)
        check_drops(fmt, truth, recs)


def check_headers(source: str, recs: dict) -> None:
    by_source = defaultdict(list)
    for kind in recs.values():
        for r in kind:
            assert r.header.schema_version == 1
            assert r.header.timestamp_ns > 1_600_000_000 * 10**9
            by_source[r.header.source_id].append(r.header.sequence)
    for src, seqs in by_source.items():
        assert src.startswith(source + "/w")
        assert sorted(seqs) == list(range(1, len(seqs) + 1)), src  # no gap, no repeat


def key(t) -> tuple:
    return (bytes(t.src_addr), bytes(t.dst_addr), t.src_port, t.dst_port, t.ip_protocol)


def check_flows(fmt: str, mode: str, truth: dict, recs: dict) -> None:
    flows = {
        (
            bytes(f["src_addr"]),
            bytes(f["dst_addr"]),
            f["src_port"],
            f["dst_port"],
            f["ip_protocol"],
        ): f
        for f in truth["flows"]
    }
    new = [r for r in recs["flow"] if r.reason == IntEventReason.INT_EVENT_REASON_NEW_FLOW]
    assert sorted(key(r.five_tuple) for r in new) == sorted(flows), fmt
    reasons = {r.reason for r in recs["flow"]}
    # A record folds the reports since the flow's previous record: at least the one that
    # triggered it (a summary is only sent for a flow that had reports).
    assert all(r.report_count >= 1 for r in recs["flow"]), fmt
    assert IntEventReason.INT_EVENT_REASON_PERIODIC in reasons, fmt
    for r in new:
        want = flows[key(r.five_tuple)]
        assert list(r.path_switch_ids) == want["path"], fmt
        assert r.report_sequence > 0
        assert len(r.hops) == len(want["hops"])
        for got, exp in zip(r.hops, want["hops"], strict=True):
            assert got.switch_id == exp["switch_id"]
            assert (got.ingress_port, got.egress_port) == (exp["ingress_port"], exp["egress_port"])
            assert got.hop_latency_ns == exp["hop_latency_ns"], fmt
            assert got.queue_id == exp["queue_id"]
            assert got.queue_occupancy_cells == exp["queue_occupancy_cells"], fmt
            if fmt != "v0.5":  # the v0.5 local report carries no TX utilization, no bitmap
                assert got.egress_tx_utilization == pytest.approx(exp["egress_tx_util"] / 10_000)
                assert got.egress_tx_utilization_raw == exp["egress_tx_util"], fmt
                assert (got.l2_ingress_port, got.l2_egress_port) == (
                    exp["l2_ingress_port"],
                    exp["l2_egress_port"],
                ), fmt
            if fmt == "v2.0":  # buffer (bit 8): the generator's v1.0 bitmap stops at bit 7
                assert exp["buffer_occupancy_cells"] > 0
                assert (got.buffer_id, got.buffer_occupancy_cells) == (
                    exp["buffer_id"],
                    exp["buffer_occupancy_cells"],
                ), fmt
            else:
                assert (got.buffer_id, got.buffer_occupancy_cells) == (0, 0), fmt
            # Switch timestamps: egress - ingress is the hop latency (32-bit wrap in v0.5/v1.0).
            wrap = 2**64 if fmt == "v2.0" else 2**32
            delta = (got.egress_timestamp_ns - got.ingress_timestamp_ns) % wrap
            assert delta == exp["hop_latency_ns"], fmt
        assert r.reporter_switch_id in want["path"], fmt
        if mode == "md" and fmt != "v0.5":  # the INT sink reports the whole stack
            assert r.reporter_switch_id == want["path"][-1], fmt
            assert r.report_count == 1, fmt
        else:  # per-hop reports: every switch reported before the flow was announced
            assert r.report_count >= len(want["path"]), fmt
        total = sum(h["hop_latency_ns"] for h in want["hops"])
        if fmt == "v2.0" and mode == "md":  # one packet's 64-bit timestamps: source to sink
            assert r.end_to_end_latency_ns > total
        else:
            assert r.end_to_end_latency_ns == total
    # Hop records mirror the hops of each flow record (same five-tuple, hop_index order).
    hop_recs = recs["hop"]
    assert len(hop_recs) == sum(len(r.hops) for r in recs["flow"])
    first = [h for h in hop_recs if key(h.five_tuple) == key(new[0].five_tuple)][: len(new[0].hops)]
    assert [h.hop_index for h in first] == list(range(len(new[0].hops)))
    assert [h.hop for h in first] == list(new[0].hops)


def check_queues(recs: dict) -> None:
    q = recs["queue"]
    assert [(r.switch_id, r.congested) for r in q] == [(2, True), (2, False)], q
    on, off = q
    assert on.queue_occupancy_cells >= 4096 and off.queue_occupancy_cells < 1024
    assert on.queue_id == 2 and on.egress_port == 3
    assert on.queue_latency_ns > 50_000
    assert off.header.timestamp_ns > on.header.timestamp_ns


def check_drops(fmt: str, truth: dict, recs: dict) -> None:
    drops = recs["drop"]
    assert drops, fmt
    flows = {(bytes(f["src_addr"]), f["src_port"]) for f in truth["flows"]}
    for d in drops:
        assert d.switch_id == 2
        assert d.drop_reason == (0 if fmt == "v1.0" else 71), fmt  # v1.0 has no reason field
        assert d.drop_count >= 1
        assert (bytes(d.five_tuple.src_addr), d.five_tuple.src_port) in flows
        if fmt != "v1.0":
            assert (d.ingress_port, d.egress_port, d.queue_id) == (2, 3, 2), fmt
