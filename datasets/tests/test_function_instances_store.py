"""Migration 0015 (Natif's scale-out): a node sample's function counters per instance, and
a chain function's instances in the actions' typed parameters.

A store migrated up to 0014 takes the current node sample batch (its `functions` tuples lack
the new elements: ClickHouse's protobuf decoder skips the fields); then 0015 runs and the same
batch goes in again through the ProtobufList path the sink uses (chDB, no broker), plus one
whose instance has no busy reading yet; the sample action batch (a set_chain whose dpi runs on
two instances) goes in after 0015.
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
from cgloop.contracts.samples import sample_action_batch, sample_node_sample_batch
from cgloop.datasets.records import KINDS
from cgloop.datasets.sink.writer import StoreWriter
from cgloop.datasets.store.migrations import migrate

store, before = sys.argv[1:3]
client = clickhouse_connect.get_client(dsn=f"chdb://{store}")
migrate(client, Path(before))


def insert(batch, token, topic=NODES.name):
    # a fresh writer: it reads the ingest table's columns once
    return StoreWriter(client, columnar=False).insert(
        KINDS[topic], [batch.SerializeToString()], token
    )


def node_batch(sequence):
    batch = sample_node_sample_batch()
    for r in batch.records:
        r.header.sequence = sequence
    return batch


insert(node_batch(1), "old-node")
applied = migrate(client)
insert(node_batch(2), "new-node")
first = node_batch(3)
first.records[0].functions[1].ClearField("busy_ratio")  # an instance's first sample
insert(first, "first-reading")
insert(sample_action_batch(), "actions", ACTIONS.name)
print(json.dumps({
    "applied": applied,
    "rows": client.query(
        "SELECT sequence, function_name, instance, core, packets, forwarded_packets,"
        " busy_ratio, rx_dropped FROM cgloop.node_functions ORDER BY sequence, function_name"
    ).result_rows,
    "set_chain": client.query(
        "SELECT spec FROM cgloop.actions WHERE operation = 'ACTION_OPERATION_SET_CHAIN'"
    ).result_rows,
}, default=str))
"""


def test_function_counters_per_instance_after_0015(tmp_path: Path) -> None:
    before = tmp_path / "migrations-0014"
    before.mkdir()
    for f in default_migrations_dir().glob("*.sql"):
        if int(f.name[:4]) < 15:
            shutil.copy(f, before / f.name)
    out = in_own_process(_SCRIPT, str(tmp_path / "store"), str(before))
    assert out["applied"][0] == "0015_function_instances.sql"
    rows = {(r[0], r[1]): [int(v) if isinstance(v, str) and v.isdigit() else v for v in r[2:]]
            for r in out["rows"]}
    # Stored before 0015: one instance, no reading, no ring losses.
    assert rows[(1, "nat")] == [0, 1, 999_000, 998_990, 0.0, 0]
    # After: the second instance of a user-space function with its load and losses; a BPF
    # function (router) has no busy reading.
    assert rows[(2, "nat")] == [1, 1, 999_000, 998_990, 0.625, 12]
    assert rows[(2, "router")] == [0, 0, 1_000_000, 999_990, 0.0, 0]
    # An absent reading is stored as 0, like the samples' other optional doubles.
    assert rows[(3, "nat")][4] == 0.0 and rows[(3, "nat")][5] == 12

    # The set_chain's dpi on two instances, pinned to cores 2 and 3, in the typed JSON.
    (spec,) = [json.loads(r[0]) for r in out["set_chain"] if r[0]]
    scaled = [f for f in spec["functions"] if int(f["instances"]) == 2]
    assert len(scaled) == 1 and [int(c) for c in scaled[0]["instance_cores"]] == [2, 3], spec
    assert scaled[0]["dpi_text"] == "GFN"
