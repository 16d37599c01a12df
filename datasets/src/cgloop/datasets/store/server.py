"""The store server: owns the chDB data folder and answers read-only SQL over HTTP.

chDB lets one process open a data folder, so the process that owns the store (and later writes
into it) also serves everyone else's queries. It speaks the subset of ClickHouse's HTTP
interface that clients use (`/ping`, `query`/`database`/`default_format`/`param_*` parameters,
`X-ClickHouse-*` headers, `Code: N. DB::Exception` errors), so `clickhouse-connect`, `curl`
and `cgloop query` work against it exactly as against a ClickHouse server.

Each HTTP query runs on its own reader connection (its own session: no `SET`, `USE` or
temporary table outlives it, and no query waits for another's), opened with the limits of
`limits.QueryLimits` and then `readonly=1`, which refuses writes, DDL, setting changes and the
table functions that reach outside; `guard` refuses what chDB lets through `readonly=1`
(several statements, SYSTEM/KILL/…, INTO OUTFILE, file()). The writer client, for migrations
and the sink, stays unrestricted. docs/datasets.md has the whole security model.
"""

from __future__ import annotations

import json
import logging
import re
import signal
import threading
import time
import uuid
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlencode, urlsplit

import chdb
import clickhouse_connect
from cgloop.contracts.ops import Daemon
from cgloop.datasets.store import guard
from cgloop.datasets.store.limits import BodyTooLarge, QueryLimits, inflate
from cgloop.datasets.store.migrations import migrate
from cgloop.metrics import daemon_info, histogram
from clickhouse_connect.driver.client import Client
from prometheus_client import CollectorRegistry, Counter

log = logging.getLogger(__name__)

# Content types ClickHouse sends for common formats (others are sent as octet-stream).
_CONTENT_TYPES = {
    "TabSeparated": "text/tab-separated-values; charset=UTF-8",
    "TSV": "text/tab-separated-values; charset=UTF-8",
    "TabSeparatedWithNames": "text/tab-separated-values; charset=UTF-8",
    "TSVWithNames": "text/tab-separated-values; charset=UTF-8",
    "CSV": "text/csv; charset=UTF-8; header=absent",
    "CSVWithNames": "text/csv; charset=UTF-8; header=present",
    "JSON": "application/json; charset=UTF-8",
    "JSONEachRow": "application/x-ndjson; charset=UTF-8",
    "JSONCompact": "application/json; charset=UTF-8",
    "Pretty": "text/plain; charset=UTF-8",
}
# HTTP status per ClickHouse error code, as the ClickHouse server maps them.
_STATUS_BY_CODE = {
    62: HTTPStatus.BAD_REQUEST,  # SYNTAX_ERROR
    47: HTTPStatus.NOT_FOUND,  # UNKNOWN_IDENTIFIER
    60: HTTPStatus.NOT_FOUND,  # UNKNOWN_TABLE
    81: HTTPStatus.NOT_FOUND,  # UNKNOWN_DATABASE
    164: HTTPStatus.FORBIDDEN,  # READONLY
    202: HTTPStatus.SERVICE_UNAVAILABLE,  # TOO_MANY_SIMULTANEOUS_QUERIES
    497: HTTPStatus.FORBIDDEN,  # ACCESS_DENIED
    456: HTTPStatus.BAD_REQUEST,  # UNKNOWN_QUERY_PARAMETER
}
_CODE = re.compile(r"Code: (\d+)\.")
# URL parameters that steer the transport, not the query; other settings are ignored (a
# read-only endpoint does not take per-request engine settings).
_TRANSPORT = {
    "query",
    "database",
    "default_format",
    "query_id",
    "session_id",
    "session_timeout",
    "session_check",
    "compress",
    "decompress",
    "user",
    "password",
    "quota_key",
    "wait_end_of_query",
    "enable_http_compression",
    "buffer_size",
}


@dataclass
class QueryOutput:
    body: bytes
    rows_read: int
    bytes_read: int
    elapsed_s: float


class QueryFailed(Exception):
    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


class Store:
    """The chDB data folder, opened once: a writer client, and a reader connection per query."""

    def __init__(self, path: Path, limits: QueryLimits | None = None) -> None:
        self.path = path.resolve()
        self.path.mkdir(parents=True, exist_ok=True)
        self.limits = limits or QueryLimits()
        # Writer: the same client library that talks to a ClickHouse server in deployment.
        self.client: Client = clickhouse_connect.get_client(dsn=f"chdb://{self.path}")
        # A reader's connection string: the folder and its session settings, readonly=1 last.
        self._reader_dsn = f"{self.path}?{urlencode(self.limits.reader_settings())}"
        # The guard's: read-only and timed, without the result limits (a query's syntax tree
        # has a row per node, and must not fail where the query itself would not).
        self._parser_dsn = f"{self.path}?{urlencode(self.limits.parser_settings())}"
        # Any number of connections to the open folder coexist and run queries in parallel;
        # the bound only keeps a flood of queries from taking all memory and threads.
        self._slots = threading.BoundedSemaphore(self.limits.max_concurrent_queries)
        self._closed = False
        self.timezone = self.read("SELECT timezone()", "TSVRaw").body.decode().strip()

    def migrate(self, directory: Path | None = None) -> list[str]:
        return migrate(self.client, directory)

    def read(
        self, sql: str, fmt: str, database: str | None = None, params: dict[str, str] | None = None
    ) -> QueryOutput:
        """Run one read-only statement in a session of its own; raise QueryFailed."""
        if not self._slots.acquire(blocking=False):
            raise QueryFailed(
                202,
                f"Code: 202. DB::Exception: Too many simultaneous queries. Maximum: "
                f"{self.limits.max_concurrent_queries}. (TOO_MANY_SIMULTANEOUS_QUERIES)",
            )
        try:
            if self._closed:
                raise QueryFailed(1000, "the store is closing")
            parser = chdb.connect(self._parser_dsn)
            try:
                guard.check(parser, sql, params)
            finally:
                parser.close()
            reader = chdb.connect(self._reader_dsn)
            try:
                reader.query(f"USE `{(database or 'default').replace('`', '``')}`")
                start = time.perf_counter()
                result = reader.query(sql, fmt, params=params or None)
                elapsed = time.perf_counter() - start
                return QueryOutput(result.bytes(), result.rows_read(), result.bytes_read(), elapsed)
            finally:
                reader.close()
        except guard.Refused as exc:
            name = "READONLY" if exc.code == guard.READONLY else "ACCESS_DENIED"
            raise QueryFailed(
                exc.code, f"Code: {exc.code}. DB::Exception: {exc}. ({name})"
            ) from None
        except QueryFailed:
            raise
        except Exception as exc:  # chDB raises its own error type with ClickHouse's text
            text = str(exc)
            match = _CODE.search(text)
            raise QueryFailed(int(match.group(1)) if match else 1000, text) from None
        finally:
            self._slots.release()

    def close(self) -> None:
        self._closed = True
        self.client.close()


class StoreMetrics:
    """The store server's /metrics: queries by outcome, their duration, refusals by the
    ClickHouse error code they answered with. `registry` is the one the daemon serves (the
    embedded sink adds its series to it)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = r = registry or CollectorRegistry()
        daemon_info(r, Daemon.DAEMON_STORE)
        self.queries = Counter(
            "cgloop_store_queries",
            "queries answered, by outcome (ok; refused: bad or forbidden input, limits; "
            "failed: the store's own error)",
            ["outcome"],
            registry=r,
        )
        self.refusals = Counter(
            "cgloop_store_refusals",
            "queries refused, by the ClickHouse error code sent back",
            ["code"],
            registry=r,
        )
        self.duration = histogram(
            r, "cgloop_store_query_duration_seconds", "from request to answer, refused ones too"
        )


class _Handler(BaseHTTPRequestHandler):
    server: StoreHTTPServer
    protocol_version = "HTTP/1.1"
    server_version = "cgloop-store"

    def log_message(self, format: str, *args: object) -> None:
        log.debug("%s " + format, self.address_string(), *args)

    def _send(self, status: int, body: bytes, headers: dict[str, str]) -> None:
        self.send_response(status)
        for name, value in headers.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _error(self, status: int, code: int, message: str) -> None:
        metrics = self.server.metrics
        if status < 500:
            metrics.queries.labels("refused").inc()
            metrics.refusals.labels(str(code)).inc()
        else:
            metrics.queries.labels("failed").inc()
        text = message if message.startswith("Code:") else f"Code: {code}. DB::Exception: {message}"
        self._send(
            status,
            (text.rstrip() + "\n").encode(),
            {"Content-Type": "text/plain; charset=UTF-8", "X-ClickHouse-Exception-Code": str(code)},
        )

    def do_GET(self) -> None:
        if urlsplit(self.path).path in ("/", "/ping") and not urlsplit(self.path).query:
            return self._send(HTTPStatus.OK, b"Ok.\n", {"Content-Type": "text/html; charset=UTF-8"})
        self._handle(b"")

    def do_POST(self) -> None:
        limit = self.server.store.limits.max_body_bytes
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            return self._error(HTTPStatus.BAD_REQUEST, 1000, "Content-Length is not a number")
        if length > limit:
            self.close_connection = True
            return self._error(
                HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
                1000,
                f"query body of {length} bytes exceeds {limit}",
            )
        body = self.rfile.read(length)
        encoding = (self.headers.get("Content-Encoding") or "").lower()
        try:
            # The limit holds for the decompressed body, enforced while inflating.
            body = inflate(body, encoding, limit)
        except BodyTooLarge as exc:
            return self._error(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, 1000, str(exc))
        except zlib.error as exc:
            return self._error(HTTPStatus.BAD_REQUEST, 1000, f"cannot decompress body: {exc}")
        except ValueError as exc:
            return self._error(HTTPStatus.UNSUPPORTED_MEDIA_TYPE, 1000, str(exc))
        self._handle(body)

    def _handle(self, body: bytes) -> None:
        started = time.perf_counter()
        try:
            self._answer(body)
        finally:
            self.server.metrics.duration.observe(time.perf_counter() - started)

    def _answer(self, body: bytes) -> None:
        url = urlsplit(self.path)
        if url.path != "/":
            return self._error(HTTPStatus.NOT_FOUND, 1000, f"no handler for {url.path}")
        args = {k: v[-1] for k, v in parse_qs(url.query, keep_blank_values=True).items()}
        try:
            sql = "\n".join(p for p in (args.get("query", ""), body.decode()) if p).strip()
        except UnicodeDecodeError:
            return self._error(HTTPStatus.BAD_REQUEST, 1000, "query is not valid UTF-8")
        if not sql:
            return self._error(HTTPStatus.BAD_REQUEST, 1000, "empty query")
        params = {k.removeprefix("param_"): v for k, v in args.items() if k.startswith("param_")}
        ignored = sorted(k for k in args if k not in _TRANSPORT and not k.startswith("param_"))
        if ignored:
            log.debug("ignoring settings %s", ignored)
        fmt = args.get("default_format") or "TabSeparated"
        query_id = args.get("query_id") or str(uuid.uuid4())
        try:
            out = self.server.store.read(sql, fmt, args.get("database"), params)
        except QueryFailed as exc:
            status = _STATUS_BY_CODE.get(exc.code, HTTPStatus.INTERNAL_SERVER_ERROR)
            return self._error(status, exc.code, str(exc))
        summary = {
            "read_rows": str(out.rows_read),
            "read_bytes": str(out.bytes_read),
            "written_rows": "0",
            "written_bytes": "0",
            "elapsed_ns": str(int(out.elapsed_s * 1e9)),
        }
        self.server.metrics.queries.labels("ok").inc()
        self._send(
            HTTPStatus.OK,
            out.body,
            {
                "Content-Type": _CONTENT_TYPES.get(fmt, "application/octet-stream"),
                "X-ClickHouse-Format": fmt,
                "X-ClickHouse-Query-Id": query_id,
                "X-ClickHouse-Timezone": self.server.store.timezone,
                "X-ClickHouse-Server-Display-Name": "cgloop-store",
                "X-ClickHouse-Summary": json.dumps(summary),
            },
        )


class StoreHTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(
        self, store: Store, host: str, port: int, metrics: StoreMetrics | None = None
    ) -> None:
        self.store = store
        self.metrics = metrics or StoreMetrics()
        super().__init__((host, port), _Handler)


class SinkFailed(RuntimeError):
    """The sink running inside the store process stopped with an error."""


def serve(
    path: Path,
    host: str,
    port: int,
    migrations_dir: Path | None = None,
    ready: threading.Event | None = None,
    sink: Callable[[Store, Callable[[], bool]], None] | None = None,
    metrics: StoreMetrics | None = None,
) -> None:
    """Open the store, apply pending migrations, serve until SIGTERM/SIGINT.

    With `sink`, also run it in a thread of this process (chDB lets only the owning process
    write the folder): `sink(store, should_stop)`. If the sink fails, the server stops too and
    `SinkFailed` is raised, so a supervisor sees one failed process rather than a silent half.
    """
    store = Store(path)
    try:
        applied = store.migrate(migrations_dir)
        if applied:
            log.info("applied migrations: %s", ", ".join(applied))
        httpd = StoreHTTPServer(store, host, port, metrics)
        stop = threading.Event()
        failure: list[BaseException] = []

        def _stop(*_: object) -> None:
            if not stop.is_set():
                stop.set()
                threading.Thread(target=httpd.shutdown, daemon=True).start()

        def _run_sink() -> None:
            try:
                sink(store, stop.is_set)  # type: ignore[misc]
            except BaseException as exc:
                log.exception("sink failed")
                failure.append(exc)
                _stop()

        sink_thread = threading.Thread(target=_run_sink, name="sink") if sink else None

        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, _stop)
            signal.signal(signal.SIGINT, _stop)
        log.info("store %s serving on http://%s:%d", path, host, port)
        if sink_thread:
            sink_thread.start()
        if ready:
            ready.set()
        httpd.serve_forever(poll_interval=0.2)
        httpd.server_close()
        if sink_thread:
            stop.set()
            sink_thread.join()
        if failure:
            raise SinkFailed(f"the sink stopped: {failure[0]}") from failure[0]
    finally:
        store.close()
