"""`cgloop store serve` serves its /metrics (queries by outcome, their duration, refusals by
error code) at --metrics-addr; a port already taken is one log line and the store still
answers."""

from __future__ import annotations

import socket

import httpx
from cgloop.testing import StoreServer, free_port, scrape_metrics


def test_queries_refusals_and_duration_are_served(tmp_path) -> None:
    metrics_port = free_port()
    server = StoreServer(
        tmp_path / "data", free_port(), args=("--metrics-addr", f"127.0.0.1:{metrics_port}")
    )
    try:
        assert httpx.get(server.url, params={"query": "SELECT 1"}).status_code == 200
        refused = httpx.post(server.url, content="INSERT INTO flow_ingest VALUES (1)")
        assert refused.status_code >= 400
        code = refused.headers["X-ClickHouse-Exception-Code"]
        got = scrape_metrics(f"127.0.0.1:{metrics_port}")
    finally:
        server.stop()
    assert got["cgloop_store_queries_total"][(("outcome", "ok"),)] >= 1
    assert got["cgloop_store_queries_total"][(("outcome", "refused"),)] == 1
    assert got["cgloop_store_refusals_total"] == {(("code", code),): 1.0}
    assert got["cgloop_store_query_duration_seconds_count"][()] >= 2
    assert got["cgloop_daemon"] == {(("daemon", "store"),): 1.0}


def test_a_metrics_port_in_use_does_not_stop_the_store(tmp_path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        server = StoreServer(
            tmp_path / "data", free_port(), env={"CGLOOP_STORE_METRICS_ADDR": f"127.0.0.1:{port}"}
        )
        try:
            assert httpx.get(server.url, params={"query": "SELECT 1"}).text == "1\n"
        finally:
            server.stop()
        output = server.proc.stdout.read()
    assert f"metrics: cannot listen on 127.0.0.1:{port}" in output
    assert "CGLOOP_STORE_METRICS_ADDR" in output
