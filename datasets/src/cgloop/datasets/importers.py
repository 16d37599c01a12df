"""Importers: third-party data (the lab's data folder, docs/sources.md) and a synthetic loop
scenario into the store.

* Xbox Cloud Gaming (dcomp-leris, BSD-3-Clause): `Features/exNN.csv` -> `flow_features`,
  labelled with the README's rule (the UDP flow pair with an Xbox Cloud Gaming server in
  13.104.0.0/16 on a server port 1000-1110 is the game stream, everything else background);
  `INT data/ExNN.csv` (per-second BMv2 queue telemetry) -> `int_queue_records`, one row per
  direction (egress_port 1 downlink, 2 uplink; occupancy in packets as BMv2 counts it;
  deq_timedelta is in microseconds).
* pcaps -> `flow_records` through the same protobuf path as the sink. The records are the
  probe's own: its Rust pcap twin (`cgloop.pcaprecords`, the code `cgloop-probe pcap` runs).
* `loop_demo`: a synthetic closed-loop episode (flows, a classification, an SLO detection, an
  action and its verified result) for the cookbook; labelled synthetic in its manifest.
"""

from __future__ import annotations

import csv
import ipaddress
import re
from collections.abc import Iterable
from datetime import UTC, datetime
from pathlib import Path

from cgloop.bus.codec import encode
from cgloop.bus.topics import ACTIONS, DETECTIONS, FLOWS, INT
from cgloop.contracts import SCHEMA_VERSION
from cgloop.datasets.records import KINDS
from cgloop.datasets.sink.writer import StoreWriter
from clickhouse_connect.driver.client import Client

XBOX_NET = ipaddress.ip_network("13.104.0.0/16")
_PROTOCOLS = {"TCP": 6, "UDP": 17, "ICMP": 1}
FEATURE_COLUMNS = [
    "dataset", "capture", "flow_id", "src_addr", "dst_addr", "src_port", "dst_port",
    "ip_protocol", "label", "platform", "title", "players", "bytes", "packets",
    "mean_packet_bytes", "mean_inter_packet_s", "frames", "mean_frame_bytes",
    "mean_frame_packets", "mean_inter_frame_s",
]  # fmt: skip


class ImportError_(ValueError):
    """Input data that cannot be imported; the message names the file and line."""


def _is_game_stream(src: str, dst: str, sport: int, dport: int, proto: int) -> bool:
    if proto != 17:
        return False
    for addr, port in ((src, sport), (dst, dport)):
        if ipaddress.ip_address(addr) in XBOX_NET and 1000 <= port <= 1110:
            return True
    return False


def _captures(root: Path, sub: str) -> Iterable[tuple[str, int, Path]]:
    """(title, players, csv path) under root/<title>/<N Player(s)>/<sub>/."""
    for path in sorted(root.glob(f"*/*/{sub}/*.csv")):
        title, players_dir = path.parts[-4], path.parts[-3]
        match = re.match(r"(\d+) Player", players_dir)
        if not match:
            raise ImportError_(f"{path}: expected a '<N> Player(s)' folder, got {players_dir!r}")
        yield title, int(match.group(1)), path


def xbox_features(root: Path) -> list[list[object]]:
    rows: list[list[object]] = []
    for title, players, path in _captures(root, "Features"):
        capture = f"{title}/{players}p/{path.stem}"
        with path.open(newline="") as f:
            for line, rec in enumerate(csv.DictReader(f), start=2):
                try:
                    proto = _PROTOCOLS.get(rec["Protocol"], 0)
                    sport, dport = int(rec["SrcPort"]), int(rec["DstPort"])
                    game = _is_game_stream(rec["SrcIP"], rec["DstIP"], sport, dport, proto)
                    rows.append([
                        "xbox-cloud-gaming", capture, int(rec["ID"]), rec["SrcIP"], rec["DstIP"],
                        sport, dport, proto, "game_stream" if game else "background",
                        "xcloud" if game else "", title, players, int(rec["FlowSizeBytes"]),
                        int(rec["FlowSizePackets"]), float(rec["PS"]), float(rec["IPI"]),
                        int(rec["NumFrames"]), float(rec["FS"]), float(rec["FS(PKT)"]),
                        float(rec["IFI"]),
                    ])  # fmt: skip
                except (KeyError, ValueError) as exc:
                    raise ImportError_(f"{path}:{line}: {exc!r}") from None
    return rows


def xbox_queues(root: Path) -> list[list[object]]:
    rows: list[list[object]] = []
    for title, players, path in _captures(root, "INT data"):
        source = f"xbox-cg/{title}/{players}p/{path.stem}"
        with path.open(newline="") as f:
            for line, rec in enumerate(csv.DictReader(f), start=2):
                try:
                    t = datetime.fromisoformat(rec["time"][:26]).replace(tzinfo=UTC)
                    for port, side in ((1, "downlink"), (2, "uplink")):
                        rows.append([
                            source, 2 * (line - 2) + port, SCHEMA_VERSION, t, 1, port, 0,
                            int(rec[f"{side} deq_qdepth"]),
                            int(rec[f"{side} deq_timedelta"]) * 1000, False, 0.0,
                        ])  # fmt: skip
                except (KeyError, ValueError) as exc:
                    raise ImportError_(f"{path}:{line}: {exc!r}") from None
    return rows


QUEUE_COLUMNS = [
    "source_id", "sequence", "schema_version", "time", "switch_id", "egress_port", "queue_id",
    "queue_occupancy_cells", "queue_latency_ns", "congested", "egress_tx_utilization",
]  # fmt: skip


def import_xbox(client: Client, root: Path) -> dict[str, int]:
    features, queues = xbox_features(root), xbox_queues(root)
    if not features and not queues:
        raise ImportError_(f"{root}: no Features/*.csv or 'INT data'/*.csv below it")
    client.insert("cgloop.flow_features", features, column_names=FEATURE_COLUMNS)
    client.insert("cgloop.int_queue_records", queues, column_names=QUEUE_COLUMNS)
    return {"flow_features": len(features), "int_queue_records": len(queues)}


def import_pcaps(client: Client, paths: list[Path], chunk: int = 5000) -> dict[str, int]:
    """Flow records of each capture, written exactly as the sink writes Kafka batches."""
    from cgloop import pcaprecords
    from cgloop.v1.flow_pb2 import FlowRecordBatch

    writer = StoreWriter(client)
    kind = KINDS[FLOWS.name]
    total = 0
    for path in paths:
        try:
            batch, _ = pcaprecords.read(path, source_id=f"pcap/{path.name}")
        except (ValueError, OSError) as exc:
            raise ImportError_(str(exc)) from None
        records = FlowRecordBatch.FromString(batch).records
        for i in range(0, len(records), chunk):
            part = FlowRecordBatch(records=records[i : i + chunk])
            writer.insert(kind, [encode(part)], f"pcap/{path.name}/{i}")
        total += len(records)
    return {"flow_records": total}


# The synthetic episode: 10 minutes from DEMO_T0; flow B suffers from minute 4 to 6 until the
# loop reprioritises it at 4:10.25.
DEMO_T0_NS = 1_750_000_000_000_000_000 - 1_750_000_000_000_000_000 % 3_600_000_000_000
_S = 1_000_000_000


def loop_demo(client: Client, seed: int = 7) -> dict[str, int]:
    """Write the synthetic loop episode (flows, INT latency, detections, actions) to the store."""
    import random

    from cgloop.v1 import action_pb2, common_pb2, detection_pb2, flow_pb2, int_pb2

    rng = random.Random(seed)
    writer = StoreWriter(client)

    def header(source: str, seq: int, t: int) -> common_pb2.RecordHeader:
        return common_pb2.RecordHeader(
            schema_version=SCHEMA_VERSION, source_id=source, sequence=seq, timestamp_ns=t
        )

    def tuple_of(src: str, dst: str, sport: int, dport: int) -> common_pb2.FiveTuple:
        return common_pb2.FiveTuple(
            src_addr=ipaddress.ip_address(src).packed,
            dst_addr=ipaddress.ip_address(dst).packed,
            src_port=sport,
            dst_port=dport,
            ip_protocol=17,
        )

    flows = {
        "A": (tuple_of("13.104.105.68", "192.0.2.10", 1054, 56714), "xcloud", 1105),
        "B": (tuple_of("198.51.100.7", "192.0.2.11", 49004, 51000), "GFN", 1200),
        "bg": (tuple_of("203.0.113.5", "192.0.2.12", 443, 50123), "", 600),
    }
    fault = range(4 * 60 + 0, 6 * 60 + 10)  # seconds of the episode when B suffers
    repaired_at = 4 * 60 + 10
    flow_batch, int_batch = flow_pb2.FlowRecordBatch(), int_pb2.IntRecordBatch()
    seq = 0
    for second in range(600):
        t = DEMO_T0_NS + second * _S
        for name, (ft, _platform, size) in flows.items():
            seq += 1
            bad = name == "B" and second in fault and second < repaired_at
            packets = 1000 if name != "bg" else 50
            jitter_ms = rng.uniform(6, 12) if bad else rng.uniform(0.5, 2.0)
            rtp = (
                flow_pb2.RtpStats(
                    ssrc=0x1234 + len(name),
                    payload_type=96,
                    clock_rate_hz=90_000,
                    jitter_ns=int(jitter_ms * 1e6),
                    lost_packets=rng.randint(5, 30) if bad else rng.randint(0, 1),
                )
                if name != "bg"
                else None
            )
            flow_batch.records.append(
                flow_pb2.FlowRecord(
                    header=header("demo/node-a/flow-probe", seq, t + _S),
                    five_tuple=ft,
                    direction=common_pb2.DIRECTION_EGRESS,
                    interval_start_ns=t,
                    interval_end_ns=t + _S,
                    packets=packets,
                    bytes=packets * size,
                    size_min_bytes=size - 40,
                    size_max_bytes=size + 40,
                    size_sum_bytes=packets * size,
                    size_histogram_bytes=common_pb2.Log2Histogram(
                        buckets=[0] * size.bit_length() + [packets][:1]
                    ),
                    rtp=rtp,
                )
            )
            latency_ms = rng.uniform(30, 45) if bad else rng.uniform(4, 7)
            int_batch.records.append(
                int_pb2.IntRecord(
                    flow=int_pb2.IntFlowRecord(
                        header=header("demo/int-collector", seq, t + _S // 2),
                        five_tuple=ft,
                        path_switch_ids=[1, 2],
                        end_to_end_latency_ns=int(latency_ms * 1e6),
                        reason=int_pb2.INT_EVENT_REASON_PERIODIC,
                    )
                )
            )
    writer.insert(KINDS[FLOWS.name], [encode(flow_batch)], "demo/flows")
    writer.insert(KINDS[INT.name], [encode(int_batch)], "demo/int")

    detections = detection_pb2.DetectionBatch()
    for i, (ft, platform, _) in enumerate(flows.values()):
        if platform:
            detections.records.append(
                detection_pb2.Detection(
                    header=header("demo/analytics", i + 1, DEMO_T0_NS + 5 * _S),
                    id=f"00000000-0000-4000-8000-00000000000{i + 1}",
                    kind=detection_pb2.DETECTION_KIND_GAMING_FLOW_CLASSIFIED,
                    severity=detection_pb2.SEVERITY_INFO,
                    confidence=0.96,
                    detector="gaming-flow@demo",
                    window_start_ns=DEMO_T0_NS,
                    window_end_ns=DEMO_T0_NS + 5 * _S,
                    labels={"platform": platform},
                    flow=ft,
                )
            )
    slo_id = "00000000-0000-4000-8000-0000000000a1"
    detections.records.append(
        detection_pb2.Detection(
            header=header("demo/analytics", 10, DEMO_T0_NS + 240 * _S + 50_000_000),
            id=slo_id,
            kind=detection_pb2.DETECTION_KIND_SLO_LATENCY,
            severity=detection_pb2.SEVERITY_MAJOR,
            confidence=0.9,
            evidence=[
                detection_pb2.Evidence(
                    name="p99_latency_ns", value=42e6, threshold=30e6, baseline=6e6, unit="ns"
                )
            ],
            detector="slo@demo",
            window_start_ns=DEMO_T0_NS + 230 * _S,
            window_end_ns=DEMO_T0_NS + 240 * _S,
            labels={"platform": "GFN"},
            flow=flows["B"][0],
        )
    )
    writer.insert(KINDS[DETECTIONS.name], [encode(detections)], "demo/detections")

    action_id, refused_id = (
        "00000000-0000-4000-8000-0000000000b1",
        "00000000-0000-4000-8000-0000000000b2",
    )
    decided = DEMO_T0_NS + 250 * _S
    applied = decided + 250_000_000
    actions = action_pb2.ActionBatch()
    for n, (aid, op) in enumerate(
        [
            (action_id, action_pb2.ACTION_OPERATION_REPRIORITISE_FLOW),
            (refused_id, action_pb2.ACTION_OPERATION_SET_POWER_POLICY),
        ]
    ):
        actions.events.append(
            action_pb2.ActionEvent(
                action=action_pb2.Action(
                    header=header("demo/policy-engine", n + 1, decided),
                    id=aid,
                    reason_detection_ids=[slo_id],
                    policy_id="protect-gaming",
                    level=action_pb2.ACTION_LEVEL_MICRO,
                    target=action_pb2.ActionTarget(node_id="node-a", flow=flows["B"][0]),
                    operation=op,
                    expected_effect=action_pb2.ExpectedEffect(
                        metric="flow.p99_latency_ns",
                        comparator=action_pb2.COMPARATOR_LESS_THAN,
                        value=30e6,
                        within_ns=10 * _S,
                    ),
                    state=action_pb2.ACTION_STATE_PROPOSED,
                )
            )
        )
    results = [
        (action_id, action_pb2.ACTION_STATE_APPLIED, applied, None, "applied by node-a agent"),
        (
            action_id,
            action_pb2.ACTION_STATE_VERIFIED,
            applied + 10 * _S,
            action_pb2.Verification(
                verdict=action_pb2.VERDICT_IMPROVED,
                metric="flow.p99_latency_ns",
                before_value=42e6,
                after_value=6.5e6,
            ),
            "p99 latency back under the SLO",
        ),
        (refused_id, action_pb2.ACTION_STATE_REFUSED, decided + 1_000_000, None,
         "guard: power policy changes are frozen"),
    ]  # fmt: skip
    for n, (aid, state, t, verification, message) in enumerate(results):
        actions.events.append(
            action_pb2.ActionEvent(
                result=action_pb2.ActionResult(
                    header=header("demo/policy-engine", 10 + n, t),
                    action_id=aid,
                    state=state,
                    verification=verification,
                    message=message,
                    applied_ns=applied if aid == action_id else 0,
                    detection_to_apply_ns=applied - (DEMO_T0_NS + 240 * _S)
                    if aid == action_id
                    else 0,
                    verified_ns=applied + 10 * _S if verification else 0,
                )
            )
        )
    writer.insert(KINDS[ACTIONS.name], [encode(actions)], "demo/actions")
    return {
        "flow_records": len(flow_batch.records),
        "int_flow_records": len(int_batch.records),
        "detections": len(detections.records),
        "actions": 2,
        "action_results": len(results),
    }
