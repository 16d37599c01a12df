"""Dataset bundles: a time range of some tables as Parquet files plus `manifest.json`.

The manifest says how the data was recorded (software, topology, hardware, traffic, faults,
timestamps and clocks, synthetic or real, licence and source), what each file holds (rows,
columns with their ClickHouse types, sha256) and the schema version of the store it came from.
Import refuses a bundle whose manifest or files do not check out, naming what is wrong. An
import carries a dedup token per file, so importing the same bundle twice counts it once.
"""

from __future__ import annotations

import hashlib
import json
from datetime import UTC, datetime
from pathlib import Path, PurePosixPath, PureWindowsPath
from typing import Annotated, Literal

import pyarrow as pa
import pyarrow.parquet as pq
from cgloop.datasets.records import DATABASE
from cgloop.datasets.store.minutes import close_minutes
from clickhouse_connect.driver.client import Client
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError

MANIFEST = "manifest.json"
FORMAT = "cgloop-dataset"
FORMAT_VERSION = 1
# Event-time column a time range selects on; tables not listed are exported whole.
TIME_COLUMNS = {
    "flow_records": "interval_start",
    "int_hop_records": "time",
    "int_flow_records": "time",
    "int_queue_records": "time",
    "int_drop_records": "time",
    "probe_records": "sent",
    "node_samples": "time",
    "detections": "window_end",
    "actions": "time",
    "action_results": "time",
    "dead_letters": "time",
}
# Set by the store on arrival; not part of a dataset.
_LOCAL_COLUMNS = {"ingested_at"}


class BundleError(ValueError):
    """A bundle that cannot be written or read; the message says exactly what is wrong."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Scenario(_Strict):
    """How the data was recorded: enough to judge and reproduce it."""

    synthetic: bool
    source: str = Field(min_length=1, description="who recorded it, or the upstream dataset")
    licence: str = Field(min_length=1, description="SPDX id or licence name of the data")
    software_versions: dict[str, str] = Field(default_factory=dict)
    topology: str = ""
    hardware: str = ""
    traffic_pattern: str = ""
    fault_schedule: list[str] = Field(default_factory=list)
    timestamp_source: str = Field(min_length=1, description="e.g. XDP bpf_ktime, switch clock")
    timestamp_resolution_ns: int = Field(ge=1)
    clock_sync: str = Field(min_length=1, description="e.g. PTP, NTP, none (single clock)")
    notes: str = ""


def _inside_bundle(name: str) -> str:
    # A bundle is a folder someone else made: its files name paths inside it, nothing else.
    path = PurePosixPath(name.replace("\\", "/"))
    if not name:
        raise ValueError("empty file name")
    if path.is_absolute() or PureWindowsPath(name).drive:
        raise ValueError(f"{name!r} is not a path inside the bundle folder (absolute)")
    if ".." in path.parts:
        raise ValueError(f"{name!r} is not a path inside the bundle folder (it climbs out with ..)")
    return name


class TableFile(_Strict):
    file: Annotated[str, AfterValidator(_inside_bundle)]
    rows: int = Field(ge=0)
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    columns: list[tuple[str, str]]


class Manifest(_Strict):
    format: Literal["cgloop-dataset"] = FORMAT
    format_version: int = FORMAT_VERSION
    name: str = Field(min_length=1, pattern=r"^[a-z0-9][a-z0-9._-]*$")
    description: str = ""
    created_at: datetime
    schema_version: int = Field(ge=1, description="highest store migration applied")
    time_start: datetime | None = None
    time_end: datetime | None = None
    scenario: Scenario
    tables: dict[str, TableFile]


def schema_version(client: Client) -> int:
    rows = client.query("SELECT max(version) FROM cgloop_meta.schema_migrations").result_rows
    return int(rows[0][0] or 0)


def table_columns(client: Client, table: str) -> list[tuple[str, str]]:
    rows = client.query(
        "SELECT name, type FROM system.columns WHERE database = {d:String} AND table = {t:String}"
        " ORDER BY position",
        parameters={"d": DATABASE, "t": table},
    ).result_rows
    return [(n, t) for n, t in rows if n not in _LOCAL_COLUMNS]


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def export(
    client: Client,
    out: Path,
    name: str,
    tables: list[str],
    scenario: Scenario,
    start: datetime | None = None,
    end: datetime | None = None,
    description: str = "",
) -> Manifest:
    """Write `tables` (rows in [start, end) of their event time) and the manifest to `out`."""
    out.mkdir(parents=True, exist_ok=True)
    files: dict[str, TableFile] = {}
    for table in tables:
        columns = table_columns(client, table)
        if not columns:
            raise BundleError(f"no table {DATABASE}.{table} in the store")
        where, params = [], {}
        time_col = TIME_COLUMNS.get(table)
        if time_col and start:
            where.append(f"{time_col} >= {{start:DateTime64(9, 'UTC')}}")
            params["start"] = start
        if time_col and end:
            where.append(f"{time_col} < {{end:DateTime64(9, 'UTC')}}")
            params["end"] = end
        names = ", ".join(f"`{n}`" for n, _ in columns)
        order = ", ".join(f"`{n}`" for n, _ in columns[:4])
        sql = f"SELECT {names} FROM {DATABASE}.{table} FINAL"
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += f" ORDER BY {order}"
        data = client.query_arrow(sql, parameters=params, use_strings=False)
        path = out / f"{table}.parquet"
        pq.write_table(data, path, compression="zstd")
        files[table] = TableFile(
            file=path.name, rows=data.num_rows, sha256=_sha256(path), columns=columns
        )
    manifest = Manifest(
        name=name,
        description=description,
        created_at=datetime.now(UTC),
        schema_version=schema_version(client),
        time_start=start,
        time_end=end,
        scenario=scenario,
        tables=files,
    )
    (out / MANIFEST).write_text(manifest.model_dump_json(indent=2) + "\n")
    return manifest


def table_path(bundle: Path, table: str, entry: TableFile) -> Path:
    """The file of a manifest entry, refused when it resolves (symlinks included) outside the
    bundle folder."""
    path = bundle / entry.file
    root = bundle.resolve()
    if not path.resolve().is_relative_to(root):
        raise BundleError(
            f"{bundle}: tables.{table}.file {entry.file!r} resolves to {path.resolve()}, outside "
            "the bundle folder"
        )
    return path


def read_manifest(bundle: Path) -> Manifest:
    path = bundle / MANIFEST
    if not path.is_file():
        raise BundleError(f"{bundle}: no {MANIFEST} (is this a dataset bundle?)")
    try:
        raw = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise BundleError(f"{path}: not JSON: {exc}") from None
    if isinstance(raw, dict) and raw.get("format") not in (None, FORMAT):
        raise BundleError(f"{path}: format is {raw.get('format')!r}, expected {FORMAT!r}")
    if isinstance(raw, dict) and raw.get("format_version", FORMAT_VERSION) != FORMAT_VERSION:
        raise BundleError(
            f"{path}: format_version {raw.get('format_version')} is not readable "
            f"(this build reads {FORMAT_VERSION})"
        )
    try:
        manifest = Manifest.model_validate(raw)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or '(top)'}: {e['msg']}" for e in exc.errors()
        )
        raise BundleError(f"{path}: invalid manifest: {problems}") from None
    for table, entry in manifest.tables.items():
        table_path(bundle, table, entry)  # before anything reads a file or asks the store
    return manifest


def verify(bundle: Path, manifest: Manifest, client: Client) -> None:
    """Every check an import makes before writing anything; raises BundleError naming the first
    problem."""
    store_version = schema_version(client)
    if manifest.schema_version > store_version:
        raise BundleError(
            f"{bundle}: made by store schema version {manifest.schema_version}, this store is at "
            f"{store_version}: migrate the store first (`cgloop store migrate`)"
        )
    for table, entry in manifest.tables.items():
        path = table_path(bundle, table, entry)
        if not path.is_file():
            raise BundleError(f"{bundle}: {table}: file {entry.file} is missing")
        digest = _sha256(path)
        if digest != entry.sha256:
            raise BundleError(
                f"{path}: sha256 {digest[:12]}… does not match the manifest's "
                f"{entry.sha256[:12]}… (file changed or truncated)"
            )
        have = table_columns(client, table)
        if not have:
            raise BundleError(f"{bundle}: {table}: no such table in the store")
        if [tuple(c) for c in entry.columns] != have:
            want = dict(entry.columns)
            got = dict(have)
            diffs = [
                f"{n}: bundle {want.get(n, 'absent')}, store {got.get(n, 'absent')}"
                for n in dict.fromkeys([*want, *got])
                if want.get(n) != got.get(n)
            ]
            raise BundleError(
                f"{bundle}: {table}: columns differ from the store's (schema version "
                f"{manifest.schema_version} vs {store_version}): {'; '.join(diffs) or 'order'}"
            )
        rows = pq.read_metadata(path).num_rows
        if rows != entry.rows:
            raise BundleError(f"{path}: {rows} rows, the manifest says {entry.rows}")


def import_bundle(client: Client, bundle: Path) -> dict[str, int]:
    """Verify, then insert every table of the bundle; return rows per table."""
    manifest = read_manifest(bundle)
    verify(bundle, manifest, client)
    written: dict[str, int] = {}
    for table, entry in manifest.tables.items():
        data: pa.Table = pq.read_table(table_path(bundle, table, entry))
        client.insert_arrow(
            f"{DATABASE}.{table}",
            data,
            settings={
                "insert_deduplication_token": f"bundle/{manifest.name}/{entry.sha256}",
                "deduplicate_blocks_in_dependent_materialized_views": 1,
                "max_insert_block_size": max(entry.rows, 1),
                "min_insert_block_size_rows": 0,
                "min_insert_block_size_bytes": 0,
            },
        )
        written[table] = data.num_rows
    close_minutes(client)  # the imported minutes are closed: finalise their quantiles once
    return written
