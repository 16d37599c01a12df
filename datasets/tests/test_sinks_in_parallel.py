"""Several sinks in one consumer group writing to one store (issue 23, "sinks in parallel").

Three sink instances of one group share the flow topic's 6 partitions on the embedded broker
and write into one store (chDB: the instances run in one process, each with its own writer
connections, as sinks on several machines each talk to their ClickHouse node). The group
rebalances four times while records keep arriving: a second and a third sink join, the third
dies right after an insert and before committing its offset (its partitions are replayed by
the others from its chunk plans, with the same tokens), and the first leaves cleanly. Every
record is then stored exactly once, in the raw table without FINAL and in both roll-ups.
"""

from __future__ import annotations

import uuid
from pathlib import Path

from cgloop.config import Settings

from .conftest import in_own_process

_SCRIPT = r"""
import json, logging, sys, threading, time
import clickhouse_connect
from cgloop.bus.kafka import BatchProducer
from cgloop.bus.topics import FLOWS
from cgloop.contracts.samples import sample_flow_record_batch
from cgloop.datasets.sink.consumer import Sink, SinkConfig
from cgloop.datasets.sink.writer import store_writers
from cgloop.datasets.store.migrations import migrate

folder, bootstrap, group, tag = sys.argv[1:5]
dsn = f"chdb://{folder}"
client = clickhouse_connect.get_client(dsn=dsn)
migrate(client)

replays = []
class Replays(logging.Handler):
    def emit(self, record):
        if "replaying" in record.getMessage():
            replays.append(record.getMessage())
logging.getLogger("cgloop.datasets.sink.consumer").addHandler(Replays())
logging.getLogger("cgloop.datasets.sink.consumer").setLevel(logging.INFO)

producer = BatchProducer(bootstrap)
def produce(lo, hi):
    for i in range(lo, hi):
        batch = sample_flow_record_batch()
        source = f"{tag}-{i % 12}"  # 12 keys over the 6 partitions
        for r in batch.records:
            r.header.source_id = source
            r.header.sequence = i + 1
        producer.send(FLOWS.name, batch, key=source)
    producer.flush()

inserts = []  # (sink, partition, first, last)
class Runner:
    def __init__(self, name, crash_after=None):
        self.name, self.crash_after, self.done = name, crash_after, 0
        self.stop = threading.Event()
        self.error = None
        config = SinkConfig(
            group_id=group, topics=[FLOWS.name], max_chunk_messages=5, max_chunk_age_s=0.3,
            close_minutes_every_s=0,
        )
        self.sink = Sink(store_writers(dsn, 2), bootstrap, config, after_insert=self.hook)
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()
    def hook(self, chunk):
        inserts.append((self.name, chunk.partition, chunk.first_offset, chunk.last_offset))
        self.done += 1
        if self.crash_after is not None and self.done >= self.crash_after:
            raise RuntimeError("crash between insert and commit")
    def run(self):
        try:
            self.sink.run(self.stop.is_set)
        except Exception as exc:
            self.error = repr(exc.__cause__ or exc)  # a writer's failure is the cause

def stored():
    return client.query(
        "SELECT count() FROM cgloop.flow_records WHERE startsWith(source_id, {t:String})",
        parameters={"t": tag},
    ).result_rows[0][0]

def wait(least, timeout_s=120):
    deadline = time.monotonic() + timeout_s
    while stored() < least:
        assert time.monotonic() < deadline, f"{stored()} rows stored, waiting for {least}"
        time.sleep(0.2)

produce(0, 120)
a = Runner("a")
wait(20)
b = Runner("b")  # rebalance: a and b
produce(120, 240)
wait(150)
c = Runner("c", crash_after=2)  # rebalance: a, b, c; c dies after its 2nd insert
c.thread.join(timeout=120)
produce(240, 360)
a.stop.set()  # rebalance: b alone (a leaves cleanly)
a.thread.join(timeout=120)
wait(360)
time.sleep(3)  # anything doubled would arrive now
b.stop.set()
b.thread.join(timeout=120)
row = client.query(
    "SELECT count(), uniqExact(source_id, sequence),"
    " (SELECT sum(records) FROM cgloop.flow_stats_1m), (SELECT sum(records) FROM"
    " cgloop.flow_stats_1s) FROM cgloop.flow_records WHERE startsWith(source_id, {t:String})",
    parameters={"t": tag},
).result_rows[0]
print(json.dumps({
    "rows": row, "inserts": inserts, "replays": replays,
    "errors": {r.name: r.error for r in (a, b, c)},
    "alive": [r.name for r in (a, b, c) if r.thread.is_alive()],
}))
"""


def test_sinks_in_one_group_lose_and_double_nothing_across_rebalances(
    stack_settings: Settings, tmp_path: Path
) -> None:
    tag = f"par-{uuid.uuid4()}"
    out = in_own_process(
        _SCRIPT,
        str(tmp_path / "store"),
        stack_settings.bootstrap_servers,
        f"t-par-{uuid.uuid4()}",
        tag,
        timeout_s=600,
    )
    count, unique, per_minute, per_second = out["rows"]
    assert (count, unique) == (360, 360), out["rows"]
    # the roll-ups (this module's broker holds only these records) count each record once
    assert per_minute == per_second == 360, out["rows"]
    assert out["alive"] == [], out["alive"]
    assert out["errors"]["a"] is None and out["errors"]["b"] is None, out["errors"]
    assert "crash between insert and commit" in (out["errors"]["c"] or ""), out["errors"]
    sinks_of: dict[int, set[str]] = {}
    for sink, partition, _first, _last in out["inserts"]:
        sinks_of.setdefault(partition, set()).add(sink)
    assert {s for names in sinks_of.values() for s in names} == {"a", "b", "c"}, sinks_of
    # partitions changed hands: the rebalances were real
    assert any(len(names) > 1 for names in sinks_of.values()), sinks_of
    # c's last insert was never committed: its successor replayed it from the plan
    assert out["replays"], "no planned chunk was replayed after the crash"
