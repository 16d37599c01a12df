"""Cluster mode: the shipped migrations rendered for a ClickHouse cluster (issue 23).

The schema is written once, for one node (`migrations/NNNN_*.sql`, what the embedded store
and a single server run). For a cluster named by `CGLOOP_STORE_CLUSTER` each statement is
rewritten mechanically, in order, by `ClusterRenderer`:

* every table `cgloop.X` becomes a *local* table `cgloop.X_local` on every node (`ON CLUSTER`),
  its engine the replicated form of the same engine (`ReplacingMergeTree` ->
  `ReplicatedReplacingMergeTree('/clickhouse/tables/{shard}/cgloop/X_local', '{replica}')`,
  `Null` stays `Null`), plus a `Distributed` table under the old name `cgloop.X`, sharded by
  the key `SHARDING` gives the table: analysts, dashboards, views and the sink keep the names
  they use;
* flow tables (and their ingest table) are sharded by the *conversation*: the endpoints in a
  fixed order (the smaller (address, port) first, as analytics' `conversation_key` and the
  probe's Kafka key), so both directions of a flow, its INT records and its roll-ups live on
  one shard and per-flow queries, `FINAL` and the roll-ups' merges stay local to it; the
  other kinds by their source (a node's samples, an engine's actions);
* materialized views are created on every node, reading and writing the local tables (the
  sink inserts into `cgloop.X_ingest`, a Distributed table; each shard's share arrives in its
  local `Null` ingest table, whose views fill that shard's records and roll-ups);
* plain views are created on every node over the Distributed tables;
* `ALTER` runs on the local tables; changes of a column's type or presence also on the
  Distributed table (codecs, indexes and mutations are storage, local only).

A statement the renderer does not know is refused with its text, as is a new table without a
sharding key: a migration that needs something else must teach this module first.
Tested without a ClickHouse server (none runs on our machines): every rendered statement is
parsed and formatted by ClickHouse's own parser in chDB, and the local half executed there
(datasets/tests/test_cluster_migrations.py).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Literal

from cgloop.datasets.store.sql import split_statements

DATABASE = "cgloop"
LOCAL_SUFFIX = "_local"
KEEPER_ROOT = "/clickhouse/tables"
_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class ClusterRenderError(ValueError):
    """A migration statement cannot be rendered for a cluster; the message names it."""


def check_cluster_name(name: str) -> str:
    """The cluster's name as ClickHouse's `remote_servers` has it; refused if it is not a
    plain identifier (it is spliced into DDL)."""
    if not _IDENT.match(name):
        raise ClusterRenderError(
            f"CGLOOP_STORE_CLUSTER={name!r}: a cluster name is letters, digits and _ "
            "(as named in the servers' remote_servers)"
        )
    return name


# ------------------------------------------------------------------------- sharding keys -----


def _ip(column: str) -> str:
    """The IPv6 value an ingest address column (4 or 16 raw bytes) becomes in the record
    tables: the same expression as the views of migration 0003."""
    return (
        f"CAST(if(length({column}) = 4, IPv4ToIPv6(reinterpretAsUInt32(reverse({column}))), "
        f"CAST(toFixedString({column}, 16) AS IPv6)) AS IPv6)"
    )


def conversation_hash(src: str, dst: str, sport: str, dport: str, proto: str) -> str:
    """A 64-bit hash of a flow's conversation: equal for both directions (the endpoints in a
    fixed order, the smaller (address, port) first, as analytics' conversation_key)."""
    sp, dp, pr = f"toUInt16({sport})", f"toUInt16({dport})", f"toUInt8({proto})"
    return (
        f"if(({src}, {sp}) <= ({dst}, {dp}), cityHash64({src}, {dst}, {sp}, {dp}, {pr}), "
        f"cityHash64({dst}, {src}, {dp}, {sp}, {pr}))"
    )


def _conversation_of(prefix: str) -> str:
    """The conversation hash of an ingest row's `<prefix>five_tuple_*` columns."""
    p = f"{prefix}five_tuple_"
    return conversation_hash(
        _ip(f"{p}src_addr"),
        _ip(f"{p}dst_addr"),
        f"{p}src_port",
        f"{p}dst_port",
        f"{p}ip_protocol",
    )


def _source(column: str) -> str:
    return f"cityHash64(CAST({column} AS String))"


_FLOW_KEY = conversation_hash("src_addr", "dst_addr", "src_port", "dst_port", "ip_protocol")
_QUEUE_KEY = "cityHash64(CAST(source_id AS String), toUInt32(switch_id))"

# Table -> sharding key of its Distributed table. An ingest table's key is the key its records
# get in their table (a record and its ingest row land on the same shard, whether it arrives
# through the sink or is imported into the record table directly).
SHARDING: dict[str, str] = {
    # ingest tables (the sink's inserts)
    "flow_ingest": _conversation_of(""),
    "int_ingest": (
        f"multiIf(hop_header_source_id != '', {_conversation_of('hop_')}, "
        f"flow_header_source_id != '', {_conversation_of('flow_')}, "
        f"drop_header_source_id != '', {_conversation_of('drop_')}, "
        "cityHash64(queue_header_source_id, toUInt32(queue_switch_id)))"
    ),
    "probe_ingest": _source("header_source_id"),
    "node_ingest": _source("header_source_id"),
    "detection_ingest": _source("header_source_id"),
    "action_ingest": _source("concat(action_header_source_id, result_header_source_id)"),
    "deadletter_ingest": _source("header_source_id"),
    # record tables
    "flow_records": _FLOW_KEY,
    "int_hop_records": _FLOW_KEY,
    "int_flow_records": _FLOW_KEY,
    "int_drop_records": _FLOW_KEY,
    "int_queue_records": _QUEUE_KEY,
    "probe_records": _source("source_id"),
    "node_samples": _source("source_id"),
    "detections": _source("source_id"),
    "actions": _source("source_id"),
    "action_results": _source("source_id"),
    "dead_letters": _source("source_id"),
    # roll-ups and derived tables (filled on the shard of their flows' records)
    "flow_stats_1s": _FLOW_KEY,
    "flow_stats_1m": _FLOW_KEY,
    "flow_minutes_closed": _FLOW_KEY,
    "flow_features": "cityHash64(CAST(dataset AS String), CAST(capture AS String), flow_id)",
}


# ----------------------------------------------------------------------------- rendering -----

Part = Literal["local", "distributed"]


@dataclass(frozen=True)
class Rendered:
    """One statement for the cluster. `part`: `local` (the per-node tables and the views that
    fill them: what each node holds) or `distributed` (the Distributed tables and the plain
    views over them)."""

    sql: str
    part: Part


def _strip_comments(statement: str) -> str:
    lines = [ln for ln in statement.splitlines() if not ln.lstrip().startswith("--")]
    return "\n".join(lines).strip()


_NAME = r"cgloop\.([A-Za-z_][A-Za-z0-9_]*)"
_CREATE_DB = re.compile(r"^CREATE DATABASE IF NOT EXISTS (\w+)$", re.S)
_CREATE_TABLE = re.compile(rf"^CREATE TABLE IF NOT EXISTS {_NAME}\s*\((.*)$", re.S)
_CREATE_MV = re.compile(
    rf"^CREATE MATERIALIZED VIEW (IF NOT EXISTS )?{_NAME} TO {_NAME} AS\b(.*)$", re.S
)
_CREATE_VIEW = re.compile(rf"^CREATE (VIEW IF NOT EXISTS|OR REPLACE VIEW) {_NAME} AS\b(.*)$", re.S)
_DROP_VIEW = re.compile(rf"^DROP VIEW IF EXISTS {_NAME}$", re.S)
_ALTER = re.compile(rf"^ALTER TABLE {_NAME}\s+(.*)$", re.S)
_ENGINE = re.compile(
    r"\)\s*ENGINE\s*=\s*(Null|(Replacing|Aggregating|Summing|Collapsing|)MergeTree)"
    r"(?:\s*\(([^()]*)\))?"
)
_REF = re.compile(rf"\b{_NAME}\b")
_CODEC = re.compile(r"\s+CODEC\((?:[^()]|\([^()]*\))*\)")


def _split_clauses(text: str) -> list[str]:
    """An ALTER's clauses: split on commas outside brackets and quotes."""
    out, depth, quote, start = [], 0, "", 0
    for i, ch in enumerate(text):
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "'`\"":
            quote = ch
        elif ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        elif ch == "," and depth == 0:
            out.append(text[start:i].strip())
            start = i + 1
    out.append(text[start:].strip())
    return [c for c in out if c]


_SHAPE = re.compile(r"^(ADD COLUMN|DROP COLUMN|MODIFY COLUMN)\b", re.I)
_STORAGE_ONLY = re.compile(r"^MODIFY COLUMN\s+\S+\s+(CODEC|COMMENT|TTL|REMOVE)\b", re.I)


@dataclass
class ClusterRenderer:
    """Renders the migrations for `cluster`, in order (it remembers which tables exist).

    `replicated=False` renders the same statements with the single-node engines and without
    `ON CLUSTER`: the local half a test can execute in chDB, where neither Keeper nor a
    cluster exists."""

    cluster: str
    replicated: bool = True
    tables: set[str] = field(default_factory=set)

    def __post_init__(self) -> None:
        check_cluster_name(self.cluster)

    @property
    def _on(self) -> str:
        return f" ON CLUSTER {self.cluster}" if self.replicated else ""

    def render_script(self, script: str, where: str = "") -> list[Rendered]:
        out: list[Rendered] = []
        for i, statement in enumerate(split_statements(script), start=1):
            try:
                out += self.render(statement)
            except ClusterRenderError as exc:
                raise ClusterRenderError(f"{where} statement {i}: {exc}") from None
        return out

    def render(self, statement: str) -> list[Rendered]:
        sql = _strip_comments(statement)
        if m := _CREATE_DB.match(sql):
            return [Rendered(f"CREATE DATABASE IF NOT EXISTS {m.group(1)}{self._on}", "local")]
        if m := _CREATE_TABLE.match(sql):
            return self._table(m.group(1), m.group(2))
        if m := _CREATE_MV.match(sql):
            view, target, body = m.group(2), m.group(3), m.group(4)
            return [
                Rendered(
                    f"CREATE MATERIALIZED VIEW {m.group(1) or ''}{DATABASE}.{view}{self._on} "
                    f"TO {self._local(target)} AS{self._locals(body)}",
                    "local",
                )
            ]
        if m := _CREATE_VIEW.match(sql):
            return [
                Rendered(
                    f"CREATE {m.group(1)} {DATABASE}.{m.group(2)}{self._on} AS{m.group(3)}",
                    "distributed",
                )
            ]
        if m := _DROP_VIEW.match(sql):
            # Materialized views (local) and plain views (over the Distributed tables) alike.
            return [Rendered(f"DROP VIEW IF EXISTS {DATABASE}.{m.group(1)}{self._on}", "local")]
        if m := _ALTER.match(sql):
            return self._alter(m.group(1), m.group(2))
        raise ClusterRenderError(
            f"no cluster form for this statement (teach cgloop.datasets.store.cluster): {sql[:160]}"
        )

    # -- pieces --------------------------------------------------------------------------
    def _local(self, table: str) -> str:
        if table not in self.tables:
            raise ClusterRenderError(f"{DATABASE}.{table} is not a table created before")
        return f"{DATABASE}.{table}{LOCAL_SUFFIX}"

    def _locals(self, body: str) -> str:
        """A materialized view's SELECT reads the local tables (a view fires on inserts
        into its own node's table)."""
        return _REF.sub(
            lambda m: self._local(m.group(1)) if m.group(1) in self.tables else m.group(0), body
        )

    def _table(self, table: str, rest: str) -> list[Rendered]:
        if table not in SHARDING:
            raise ClusterRenderError(
                f"{DATABASE}.{table} has no sharding key: add one to "
                "cgloop.datasets.store.cluster.SHARDING"
            )
        local = f"{table}{LOCAL_SUFFIX}"
        engine = _ENGINE.search(rest)
        if engine is None:
            raise ClusterRenderError(f"{DATABASE}.{table}: no engine this module knows")
        if self.replicated and engine.group(1) != "Null":
            args = [f"'{KEEPER_ROOT}/{{shard}}/{DATABASE}/{local}'", "'{replica}'"]
            args += [engine.group(3).strip()] if (engine.group(3) or "").strip() else []
            new_engine = f") ENGINE = Replicated{engine.group(1)}({', '.join(args)})"
            rest = rest[: engine.start()] + new_engine + rest[engine.end() :]
            # Replicated tables keep their insert tokens in Keeper, shared by the replicas.
            rest = rest.replace(
                "non_replicated_deduplication_window", "replicated_deduplication_window"
            )
        self.tables.add(table)
        key = SHARDING[table]
        return [
            Rendered(f"CREATE TABLE IF NOT EXISTS {DATABASE}.{local}{self._on} ({rest}", "local"),
            Rendered(
                f"CREATE TABLE IF NOT EXISTS {DATABASE}.{table}{self._on} AS {DATABASE}.{local}"
                f" ENGINE = Distributed({self.cluster}, {DATABASE}, {local}, {key})",
                "distributed",
            ),
        ]

    def _alter(self, table: str, clauses_text: str) -> list[Rendered]:
        local = self._local(table)
        out = [Rendered(f"ALTER TABLE {local}{self._on} {clauses_text}", "local")]
        shape = [
            _CODEC.sub("", c)
            for c in _split_clauses(clauses_text)
            if _SHAPE.match(c) and not _STORAGE_ONLY.match(c)
        ]
        if shape:
            out.append(
                Rendered(
                    f"ALTER TABLE {DATABASE}.{table}{self._on} {', '.join(shape)}",
                    "distributed",
                )
            )
        return out


def render_migrations(
    scripts: Iterable[tuple[str, str]], cluster: str, replicated: bool = True
) -> dict[str, list[Rendered]]:
    """(name, sql) of every migration, in order -> its statements for `cluster`."""
    renderer = ClusterRenderer(cluster, replicated=replicated)
    return {name: renderer.render_script(sql, name) for name, sql in scripts}


def ttl_statement(table: str, days: int, cluster: str | None = None) -> str:
    """`cgloop store ttl`: a table's retention; on a cluster its local table on every node."""
    if not cluster:
        return f"ALTER TABLE {DATABASE}.{table} MODIFY TTL ingested_at + INTERVAL {days} DAY"
    check_cluster_name(cluster)
    return (
        f"ALTER TABLE {DATABASE}.{table}{LOCAL_SUFFIX} ON CLUSTER {cluster}"
        f" MODIFY TTL ingested_at + INTERVAL {days} DAY"
    )


# ------------------------------------------------------------- cluster-wide meta tables ------


def cluster_wide_table(
    cluster: str,
    table: str,
    columns: str,
    order_by: str,
    engine: str = "ReplacingMergeTree",
    tail: str = "",
) -> list[str]:
    """DDL of a bookkeeping table (`cgloop_meta.*`: the migration record, the sink's chunk
    plans) that every node of the cluster holds whole: one replication group across all
    shards, so any node answers the same."""
    check_cluster_name(cluster)
    db, _, name = table.partition(".")
    path = f"{KEEPER_ROOT}/{cluster}/{db}/{name}"
    return [
        f"CREATE DATABASE IF NOT EXISTS {db} ON CLUSTER {cluster}",
        f"CREATE TABLE IF NOT EXISTS {table} ON CLUSTER {cluster} ({columns})"
        f" ENGINE = Replicated{engine}('{path}', '{{shard}}-{{replica}}')"
        f" ORDER BY {order_by}{tail}",
    ]
