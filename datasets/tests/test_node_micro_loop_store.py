"""Migration 0013 (the node micro loop): queue samples, the micro loop's status, node-level
actions with their cause and typed parameters, and the protections a protect_flow restores.

A store migrated up to 0012 takes the current node sample and action batches (its ingest
tables lack the new columns: the sink simply does not ask for them); then 0013 runs and the same
batches, plus a protect_flow rollback, a node sample with edge-case class ids and an IPv6 flow,
go in through the ProtobufList path the sink uses (chDB, no broker).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from cgloop.datasets.store.migrations import default_migrations_dir

from .conftest import in_own_process

_SCRIPT = r"""
import json, sys
from pathlib import Path
import clickhouse_connect
from cgloop.bus.topics import ACTIONS, NODES
from cgloop.contracts.samples import (
    gaming_five_tuple, sample_action_batch, sample_node_sample_batch,
)
from cgloop.datasets.records import KINDS
from cgloop.datasets.sink.writer import StoreWriter
from cgloop.datasets.store.migrations import migrate
from cgloop.v1 import action_pb2 as a, node_agent_pb2 as na, node_pb2

store, before = sys.argv[1:3]
client = clickhouse_connect.get_client(dsn=f"chdb://{store}")
migrate(client, Path(before))


def insert(kind, batch, token):
    # a fresh writer: it reads the ingest table's columns once
    return StoreWriter(client, columnar=False).insert(
        KINDS[kind], [batch.SerializeToString()], token
    )


def node_batch(sequence):
    batch = sample_node_sample_batch()
    for r in batch.records:
        r.header.sequence = sequence
    return batch


insert(NODES.name, node_batch(1), "old-node")
old_actions = sample_action_batch()
for e in old_actions.events:
    if e.HasField("action"):
        e.action.header.source_id, e.action.id = "before-0013", f"old-{e.action.id}"
insert(ACTIONS.name, old_actions, "old-actions")
applied = migrate(client)
insert(NODES.name, node_batch(2), "new-node")
# Edge cases of the tc handle and an IPv6 flow's addresses.
edge = node_batch(3)
edge.records[0].node_id = "node-edge"
del edge.records[0].queues[:]
for class_id in (0x10000, 0x10ABC, 0xFFFF0001, 0x120010):
    edge.records[0].queues.add(interface_name="cpe", class_id=class_id)
insert(NODES.name, edge, "edge-node")
batch = sample_action_batch()
v6 = gaming_five_tuple()
v6.src_addr = bytes.fromhex("20010db8000000000000000000000001")
v6.dst_addr = bytes.fromhex("20010db8000000000000000000000002")
protections = a.PreviousProtections(flows=[
    na.ProtectedFlow(interface_name="cpe", flow=v6, latency_slo_ns=20_000_000,
                     class_id=0x10020, ttl_ns=30_000_000_000),
])
batch.events.add().action.CopyFrom(a.Action(
    header=batch.events[0].action.header, id="rollback-of-protect",
    operation=a.ACTION_OPERATION_PROTECT_FLOW, state=a.ACTION_STATE_PROPOSED,
    rollback_of_action_id="7c41d0e2-93ab-4f6e-8d15-2a6b9e3f4c40",
    rollback=a.PreviousState(protections=protections),
))
insert(ACTIONS.name, batch, "new-actions")


def rows(sql):
    return client.query(sql).result_rows


print(json.dumps({
    "applied": applied,
    "samples": rows(
        "SELECT sequence, node_id, queues, micro_loop FROM cgloop.node_samples"
        " ORDER BY sequence"),
    "queues": rows(
        "SELECT sequence, node_id, interface_name, class_id, class_handle, class_name,"
        " sojourn_p99_ns, qprot_sanctioned_packets, ce_marked_packets"
        " FROM cgloop.node_queues ORDER BY sequence, class_id"),
    "actions": rows(
        "SELECT source_id, id, level, operation, cause, spec FROM cgloop.actions"
        " ORDER BY source_id, id"),
    "previous": rows(
        "SELECT action_id, previous FROM cgloop.action_results WHERE previous != ''"),
    "loop_actions": rows(
        "SELECT action_id, level, cause, apply_latency_ns FROM cgloop.loop_actions"
        " ORDER BY action_id"),
}, default=str))
"""


def _num(v: object) -> object:
    return int(v) if isinstance(v, str) and v.isdigit() else v


def test_queues_micro_loop_and_node_actions_after_0013(tmp_path: Path) -> None:
    before = tmp_path / "migrations-0012"
    before.mkdir()
    for f in default_migrations_dir().glob("*.sql"):
        if int(f.name[:4]) < 13:
            shutil.copy(f, before / f.name)
    out = in_own_process(_SCRIPT, str(tmp_path / "store"), str(before))
    assert out["applied"][0] == "0013_node_micro_loop.sql"

    # Node samples: the one stored before 0013 has no queues and a micro loop that does not act.
    samples = {(s[0], s[1]): s for s in out["samples"]}
    old = samples[(1, "node-a")]
    assert old[2] == [] and old[3]["acting"] is False and old[3]["reason"] == ""
    new = samples[(2, "node-a")]
    (queue,) = new[2]
    assert queue["class_id"] == 0x10040 and queue["class_name"] == "l4s"
    assert int(queue["sojourn_p99_ns"]) == 1_100_000 and int(queue["max_backlog_bytes"]) == 15_000
    assert int(queue["qprot_sanctioned_packets"]) == 1_200 and int(queue["ce_marked_packets"]) == 35
    assert new[3]["acting"] is True and new[3]["reason"].startswith("1 of 3 queue readers")
    assert int(new[3]["queue_sample_age_ns"]) == 900_000 and new[3]["protected_flows"] == 2

    # node_queues: one row per class, tc's handle notation.
    by_class = {(q[0], q[3]): q for q in out["queues"]}
    assert [_num(v) for v in by_class[(2, 0x10040)][1:]] == [
        "node-a",
        "cpe",
        0x10040,
        "1:40",
        "l4s",
        1_100_000,
        1_200,
        35,
    ]
    handles = {q[3]: q[4] for q in out["queues"] if q[1] == "node-edge"}
    assert handles == {0x10000: "1:0", 0x10ABC: "1:abc", 0xFFFF0001: "ffff:1", 0x120010: "12:10"}
    assert not [q for q in out["queues"] if q[0] == 1]  # nothing from before 0013

    # Actions: level NODE, the cause, the three new operations' typed parameters.
    new_actions = [a for a in out["actions"] if a[0] != "before-0013"]
    node = {a[3]: a for a in new_actions if a[2] == "ACTION_LEVEL_NODE"}
    assert set(node) == {
        "ACTION_OPERATION_PROTECT_FLOW",
        "ACTION_OPERATION_QUEUE_PROTECTION_SANCTION",
        "ACTION_OPERATION_SET_CORE_FREQUENCY",
    }
    assert all(a[4].startswith("class 1:40 queue delay 2.4 ms") for a in node.values())
    assert all(a[4] == "" for a in new_actions if a[2] != "ACTION_LEVEL_NODE")
    spec = {op: json.loads(a[5]) for op, a in node.items()}
    # 64-bit integers may come quoted (ClickHouse's JSON output setting)
    ints = {op: {k: _num(v) for k, v in s.items()} for op, s in spec.items()}
    assert ints["ACTION_OPERATION_PROTECT_FLOW"] == {
        "latency_slo_ns": 20_000_000,
        "class_id": 0x10020,
        "rewrite_dscp": 46,
        "ttl_ns": 30_000_000_000,
    }
    sanction = ints["ACTION_OPERATION_QUEUE_PROTECTION_SANCTION"]
    assert sanction["from_class_id"] == 0x10040 and sanction["to_class_id"] == 0x10010
    assert sanction["sanctioned_packets"] == 1_200 and sanction["max_score_us"] == 5_250.5
    assert sanction["interval_end_ns"] - sanction["interval_start_ns"] == 100_000_000
    assert ints["ACTION_OPERATION_SET_CORE_FREQUENCY"] == {
        "core": 2,
        "min_frequency_khz": 2_400_000,
        "max_frequency_khz": 3_000_000,
        "previous_min_frequency_khz": 800_000,
        "previous_max_frequency_khz": 3_000_000,
        "xman_mode": "load",
    }
    # Stored before 0013: the new operations had no columns, so no spec and no cause.
    before_rows = [
        a for a in out["actions"] if a[0] == "before-0013" and a[2] == "ACTION_LEVEL_NODE"
    ]
    assert len(before_rows) == 3 and all(a[4] == "" and a[5] == "" for a in before_rows)

    # A protect_flow's rollback restores protections: the flows as JSON, addresses as text.
    (rollback,) = [a for a in new_actions if a[1] == "rollback-of-protect"]
    (flow,) = json.loads(rollback[5])["flows"]
    assert flow["flow"]["src_addr"] == "2001:db8::1" and flow["flow"]["dst_addr"] == "2001:db8::2"
    assert flow["interface_name"] == "cpe" and int(flow["class_id"]) == 0x10020
    # ... and a result's previous protections (the sample's IPv4 gaming flow).
    protected = [json.loads(p[1]) for p in out["previous"] if '"flows"' in p[1]]
    assert len(protected) == 1  # stored before 0013 it had no column: previous ''
    flow = protected[0]["flows"][0]
    assert flow["flow"]["src_addr"] == "198.51.100.7" and flow["flow"]["dst_port"] == 51000
    assert flow["promoted"] is True and int(flow["promotions"]) == 3

    # loop_actions: cause and apply latency beside the level.
    loop = {a[0]: a for a in out["loop_actions"]}
    assert loop["7c41d0e2-93ab-4f6e-8d15-2a6b9e3f4c41"][1:3] == [
        "ACTION_LEVEL_NODE",
        "class 1:40 queue delay 2.4 ms >= 1.0 ms, bucket score 5250 us >= 4000 us",
    ]
    assert any(int(a[3]) > 0 for a in loop.values())
