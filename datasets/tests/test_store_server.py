"""The store server speaks ClickHouse's HTTP interface, read-only, while it owns the store."""

from __future__ import annotations

import gzip

import clickhouse_connect
import httpx
import pytest
from clickhouse_connect.driver.exceptions import DatabaseError


def test_ping_and_plain_query(store_server) -> None:
    assert httpx.get(f"{store_server.url}/ping").text == "Ok.\n"
    reply = httpx.get(store_server.url, params={"query": "SELECT 1, 'a'"})
    assert reply.status_code == 200
    assert reply.text == "1\ta\n"  # ClickHouse's default HTTP format is TabSeparated
    assert reply.headers["X-ClickHouse-Format"] == "TabSeparated"
    assert "read_rows" in reply.headers["X-ClickHouse-Summary"]


def test_formats_parameters_and_database(store_server) -> None:
    reply = httpx.post(
        store_server.url,
        params={"default_format": "JSONEachRow", "param_n": "3", "database": "cgloop_meta"},
        content="SELECT number FROM numbers({n:UInt8}) WHERE currentDatabase() = 'cgloop_meta'",
    )
    assert reply.status_code == 200, reply.text
    assert reply.text.splitlines() == ['{"number":0}', '{"number":1}', '{"number":2}']


def test_gzip_body(store_server) -> None:
    reply = httpx.post(
        store_server.url,
        content=gzip.compress(b"SELECT 40 + 2"),
        headers={"Content-Encoding": "gzip"},
    )
    assert reply.text == "42\n"


@pytest.mark.parametrize(
    ("sql", "status", "code"),
    [
        ("CREATE TABLE t (a UInt8) ENGINE = Memory", 403, "164"),
        ("DROP DATABASE cgloop_meta", 403, "164"),
        ("INSERT INTO cgloop_meta.schema_migrations (version) VALUES (99)", 403, "164"),
        ("SELEC 1", 400, "62"),
        ("SELECT * FROM no_such_table", 404, "60"),
    ],
)
def test_errors_carry_clickhouse_codes_and_writes_are_refused(
    store_server, sql, status, code
) -> None:
    reply = httpx.post(store_server.url, content=sql)
    assert reply.status_code == status, reply.text
    assert reply.headers["X-ClickHouse-Exception-Code"] == code
    assert reply.text.startswith(f"Code: {code}.")


def test_bad_requests_are_refused_with_a_reason(store_server) -> None:
    assert "empty query" in httpx.post(store_server.url, content=b"").text
    assert "UTF-8" in httpx.post(store_server.url, content=b"SELECT '\xff'").text
    assert httpx.get(f"{store_server.url}/nope?query=SELECT+1").status_code == 404
    bad_gzip = httpx.post(
        store_server.url, content=b"not gzip", headers={"Content-Encoding": "gzip"}
    )
    assert bad_gzip.status_code == 400 and "decompress" in bad_gzip.text
    # The server is still fine after all of that.
    assert httpx.get(store_server.url, params={"query": "SELECT 7"}).text == "7\n"


def test_clickhouse_connect_reads_over_http(store_server) -> None:
    client = clickhouse_connect.get_client(dsn=store_server.url)
    assert client.query("SELECT {x:String}", parameters={"x": "hello"}).result_rows == [("hello",)]
    applied = client.query(
        "SELECT name FROM cgloop_meta.schema_migrations ORDER BY version"
    ).result_rows
    assert applied[0] == ("0001_cgloop_database.sql",)
    assert client.query_arrow("SELECT number FROM numbers(4)").num_rows == 4
    assert list(client.query_df("SELECT 1 AS a, 'x' AS b").columns) == ["a", "b"]
    with pytest.raises(DatabaseError, match="164"):
        client.command("CREATE DATABASE intruder")
