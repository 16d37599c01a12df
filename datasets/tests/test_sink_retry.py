"""The sink's store retries: a failing store write is retried until it succeeds, the wait
doubling from `retry_backoff_s` up to `retry_backoff_max_s`, each failure counted on
`cgloop_sink_store_errors`; a batch the store cannot decode is not retried."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from cgloop.datasets.sink import consumer
from cgloop.datasets.sink.consumer import Sink, SinkConfig
from cgloop.datasets.sink.metrics import SinkMetrics
from cgloop.datasets.sink.writer import StoreWriteError


def _sink(backoff: float, backoff_max: float) -> SimpleNamespace:
    """What `_retrying` uses of a Sink: its config and metrics (no Kafka needed)."""
    config = SinkConfig.model_construct(retry_backoff_s=backoff, retry_backoff_max_s=backoff_max)
    return SimpleNamespace(config=config, metrics=SinkMetrics())


def _errors(sink: SimpleNamespace) -> float:
    return sink.metrics.registry.get_sample_value("cgloop_sink_store_errors_total") or 0.0


def test_a_failing_write_is_retried_with_doubling_waits(monkeypatch, caplog):
    waits: list[float] = []
    monkeypatch.setattr(consumer.time, "sleep", waits.append)
    sink = _sink(0.5, 3.0)
    calls = iter([ConnectionError("store away")] * 5 + [StoreWriteError("busy"), 42])

    def action() -> int:
        step = next(calls)
        if isinstance(step, Exception):
            raise step
        return step

    assert Sink._retrying(sink, action, "insert") == 42
    assert waits == [0.5, 1.0, 2.0, 3.0, 3.0, 3.0]
    assert _errors(sink) == 6
    assert "store insert failed, retrying in 0.5s: store away" in caplog.text


def test_an_undecodable_batch_is_raised_not_retried(monkeypatch):
    waits: list[float] = []
    monkeypatch.setattr(consumer.time, "sleep", waits.append)
    sink = _sink(0.5, 3.0)

    def action() -> int:
        raise StoreWriteError("Code: 27. Cannot parse input")

    with pytest.raises(consumer._Undecodable, match="Code: 27"):
        Sink._retrying(sink, action, "insert", decode_ok=False)
    assert waits == [] and _errors(sink) == 0


def test_an_interrupt_is_not_retried(monkeypatch):
    monkeypatch.setattr(consumer.time, "sleep", lambda s: None)
    sink = _sink(0.5, 3.0)

    def action() -> int:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        Sink._retrying(sink, action, "insert")
