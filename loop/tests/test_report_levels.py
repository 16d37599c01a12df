"""The report names the level and the lever that acted first for each fault: the node agent's
own actions (level NODE, source `<node>/node-agent`) and the policy engine's, read back from a
private chDB store through the sink's writer, as the loop's real records are."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

_SCRIPT = r"""
import json, sys
import clickhouse_connect
from cgloop.bus.topics import ACTIONS
from cgloop.datasets.records import KINDS
from cgloop.datasets.sink.writer import StoreWriter
from cgloop.datasets.store.migrations import migrate
from cgloop.loop.report import first_lever, node_placed_at, node_timeline
from cgloop.v1 import action_pb2 as a, common_pb2 as c

store = sys.argv[1]
client = clickhouse_connect.get_client(dsn=f"chdb://{store}")
migrate(client)
ONSET, MS = 1_800_000_000_000_000_000, 1_000_000
seq = iter(range(1, 100))

def action(src, aid, t, level, op, sport, dport, reasons=(), cause=""):
    return a.ActionEvent(action=a.Action(
        header=c.RecordHeader(source_id=src, sequence=next(seq), timestamp_ns=t, schema_version=1),
        id=aid, level=level, operation=op, reason_detection_ids=list(reasons), cause=cause,
        target=a.ActionTarget(node_id="edge", interface_name="cpe", flow=c.FiveTuple(
            src_addr=bytes([10, 0, 0, 1]), dst_addr=bytes([10, 0, 0, 2]),
            src_port=sport, dst_port=dport, ip_protocol=17)),
        state=a.ACTION_STATE_APPLIED))

def result(src, aid, t, applied):
    return a.ActionEvent(result=a.ActionResult(
        header=c.RecordHeader(source_id=src, sequence=next(seq), timestamp_ns=t, schema_version=1),
        action_id=aid, state=a.ACTION_STATE_APPLIED, applied_ns=applied))

node, engine = "edge/node-agent", "policy-engine/run1"  # noqa: F841
events = [
    # before the fault: not the fault's
    action(node, "n0", ONSET - 50 * MS, a.ACTION_LEVEL_NODE,
           a.ACTION_OPERATION_REPRIORITISE_FLOW, 49104, 49104, cause="promoted: x"),
    # promoted and released again before the fault: back in best effort at onset
    action(node, "p1", ONSET - 80 * MS, a.ACTION_LEVEL_NODE,
           a.ACTION_OPERATION_REPRIORITISE_FLOW, 49304, 49304, cause="promoted: y"),
    action(node, "p2", ONSET - 20 * MS, a.ACTION_LEVEL_NODE,
           a.ACTION_OPERATION_REPRIORITISE_FLOW, 49304, 49304, cause="released: class 1:10"),
    # the engine's own move before the fault is not the node's placement
    action(engine, "g0", ONSET - 30 * MS, a.ACTION_LEVEL_MICRO,
           a.ACTION_OPERATION_REPRIORITISE_FLOW, 49404, 49404, reasons=["d0"]),
    # the guard releasing an earlier flow as the fault starts: listed, not a lever
    action(node, "n00", ONSET + 5 * MS, a.ACTION_LEVEL_NODE,
           a.ACTION_OPERATION_REPRIORITISE_FLOW, 49004, 49004, cause="released: class 1:10"),
    # the abuser sanctioned 31 ms after onset (its record written at the audit interval's end,
    # its result says when it was applied), then the guard promoting the gaming flow
    action(node, "n1", ONSET + 40 * MS, a.ACTION_LEVEL_NODE,
           a.ACTION_OPERATION_QUEUE_PROTECTION_SANCTION, 51004, 51004),
    result(node, "n1", ONSET + 40 * MS, ONSET + 31 * MS),
    action(node, "n2", ONSET + 45 * MS, a.ACTION_LEVEL_NODE,
           a.ACTION_OPERATION_REPRIORITISE_FLOW, 49104, 49104,
           cause="promoted: class 1:10 queue delay 10.5 ms >= guard 10.00 ms"),
    # the engine's action, 150 ms after onset, from a detection
    action(engine, "g1", ONSET + 150 * MS, a.ACTION_LEVEL_MICRO,
           a.ACTION_OPERATION_REPRIORITISE_FLOW, 49104, 49104, reasons=["d1"]),
    result(engine, "g1", ONSET + 160 * MS, ONSET + 155 * MS),
]
StoreWriter(client, columnar=False).insert(
    KINDS[ACTIONS.name], [a.ActionBatch(events=events).SerializeToString()], "t")
local = node_timeline(client, ONSET, ONSET + 4000 * MS, "edge")
other = node_timeline(client, ONSET, ONSET + 4000 * MS, "elsewhere")
several = node_timeline(client, ONSET, ONSET + 4000 * MS, ["elsewhere", "edge"])
engine_only = {"applied_ns": ONSET + 155 * MS, "level": "micro", "node": "edge",
               "action": "reprioritise_flow class_id=65568"}
print(json.dumps({
    "local": local, "other": other, "several": several,
    "first": first_lever(engine_only, local, ONSET),
    "engine_first": first_lever(engine_only, other, ONSET),
    "placed": node_placed_at(client, ONSET, "edge"),
    "placed_later": node_placed_at(client, ONSET + 4000 * MS, "edge"),
}))
"""


def run(script: str, *args: str) -> dict:
    # chDB hosts one data folder per process: the store lives in a child
    done = subprocess.run(
        [sys.executable, "-c", script, *args], capture_output=True, text=True, timeout=180
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_first_lever_and_its_level(tmp_path: Path) -> None:
    out = run(_SCRIPT, str(tmp_path / "store"))
    onset, ms = 1_800_000_000_000_000_000, 1_000_000
    local = out["local"]
    # only the fault's span, each at its applied time, sanction and promotion apart
    assert local["node_actions"] == [
        [5.0, "release", "49004>49004"],
        [31.0, "queue_protection_sanction", "51004>51004"],
        [45.0, "reprioritise_flow", "49104>49104"],
    ]
    assert local["first_sanction_ns"] == onset + 31 * ms
    assert local["first_promotion_ns"] == onset + 45 * ms
    assert out["first"] == {
        "first_ns": onset + 31 * ms, "first_level": "node",
        "first_lever": "queue_protection_sanction", "first_node": "edge",
    }
    # another node's agent did nothing: the engine's action is the first lever
    assert out["other"] == {"node_actions": []}
    assert out["engine_first"] == {
        "first_ns": onset + 155 * ms, "first_level": "micro", "first_lever": "reprioritise_flow",
        "first_node": "edge",
    }
    # the loop reads every edge's agent at once: the one that acted is named
    assert out["several"] == local

    # the flows the guard held promoted when the fault began: 49104 promoted 50 ms before onset
    # (49304 promoted then released; 49404 moved by the engine, not the node)
    assert out["placed"] == ["49104>49104"]
    assert out["placed_later"] == ["49104>49104"]  # promoted again; 49004 released


_LEVERS_SCRIPT = r"""
import json, sys
import clickhouse_connect
from cgloop.bus.topics import ACTIONS, DETECTIONS
from cgloop.datasets.records import KINDS
from cgloop.datasets.sink.writer import StoreWriter
from cgloop.datasets.store.migrations import migrate
from cgloop.loop.report import loop_timeline
from cgloop.v1 import action_pb2 as a, common_pb2 as c, detection_pb2 as d

client = clickhouse_connect.get_client(dsn=f"chdb://{sys.argv[1]}")
migrate(client)
ONSET, MS = 1_800_000_000_000_000_000, 1_000_000
engine = "policy-engine/run1"
seq = iter(range(1, 100))

def header(src, t):
    return c.RecordHeader(source_id=src, sequence=next(seq), timestamp_ns=t, schema_version=1)

det = d.Detection(
    header=header("analytics", ONSET + 100 * MS), id="d1",
    kind=d.DETECTION_KIND_QUEUE_CONGESTION, severity=d.SEVERITY_MAJOR, detector="overload",
    window_start_ns=ONSET, window_end_ns=ONSET + 100 * MS,
    labels={"node_id": "core", "interface": "edge2"},
    queue=d.QueueRef(node_id="1", interface_name="7", queue_id=0))
old = d.Detection(  # before the look-back: not the fault's
    header=header("analytics", ONSET - 5000 * MS), id="d0",
    kind=d.DETECTION_KIND_QUEUE_CONGESTION, severity=d.SEVERITY_MAJOR, detector="overload",
    window_start_ns=ONSET - 5100 * MS, window_end_ns=ONSET - 5000 * MS,
    queue=d.QueueRef(node_id="1", interface_name="7", queue_id=0))
StoreWriter(client, columnar=False).insert(
    KINDS[DETECTIONS.name], [d.DetectionBatch(records=[old, det]).SerializeToString()], "t")

def action(aid, t, level, op, node="", device="", reasons=("d1",), src=engine):
    return a.ActionEvent(action=a.Action(
        header=header(src, t), id=aid, level=level, operation=op,
        reason_detection_ids=list(reasons),
        target=a.ActionTarget(node_id=node, device_id=device, switch_id=1 if device else 0),
        state=a.ACTION_STATE_APPLIED))

def result(aid, t, state, verdict=a.VERDICT_UNSPECIFIED, applied=0, verified=0):
    return a.ActionEvent(result=a.ActionResult(
        header=header(engine, t), action_id=aid, state=state,
        verification=a.Verification(verdict=verdict), applied_ns=applied, verified_ns=verified))

events = [
    action("shape", ONSET + 108 * MS, a.ACTION_LEVEL_MICRO,
           a.ACTION_OPERATION_SET_CLASS_RATE, node="core"),
    # the engine may fill node_id with the switch id: the device names an ONOS lever
    action("onos", ONSET + 109 * MS, a.ACTION_LEVEL_GLOBAL,
           a.ACTION_OPERATION_ONOS_FLOW_RULE, node="1", device="of:0000000000000001"),
    # another run's engine, and an action on an older detection: not this fault's
    action("other", ONSET + 110 * MS, a.ACTION_LEVEL_MICRO,
           a.ACTION_OPERATION_SET_CLASS_RATE, node="core", src="policy-engine/run0"),
    action("stale", ONSET + 111 * MS, a.ACTION_LEVEL_MICRO,
           a.ACTION_OPERATION_SET_CLASS_RATE, node="core", reasons=("d0",)),
    result("shape", ONSET + 120 * MS, a.ACTION_STATE_APPLIED, applied=ONSET + 117 * MS),
    result("shape", ONSET + 2200 * MS, a.ACTION_STATE_VERIFIED, a.VERDICT_IMPROVED,
           applied=ONSET + 117 * MS, verified=ONSET + 2121 * MS),
    result("onos", ONSET + 130 * MS, a.ACTION_STATE_VERIFIED, a.VERDICT_NOT_CHECKED,
           applied=ONSET + 125 * MS, verified=ONSET + 126 * MS),
]
StoreWriter(client, columnar=False).insert(
    KINDS[ACTIONS.name], [a.ActionBatch(events=events).SerializeToString()], "t")
out = loop_timeline(client, ONSET, ONSET + 4000 * MS, engine)
out["levels"] = [lv.model_dump() for lv in out.get("levels", [])]
print(json.dumps(out))
"""


def test_every_engine_lever_of_a_fault(tmp_path: Path) -> None:
    out = run(_LEVERS_SCRIPT, str(tmp_path / "store"))
    onset, ms = 1_800_000_000_000_000_000, 1_000_000
    assert out["detection_kind"] == "queue_congestion"
    assert out["detection_ns"] == onset + 100 * ms
    levers = [(lv["operation"], lv["level"], lv["node"], lv["verdict"]) for lv in out["levels"]]
    # this run's actions on the fault's detections, in order; the core's queue and ONOS's rule
    # (named by its device), each with its last state and verdict
    assert levers == [
        ("set_class_rate", "micro", "core", "verified (improved)"),
        ("onos_flow_rule", "global", "of:0000000000000001", "verified (not_checked)"),
    ]
    shape = out["levels"][0]
    assert (shape["applied_ns"], shape["verified_ns"]) == (onset + 117 * ms, onset + 2121 * ms)
    # the flat fields are the first lever's
    assert (out["node"], out["applied_ns"], out["verdict"]) == (
        "core", onset + 117 * ms, "verified (improved)")
