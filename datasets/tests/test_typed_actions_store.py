"""Migration 0012 (typed actions): actions stored before it still read, typed ones are queryable.

A store migrated up to 0011 takes an action batch of the old shape (parameter maps, the golden
vector of that time); then 0012 runs and the current sample (one action per typed operation,
one result per rollback state) goes in through the same ProtobufList path the sink uses.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from cgloop.datasets.store.migrations import default_migrations_dir

from .conftest import in_own_process

OLD_BATCH = (
    Path(__file__).resolve().parents[2]
    / "policy-engine"
    / "tests"
    / "data"
    / "action_batch_v1_parameters.bin"
)

_SCRIPT = r"""
import json, sys
from pathlib import Path
import clickhouse_connect
from cgloop.bus.topics import ACTIONS
from cgloop.contracts.samples import sample_action_batch
from cgloop.datasets.records import KINDS
from cgloop.datasets.sink.writer import StoreWriter
from cgloop.datasets.store.migrations import migrate

store, before_0012, old_batch = sys.argv[1:4]
client = clickhouse_connect.get_client(dsn=f"chdb://{store}")
kind = KINDS[ACTIONS.name]
migrate(client, Path(before_0012))
StoreWriter(client, columnar=False).insert(kind, [Path(old_batch).read_bytes()], "old")
applied = migrate(client)
rows = StoreWriter(client, columnar=False).insert(
    kind, [sample_action_batch().SerializeToString()], "new"
)
actions = client.query(
    "SELECT id, operation, rollback_of_action_id != '', parameters, spec FROM cgloop.actions"
    " ORDER BY id, sequence"
).result_rows
results = client.query(
    "SELECT action_id, previous_parameters, previous FROM cgloop.action_results"
    " ORDER BY action_id, sequence"
).result_rows
loop = client.query("SELECT count() FROM cgloop.loop_actions").result_rows[0][0]
print(json.dumps({"applied": applied, "rows": rows, "actions": actions, "results": results,
                  "loop_actions": loop}, default=str))
"""


def test_old_and_typed_actions_both_read_after_0012(tmp_path: Path) -> None:
    before = tmp_path / "migrations-0011"
    before.mkdir()
    for f in default_migrations_dir().glob("*.sql"):
        if int(f.name[:4]) < 12:
            shutil.copy(f, before / f.name)
    out = in_own_process(_SCRIPT, str(tmp_path / "store"), str(before), str(OLD_BATCH))
    assert out["applied"][0] == "0012_typed_actions.sql"  # then every later migration
    actions = {(a[0], a[2]): a for a in out["actions"]}
    # The old action (its id is the sample's first): stored before 0012, read unchanged after.
    old = [a for a in out["actions"] if a[3].get("class_id") == "0x00010030"]
    assert len(old) == 2  # once before 0012 and once in the current sample (same old shape)
    assert all(a[4] == "" and a[3] == {"class_id": "0x00010030", "rewrite_dscp": "0"} for a in old)
    # Typed ones: the operation's message as JSON, and its top-level fields in `parameters`.
    spec = {a[1]: json.loads(a[4]) for a in actions.values() if a[4] and not a[2]}
    assert spec["ACTION_OPERATION_REPRIORITISE_FLOW"] == {"class_id": 0x10010, "rewrite_dscp": 46}
    assert spec["ACTION_OPERATION_SET_CLASS_RATE"]["ceil_bps"] in (80_000_000, "80000000")
    chain = spec["ACTION_OPERATION_SET_CHAIN"]
    assert chain["traffic_class"] == "gaming" and len(chain["functions"]) == 7
    assert chain["functions"][1]["acl_proto"] == 17
    assert chain["functions"][5]["dpi_text"] == "GFN"
    assert chain["functions"][5]["kind"] == "FUNCTION_KIND_ADVANCED"
    assert spec["ACTION_OPERATION_SET_POWER_POLICY"]["xman_mode"] == "XMAN_MODE_LOAD"
    assert spec["ACTION_OPERATION_NOTIFY"] == {"message": "switch queue congested"}
    # the nine of 0012 and the node micro loop's three (migration 0013)
    assert len(spec) == 12
    typed_params = [a[3] for a in actions.values() if a[1] == "ACTION_OPERATION_SET_CLASS_RATE"]
    assert typed_params == [{"class_id": "65584", "rate_bps": "50000000", "ceil_bps": "80000000"}]
    # A rollback's spec is the state it restores (no rule before: no class).
    (rollback,) = [a for a in actions.values() if a[2] and a[4]]
    assert json.loads(rollback[4]) == {"class_id": 0, "rewrite_dscp": 0}
    # Results: old maps still there; typed rollback states as JSON.
    previous = [json.loads(r[2]) for r in out["results"] if r[2]]
    assert {"class_id": 0x10030, "rewrite_dscp": 0} in previous
    assert any(p.get("previous_chain_id") == "gaming-old" for p in previous)
    assert any(p.get("policies", [{}])[0].get("forbid_cstates") is True for p in previous)
    assert any(p.get("flow_id") == "49539596143441920" for p in previous)
    assert {"device_id": "of:0000000000000001", "meter_id": "5"} in previous
    assert {"app_id": "org.cgloop", "key": "0x12"} in previous
    assert spec["ACTION_OPERATION_ONOS_METER"]["bands"][0]["rate"] in (10_000, "10000")
    assert spec["ACTION_OPERATION_ONOS_INTENT"]["egress"] == {
        "device_id": "of:0000000000000002",
        "port": 2,
    }
    old_results = [r for r in out["results"] if r[1]]
    assert old_results and all(r[1]["class_id"] == "0x00010010" for r in old_results)
    assert out["loop_actions"] == 14  # one row per action id, old and typed alike
