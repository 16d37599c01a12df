"""The node micro loop's panels compute what their titles say, on crafted node samples and
actions (a private chDB store, no broker): per-second counter increases with a class re-created
mid-range, the worst sojourn per class, the micro loop's latest status per node, actions per
level."""

from __future__ import annotations

import json
import subprocess
import sys

_SCRIPT = r"""
import json, sys
import clickhouse_connect
from cgloop.bus.topics import ACTIONS, NODES
from cgloop.contracts.samples import sample_action_batch
from cgloop.dashboards.build import render
from cgloop.dashboards.check import TimeRange, Variable, expand_macros, interpolate
from cgloop.datasets.records import KINDS
from cgloop.datasets.sink.writer import StoreWriter
from cgloop.datasets.store.migrations import migrate
from cgloop.v1 import action_pb2, common_pb2, node_pb2

client = clickhouse_connect.get_client(dsn=f"chdb://{sys.argv[1]}")
migrate(client)
T0 = 1_750_000_000 * 10**9
batch = node_pb2.NodeSampleBatch()
# node-a, class 1:10 over four 1 s samples: drops 10, 15, 3 (class re-created), 11.
for i, (drops, p99_us, acting, reason) in enumerate(
    [(10, 300, True, ""), (15, 4_000, True, ""), (3, 900, True, ""),
     (11, 700, False, "queue samples 35 ms old (limit 5 ms)")]
):
    s = batch.records.add(node_id="node-a")
    s.header.CopyFrom(common_pb2.RecordHeader(
        schema_version=1, source_id="node-a/node-agent", sequence=i + 1,
        timestamp_ns=T0 + i * 10**9))
    s.queues.add(interface_name="cpe", class_id=0x10010, class_name="best-effort",
                 drops=drops, overlimits=100 * i, sojourn_p99_ns=p99_us * 1000,
                 backlog_bytes=1_000 * (4 - i), max_backlog_bytes=5_000 * (i % 3),
                 sojourn_max_ns=p99_us * 2000, qprot_sanctioned_packets=i,
                 ce_marked_packets=2 * i)
    s.queues.add(interface_name="cpe", class_id=0x10040, class_name="l4s", drops=5)
    s.micro_loop.CopyFrom(node_pb2.MicroLoopStatus(
        acting=acting, reason=reason, queue_sample_age_ns=35_000_000 if not acting else 900_000,
        protected_flows=1))
w = StoreWriter(client, columnar=False)
w.insert(KINDS[NODES.name], [batch.SerializeToString()], "nodes")
actions = sample_action_batch()
# The agent's result of its sanction: applied 150 us after it decided.
sanction = next(e.action for e in actions.events if e.action.id.endswith("41"))
result = actions.events.add().result
result.header.CopyFrom(sanction.header)
result.header.sequence += 100
result.action_id = sanction.id
result.state = action_pb2.ACTION_STATE_APPLIED
result.applied_ns = sanction.header.timestamp_ns + 150_000
result.apply_latency_ns = 150_000
w.insert(KINDS[ACTIONS.name], [actions.SerializeToString()], "actions")

# The whole range in one 10 s bucket (max data points 1: the interval is the range).
rng = TimeRange(T0 - 3 * 10**9, T0 + 7 * 10**9)
step_ms = 10_000
variables = {"node": Variable("node", ["node-a"], True, is_all=True)}
models = {m: json.loads(t) for m, t in render().items()}
out = {}


def run(panel, rng, key):
    sql = interpolate(panel["targets"][0]["rawSql"], variables, rng, step_ms)
    out[key] = [dict(r) for r in client.query(expand_macros(sql, rng, step_ms)).named_results()]


for model in models.values():
    for panel in model["panels"]:
        if panel["title"] in sys.argv[2:]:
            run(panel, rng, panel["title"])
            # A range that starts inside a bucket (T0 + 2 s; the bucket starts at T0): the
            # samples from its start on count, not only those of buckets that start in it.
            run(panel, TimeRange(T0 + 2 * 10**9, T0 + 7 * 10**9), "late " + panel["title"])
print(json.dumps(out, default=str))
"""

PANELS = [
    "Drops and overlimits per class",
    "Queue backlog per class",
    "Queue delay per class (measured sojourn p99 / max)",
    "Queue protection sanctions and CE marks per class",
    "Micro loop status",
    "Actions by level and operation",
    "Node micro-loop actions",
]


def _run(tmp_path) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", _SCRIPT, str(tmp_path / "store"), *PANELS],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_queue_and_level_panels_on_crafted_samples(tmp_path) -> None:
    out = _run(tmp_path)
    assert {k for k in out if not k.startswith("late ")} == set(PANELS)
    # From T0 + 2 s: samples 2 and 3 of 1:10 (p99 900 and 700 us), none of those before.
    late = {r["class"]: r for r in out["late Queue delay per class (measured sojourn p99 / max)"]}
    assert float(late["node-a cpe 1:10 (best-effort)"]["p99_us"]) == 900.0
    late = {r["class"]: r for r in out["late Queue backlog per class"]}
    assert int(late["node-a cpe 1:10 (best-effort)"]["max_backlog_bytes"]) == 10_000
    assert (
        out["late Micro loop status"]
        and out["late Queue protection sanctions and CE marks per class"]
    )

    counters = {r["class"]: r for r in out["Drops and overlimits per class"]}
    # 10 -> 15 (+5) -> 3 (re-created: 0) -> 11 (+8): 13 drops in the 10 s bucket; the l4s
    # class's constant counter adds nothing; overlimits 0, 100, 200, 300: +300.
    best_effort = counters["node-a cpe 1:10 (best-effort)"]
    assert float(best_effort["drops_per_s"]) == 1.3
    assert float(best_effort["overlimits_per_s"]) == 30.0
    assert float(counters["node-a cpe 1:40 (l4s)"]["drops_per_s"]) == 0.0

    delay = {r["class"]: r for r in out["Queue delay per class (measured sojourn p99 / max)"]}
    assert float(delay["node-a cpe 1:10 (best-effort)"]["p99_us"]) == 4_000.0
    assert float(delay["node-a cpe 1:10 (best-effort)"]["max_us"]) == 8_000.0

    backlog = {r["class"]: r for r in out["Queue backlog per class"]}
    # the largest 1 ms sample of the range, and the backlog at the last sample (not any other)
    assert int(backlog["node-a cpe 1:10 (best-effort)"]["max_backlog_bytes"]) == 10_000
    assert int(backlog["node-a cpe 1:10 (best-effort)"]["backlog_bytes"]) == 1_000

    marks = {r["class"]: r for r in out["Queue protection sanctions and CE marks per class"]}
    assert int(marks["node-a cpe 1:10 (best-effort)"]["sanctioned_packets"]) == 0 + 1 + 2 + 3
    assert int(marks["node-a cpe 1:10 (best-effort)"]["ce_marked_packets"]) == 12

    # The latest sample says the loop stopped, and why; one of four samples not acting.
    (status,) = out["Micro loop status"]
    assert status["acting"] in (False, "false", 0)
    assert status["reason"] == "queue samples 35 ms old (limit 5 ms)"
    assert float(status["queue_sample_age_ms"]) == 35.0
    assert int(status["samples_not_acting"]) == 1 and int(status["samples"]) == 4

    levels = {(r["level"], r["operation"]) for r in out["Actions by level and operation"]}
    assert {
        ("node", "queue_protection_sanction"),
        ("node", "protect_flow"),
        ("node", "set_core_frequency"),
        ("micro", "reprioritise_flow"),
    } <= levels
    node = {r["operation"]: r for r in out["Node micro-loop actions"]}
    assert set(node) == {"queue_protection_sanction", "protect_flow", "set_core_frequency"}
    assert node["queue_protection_sanction"]["cause"].startswith("class 1:40 queue delay")
    assert json.loads(node["queue_protection_sanction"]["parameters"])["from_class_id"] == 0x10040
    assert node["queue_protection_sanction"]["state"] == "ACTION_STATE_APPLIED"
    assert float(node["queue_protection_sanction"]["apply_latency_ms"]) == 0.15
    summary = {(r["level"], r["operation"]): r for r in out["Actions by level and operation"]}
    sanctions = summary[("node", "queue_protection_sanction")]
    assert int(sanctions["applied"]) == 1 and float(sanctions["apply_latency_p99_ms"]) == 0.15
