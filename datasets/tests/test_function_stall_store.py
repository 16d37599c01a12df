"""Migration 0016 (a starved chain function): a node sample's `rx_waiting` and `stalled_ns`
per function instance.

A store migrated up to 0015 takes the current node sample batch (its `functions` tuples lack
the new elements: ClickHouse's protobuf decoder skips the fields); then 0016 runs and the same
batch goes in again through the ProtobufList path the sink uses (chDB, no broker).
"""

from __future__ import annotations

import shutil
from pathlib import Path

from cgloop.datasets.store.migrations import default_migrations_dir

from .conftest import in_own_process

_SCRIPT = r"""
import json, sys
from pathlib import Path
import clickhouse_connect
from cgloop.bus.topics import NODES
from cgloop.contracts.samples import sample_node_sample_batch
from cgloop.datasets.records import KINDS
from cgloop.datasets.sink.writer import StoreWriter
from cgloop.datasets.store.migrations import migrate

store, before = sys.argv[1:3]
client = clickhouse_connect.get_client(dsn=f"chdb://{store}")
migrate(client, Path(before))


def insert(sequence, token):
    batch = sample_node_sample_batch()
    for r in batch.records:
        r.header.sequence = sequence
    # a fresh writer: it reads the ingest table's columns once
    return StoreWriter(client, columnar=False).insert(
        KINDS[NODES.name], [batch.SerializeToString()], token
    )


insert(1, "old-node")
applied = migrate(client)
insert(2, "new-node")
print(json.dumps({
    "applied": applied,
    "rows": client.query(
        "SELECT sequence, function_name, instance, rx_dropped, rx_waiting, stalled_ns"
        " FROM cgloop.node_functions ORDER BY sequence, function_name"
    ).result_rows,
}, default=str))
"""


def test_waiting_frames_and_stall_per_instance_after_0016(tmp_path: Path) -> None:
    before = tmp_path / "migrations-0015"
    before.mkdir()
    for f in default_migrations_dir().glob("*.sql"):
        if int(f.name[:4]) < 16:
            shutil.copy(f, before / f.name)
    out = in_own_process(_SCRIPT, str(tmp_path / "store"), str(before))
    assert out["applied"][0] == "0016_function_stall.sql"
    rows = {(r[0], r[1]): [int(v) for v in r[2:]] for r in out["rows"]}
    # Stored before 0016: no frames waiting, no stall.
    assert rows[(1, "nat")] == [1, 12, 0, 0]
    # After: the sample's second instance of a user-space function, stalled with 40 waiting;
    # a BPF function (router) has neither.
    assert rows[(2, "nat")] == [1, 12, 40, 75_000_000]
    assert rows[(2, "router")] == [0, 0, 0, 0]
