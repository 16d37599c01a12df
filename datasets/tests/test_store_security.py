"""The store's HTTP endpoint is read-only for real, and no client can stall or reconfigure it
for the others (issue 17, findings 1 and 2: each test reproduces one report)."""

from __future__ import annotations

import functools
import shutil
import threading
import time
import tracemalloc
import uuid
import zlib
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from cgloop.datasets.store.limits import BodyTooLarge, inflate
from cgloop.datasets.store.migrations import default_migrations_dir
from cgloop.testing import StoreServer, free_port

FIRST_MIGRATION = "0001_cgloop_database.sql"
SECRET = "-----BEGIN PRIVATE KEY----- not-really-a-ca-key"


def post(url: str, sql: str, **params: str) -> httpx.Response:
    return httpx.post(url, content=sql, params=params, timeout=30)


def assert_refused(reply: httpx.Response, *codes: int) -> None:
    assert reply.status_code == 403, reply.text
    code = int(reply.headers["X-ClickHouse-Exception-Code"])
    assert code in codes and reply.text.startswith(f"Code: {code}. DB::Exception"), reply.text


class TightStore(StoreServer):
    """`cgloop store serve` on a fresh folder, its limits set by the environment as an
    operator would, with only the first migration (the whole schema would take most of the
    start-up time and none of these tests reads it)."""

    def __init__(self, folder: Path, env: dict[str, str]) -> None:
        migrations = folder / "migrations"
        migrations.mkdir(parents=True)
        shutil.copy(default_migrations_dir() / FIRST_MIGRATION, migrations)
        super().__init__(
            folder / "store", free_port(), ("--migrations", str(migrations)), env=env
        )


@pytest.fixture(scope="module")
def tight_store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TightStore]:
    limits = {
        "CGLOOP_STORE_MAX_EXECUTION_TIME": "2",
        "CGLOOP_STORE_MAX_RESULT_ROWS": "5",
        "CGLOOP_STORE_MAX_CONCURRENT_QUERIES": "1",
    }
    server = TightStore(tmp_path_factory.mktemp("tight"), limits)
    yield server
    server.stop()


@pytest.fixture
def ca_key(tmp_path: Path) -> Path:
    key = tmp_path / "ca.key"
    key.write_text(SECRET + "\n")
    return key


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT * FROM file('/etc/passwd', 'LineAsString')",
        "SELECT * FROM file('{key}', 'RawBLOB')",
        "SELECT file('{key}')",  # the scalar function, which readonly does not stop
        "DESC file('{key}', 'CSVWithNames')",  # schema inference would read the first line
        "SELECT * FROM view(SELECT * FROM file('{key}', 'RawBLOB'))",
    ],
)
def test_files_are_not_read(store_server, ca_key: Path, sql: str) -> None:
    reply = post(store_server.url, sql.format(key=ca_key))
    assert_refused(reply, 164, 497)
    assert "not-really" not in reply.text and "root:" not in reply.text


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT 'x' INTO OUTFILE '{out}' TRUNCATE FORMAT TSV",
        "SELECT 'x' INTO OUTFILE '{out}' AND STDOUT",
        "EXPLAIN SELECT 1 INTO OUTFILE '{out}'",
    ],
)
def test_into_outfile_is_refused_and_writes_nothing(store_server, tmp_path: Path, sql) -> None:
    out = tmp_path / "v"
    assert_refused(post(store_server.url, sql.format(out=out)), 497)
    assert not out.exists()


def test_insert_into_function_file_is_refused(store_server, tmp_path: Path) -> None:
    out = tmp_path / "w.tsv"
    sql = f"INSERT INTO FUNCTION file('{out}', 'TSV', 'x UInt8') VALUES (1)"
    assert_refused(post(store_server.url, sql), 164)
    assert not out.exists()


@pytest.mark.parametrize(
    "sql", ["SYSTEM STOP MERGES", "KILL QUERY WHERE 1", "BACKUP DATABASE x TO Disk('default', 'b')"]
)
def test_system_and_other_non_reads_are_refused(store_server, sql: str) -> None:
    assert_refused(post(store_server.url, sql), 164)


def test_a_second_statement_is_never_run(store_server) -> None:
    reply = post(store_server.url, "SELECT 1; SYSTEM STOP MERGES")
    assert reply.status_code == 400 and reply.headers["X-ClickHouse-Exception-Code"] == "62"
    assert "Multi-statements are not allowed" in reply.text


def test_temporary_tables_are_refused(store_server) -> None:
    assert_refused(post(store_server.url, "CREATE TEMPORARY TABLE t (a UInt8)"), 164)
    assert_refused(post(store_server.url, "CREATE TEMPORARY TABLE t AS SELECT 1"), 164)


def test_a_setting_from_one_request_does_not_reach_the_next(store_server) -> None:
    assert_refused(post(store_server.url, "SET max_result_rows = 1"), 164)
    assert_refused(post(store_server.url, "USE system"), 164)
    # Nor can a query raise a limit for itself: settings are fixed before readonly=1.
    assert_refused(post(store_server.url, "SELECT 1 SETTINGS max_execution_time = 0"), 164)
    reply = post(store_server.url, "SELECT number FROM numbers(3)")
    assert reply.status_code == 200 and reply.text == "0\n1\n2\n", reply.text
    reply = post(store_server.url, "SELECT currentDatabase(), getSetting('readonly')")
    assert reply.text == "default\t1\n"


def test_url_to_the_store_itself_is_refused_at_once(store_server) -> None:
    # Before: the store fetched its own URL while holding the lock that URL waits for.
    sql = f"SELECT * FROM url('{store_server.url}/?query=SELECT+42', 'TSV', 'x UInt8')"
    assert_refused(post(store_server.url, sql), 164, 497)
    assert post(store_server.url, "SELECT 1").text == "1\n"


def test_a_slow_query_does_not_hold_up_another(store_server) -> None:
    marker = uuid.uuid4().hex
    slow_sql = f"SELECT sleep(3), '{marker}'"
    slow: list[httpx.Response] = []
    thread = threading.Thread(target=lambda: slow.append(post(store_server.url, slow_sql)))
    thread.start()
    try:
        # Another client's query is answered while the slow one still runs: it sees it in
        # system.processes. (Before, it queued behind it and then found it gone.)
        seen = False
        for _ in range(200):
            reply = post(
                store_server.url,
                "SELECT count() FROM system.processes WHERE startsWith(query, {q:String})",
                param_q=slow_sql,
            )
            assert reply.status_code == 200, reply.text
            if reply.text == "1\n":
                seen = thread.is_alive()
                break
            if not thread.is_alive():
                break
            time.sleep(0.02)
        assert seen, "no query was answered while the slow one ran"
    finally:
        thread.join(30)
    assert slow[0].status_code == 200 and slow[0].text.endswith(f"\t{marker}\n")


@functools.cache
def _bomb(inflated: int) -> bytes:
    packer = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    chunk = b" " * (1 << 20)
    return b"".join(packer.compress(chunk) for _ in range(inflated >> 20)) + packer.flush()


def test_a_gzip_bomb_is_refused_after_decompression_not_before(store_server) -> None:
    body = _bomb(64 << 20)
    assert len(body) < 1 << 20  # under the body limit as sent
    reply = httpx.post(
        store_server.url, content=body, headers={"Content-Encoding": "gzip"}, timeout=30
    )
    assert reply.status_code == 413, reply.text
    assert "inflates to more than 1048576 bytes" in reply.text
    assert post(store_server.url, "SELECT 1").text == "1\n"


def test_the_inflater_stops_at_the_limit() -> None:
    body = _bomb(64 << 20)
    tracemalloc.start()
    try:
        with pytest.raises(BodyTooLarge):
            inflate(body, "gzip", 1 << 20)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 8 << 20  # a few MiB of working memory, never the 64 MiB


def test_the_inflater_decodes_what_clients_send() -> None:
    sql = b"SELECT 1"
    gz = zlib.compressobj(6, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    member = gz.compress(sql) + gz.flush()
    assert inflate(member + member, "gzip", 100) == sql + sql  # several gzip members
    assert inflate(zlib.compress(sql), "deflate", 100) == sql
    assert inflate(sql, "", 100) == sql
    with pytest.raises(BodyTooLarge):
        inflate(sql, "identity", 4)
    with pytest.raises(zlib.error):
        inflate(member[:-3], "gzip", 100)
    with pytest.raises(ValueError, match="not supported"):
        inflate(sql, "br", 100)


def test_the_time_limit_is_enforced_and_cannot_be_raised(tight_store) -> None:
    reply = post(tight_store.url, "SELECT sleep(3)")
    assert reply.headers["X-ClickHouse-Exception-Code"] == "159", reply.text  # TIMEOUT_EXCEEDED
    assert_refused(post(tight_store.url, "SELECT sleep(3) SETTINGS max_execution_time = 10"), 164)
    reply = post(tight_store.url, "SELECT number FROM numbers(10)")
    assert reply.headers["X-ClickHouse-Exception-Code"] == "396", reply.text  # result rows
    reply = post(tight_store.url, "SELECT getSetting('max_execution_time'), 1")
    assert reply.text == "2\t1\n"


def test_queries_beyond_the_concurrency_limit_are_refused_not_queued(tight_store) -> None:
    # The tight store runs one query at a time: while one sleeps, another is turned away at
    # once (503, code 202) rather than waiting behind it. On a busy machine a probe can take
    # the slot first and the slow query is the one turned away: then the round is played again.
    refused = None
    for _ in range(5):
        slow: list[httpx.Response] = []
        thread = threading.Thread(
            target=lambda out=slow: out.append(post(tight_store.url, "SELECT sleep(3)"))
        )
        thread.start()
        try:
            time.sleep(0.2)  # let the slow query reach the slot first
            while thread.is_alive() and refused is None:
                reply = post(tight_store.url, "SELECT 1")
                if reply.status_code == 503:
                    refused = reply
                time.sleep(0.02)
        finally:
            thread.join(30)
        if refused is not None:
            break
        assert slow and slow[0].status_code == 503, (
            "the slow query held the slot, yet no query beside it was refused"
        )
    assert refused is not None, "no query was refused while the slot was taken"
    assert refused.headers["X-ClickHouse-Exception-Code"] == "202", refused.text
    assert post(tight_store.url, "SELECT 1").text == "1\n"


def test_the_writer_stays_unrestricted_beside_the_endpoint(tight_store) -> None:
    # The migration ran through the writer of the same process, after the readers' limits.
    reply = post(tight_store.url, "SELECT name FROM cgloop_meta.schema_migrations")
    assert reply.text == f"{FIRST_MIGRATION}\n", reply.text
    assert post(tight_store.url, "EXISTS DATABASE cgloop").text == "1\n"
