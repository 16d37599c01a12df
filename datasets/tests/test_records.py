"""The ingest tables match the protobuf descriptors; the inline schema ClickHouse reads is
complete; the CLI reports what a new proto field needs."""

from __future__ import annotations

import re

import clickhouse_connect
from cgloop.datasets.commands import schema_diff
from cgloop.datasets.records import KINDS, format_schema, ingest_columns
from cgloop.datasets.store.migrations import default_migrations_dir


def _ingest_ddl() -> dict[str, list[tuple[str, str]]]:
    text = (default_migrations_dir() / "0002_ingest_tables.sql").read_text()
    tables = {}
    for m in re.finditer(
        r"CREATE TABLE IF NOT EXISTS cgloop\.(\w+) \((.*?)\n\) ENGINE", text, re.S
    ):
        cols = [line.strip().rstrip(",") for line in m.group(2).strip().splitlines()]
        tables[m.group(1)] = [tuple(c.split(" ", 1)) for c in cols]
    return tables


def test_ingest_tables_are_the_flattened_descriptors_they_were_made_from() -> None:
    ddl = _ingest_ddl()
    assert set(ddl) == {k.ingest_table for k in KINDS.values()}
    for kind in KINDS.values():
        derived = dict(ingest_columns(kind.row_descriptor))
        for name, ch_type in ddl[kind.ingest_table]:
            # A field may be added to a .proto later (add-only); never renamed or retyped. A
            # field added to a nested message extends its tuple at the end (a later migration
            # modifies the column, e.g. 0008 for IntHop).
            got = derived.get(name)
            nested_add = ch_type.endswith("))") and (got or "").startswith(ch_type[:-2] + ", ")
            assert got == ch_type or nested_add, (kind.ingest_table, name)


def test_inline_schema_declares_every_row_message_and_the_oneofs() -> None:
    schema = format_schema()
    for kind in KINDS.values():
        assert f"message {kind.row_descriptor.name} {{" in schema
    assert "oneof record {" in schema and "oneof event {" in schema
    assert "map<string, string> labels = 11;" in schema
    assert "optional double power_watts = 5;" in schema


def test_schema_diff_reports_every_field_on_an_empty_store_and_nothing_on_a_migrated_one(
    run_cgloop, tmp_path, bundle_store
) -> None:
    result = run_cgloop("store", "schema-diff", "--path", str(tmp_path / "s"))
    # A fresh folder has no tables yet: every field is reported, as ALTER statements.
    assert result.returncode == 1 and "ALTER TABLE cgloop.flow_ingest ADD COLUMN" in result.stdout
    # The bundle store ran every migration (the command's function, on the same client kind).
    assert schema_diff(clickhouse_connect.get_client(dsn=bundle_store.url)) == []
