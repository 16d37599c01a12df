"""Kafka -> sink -> store, through the real broker and the real embedded store process."""

from __future__ import annotations

import os
import subprocess
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest
from cgloop.bus.codec import SCHEMA_HEADER, TYPE_HEADER, DecodeError, decode, headers_for
from cgloop.bus.kafka import BatchProducer
from cgloop.bus.topics import ACTIONS, DEADLETTER, DETECTIONS, FLOWS, INT, NODES, PROBES, TOPICS
from cgloop.config import Settings
from cgloop.testing import cgloop_cmd, kafka_answer

from .conftest import SinkStore, sample

pytestmark = pytest.mark.kafka

# Table -> rows one sample batch of its topic puts there.
TABLES = {
    "flow_records": (FLOWS.name, 1),
    "int_hop_records": (INT.name, 1),
    "int_flow_records": (INT.name, 1),
    "int_queue_records": (INT.name, 1),
    "int_drop_records": (INT.name, 1),
    "probe_records": (PROBES.name, 1),
    "node_samples": (NODES.name, 1),
    "detections": (DETECTIONS.name, 5),
    # the old-shape action, one per typed operation, a rollback, three node-level ones
    "actions": (ACTIONS.name, 14),
    "action_results": (ACTIONS.name, 9),
    "dead_letters": (DEADLETTER.name, 1),
}


def test_every_topic_reaches_its_tables(sink_store: SinkStore, stack_settings: Settings) -> None:
    source = f"sink-rt-{uuid.uuid4()}"
    producer = BatchProducer(stack_settings.bootstrap_servers)
    for topic in TOPICS:
        producer.send(topic, sample(topic, source))
    producer.flush()
    counts = " UNION ALL ".join(
        f"SELECT '{t}', count() FROM cgloop.{t} WHERE source_id = {{s:String}}" for t in TABLES
    )
    want = {t: str(n) for t, (_, n) in TABLES.items()}
    rows = sink_store.wait_for(counts, lambda r: dict(r) == want, s=source)
    assert dict(rows) == want
    # Values made it through the protobuf decoder and the views intact.
    flow = sink_store.query(
        "SELECT src_addr, dst_port, direction, packets, size_histogram_bytes, rtp_jitter_ns,"
        " interval_start FROM cgloop.flow_records WHERE source_id = {s:String}",
        s=source,
    )
    assert flow == [
        [
            "::ffff:198.51.100.7",
            "51000",
            "DIRECTION_EGRESS",
            "3000",
            "[0,0,0,0,0,12,3,0,0,0,2985]",
            "1500000",
            "2025-06-15 15:06:40.000000000",
        ]
    ]
    result = sink_store.query(
        "SELECT verdict, latency_after.p99_ns, previous_parameters['rewrite_dscp']"
        " FROM cgloop.action_results WHERE source_id = {s:String}"
        " AND notEmpty(previous_parameters)",  # the old-shape result of the sample
        s=source,
    )
    assert result == [["VERDICT_IMPROVED", "12000000", "46"]]
    # The typed ones (migration 0012): each rollback state as JSON (and a rollback action).
    typed = sink_store.query(
        "SELECT count() FROM cgloop.action_results WHERE source_id = {s:String}"
        " AND previous != ''",
        s=source,
    )
    assert typed == [["8"]]
    # The node micro loop (migration 0013): queue samples one row per class, the loop's status,
    # node-level actions with their cause.
    queues = sink_store.query(
        "SELECT class_handle, sojourn_p99_ns, qprot_sanctioned_packets FROM cgloop.node_queues"
        " WHERE source_id = {s:String}",
        s=source,
    )
    assert queues == [["1:40", "1100000", "1200"]]
    status = sink_store.query(
        "SELECT micro_loop.acting, micro_loop.protected_flows FROM cgloop.node_samples"
        " WHERE source_id = {s:String}",
        s=source,
    )
    assert status == [["true", "2"]]
    node_actions = sink_store.query(
        "SELECT count(), countIf(startsWith(cause, 'class 1:40')) FROM cgloop.actions"
        " WHERE source_id = {s:String} AND level = 'ACTION_LEVEL_NODE'",
        s=source,
    )
    assert node_actions == [["3", "3"]]
    # The roll-ups were fed: one flow, its jitter quantiles and its packets.
    rollup = sink_store.query(
        "SELECT sum(packets), round(quantilesTDigestIfMerge(0.5, 0.9, 0.99, 0.999)(jitter_ns)[3])"
        " FROM cgloop.flow_stats_1m WHERE src_addr = toIPv6('198.51.100.7')"
        " AND window = toDateTime('2025-06-15 15:06:00', 'UTC')",
    )
    assert int(rollup[0][0]) >= 3000 and rollup[0][1] == "1500000"
    # Sizes and gaps per minute come from the summed log2 histograms (migration 0010): the
    # sample's sizes [.., 12 @ bucket 6, 3 @ 7, 2985 @ 11] have their median in bucket 11
    # (midpoint 1.5 * 2^10), its gaps' p99 is in bucket 17 (1.5 * 2^16 ns).
    minute = sink_store.query(
        "SELECT p50_size_bytes, p99_inter_arrival_ns FROM cgloop.flow_minutes"
        " WHERE src_addr = toIPv6('198.51.100.7')"
        " AND minute = toDateTime('2025-06-15 15:06:00', 'UTC')",
    )
    assert minute == [["1536", "98304"]]


def test_overdue_notices_are_kept_apart_from_measured_rtts(
    sink_store: SinkStore, stack_settings: Settings
) -> None:
    source = f"sink-overdue-{uuid.uuid4()}"
    batch = sample(PROBES.name, source)
    (lost,) = batch.records
    lost.overdue = False  # the sample sets every field; here it is a plain loss
    notice = type(lost)()
    notice.CopyFrom(lost)
    notice.header.sequence += 1
    notice.lost, notice.overdue, notice.rtt_ns, notice.received_ns = False, True, 20_000_000, 0
    batch.records.append(notice)
    producer = BatchProducer(stack_settings.bootstrap_servers)
    producer.send(PROBES.name, batch)
    producer.flush()
    rows = sink_store.wait_for(
        "SELECT lost, overdue, rtt_ns FROM cgloop.probe_records WHERE source_id = {s:String}"
        " ORDER BY sequence",
        lambda r: len(r) == 2,
        s=source,
    )
    assert rows == [["true", "false", "340000"], ["false", "true", "20000000"]]


def test_poison_messages_go_to_the_dead_letter_topic_and_good_ones_still_land(
    sink_store: SinkStore, stack_settings: Settings
) -> None:
    source = f"sink-poison-{uuid.uuid4()}"
    producer = BatchProducer(stack_settings.bootstrap_servers)
    flows = headers_for(sample(FLOWS.name, source))
    producer.send(FLOWS.name, sample(FLOWS.name, source, 1))
    producer.send_raw(  # not protobuf
        FLOWS.name, b"\xff\xff\xff garbage", key=source, headers=flows
    )
    producer.send_raw(  # empty
        PROBES.name, b"", key=source, headers=headers_for(sample(PROBES.name, ""))
    )
    detections = headers_for(sample(DETECTIONS.name, source))
    probes = sample(PROBES.name, source).SerializeToString()
    producer.send_raw(DETECTIONS.name, probes, key=source, headers=detections)
    producer.send(FLOWS.name, sample(FLOWS.name, source, 2))
    producer.flush()
    rows = sink_store.wait_for(
        "SELECT count() FROM cgloop.flow_records WHERE source_id = {s:String}",
        lambda r: r == [["2"]],
        s=source,
    )
    assert rows == [["2"]]
    # The sink's dead letters come back through the sink into cgloop.dead_letters, keyed by
    # the original message's key, each with its reason.
    letters = sink_store.wait_for(
        "SELECT topic, reason FROM cgloop.dead_letters WHERE key = {s:String}"
        " AND consumer_group = {g:String} ORDER BY topic",
        lambda r: len(r) == 3,
        s=source,
        g=sink_store.group,
    )
    assert [t for t, _ in letters] == [
        DETECTIONS.name,
        FLOWS.name,
        PROBES.name,
    ]
    reasons = {t: r for t, r in letters}
    assert "empty payload" in reasons[PROBES.name]
    assert "cgloop.v1.FlowRecordBatch" in reasons[FLOWS.name]
    # A probe batch under a DetectionBatch type header: its fields are not a DetectionBatch's.
    assert "does not have" in reasons[DETECTIONS.name]
    assert DEADLETTER.name in TOPICS


def test_the_sink_refuses_what_the_consumers_refuse_and_keeps_the_good_messages_beside(
    sink_store: SinkStore, stack_settings: Settings
) -> None:
    """Each bad message, sent between good ones on the same partition (one key: one chunk
    where they arrive together), is dead-lettered by the sink with the very reason the
    consumers' decoder (cgloop.bus.codec.decode) gives, and the good ones are all stored."""
    source = f"sink-agree-{uuid.uuid4()}"
    flow = FLOWS.name
    int_ = INT.name

    def flow_batch(sequence: int, **header: object) -> bytes:
        batch = sample(flow, source, sequence)
        for k, v in header.items():
            setattr(batch.records[0].header, k, v)
        return batch.SerializeToString()

    def int_batch(sequence: int, **header: object) -> bytes:
        batch = sample(int_, source, sequence)
        for k, v in header.items():
            setattr(batch.records[1].flow.header, k, v)
        return batch.SerializeToString()

    flow_headers = headers_for(sample(flow, source))
    int_headers = headers_for(sample(int_, source))
    version_99 = [(TYPE_HEADER, flow_headers[0][1]), (SCHEMA_HEADER, b"99")]
    wrong_type = [(TYPE_HEADER, b"cgloop.v1.DetectionBatch"), (SCHEMA_HEADER, b"1")]
    probes = sample(PROBES.name, source).SerializeToString()
    # (topic, value, headers): good ones carry sequences 1.., bad ones 100..
    messages = [
        (flow, flow_batch(1), flow_headers),
        (flow, flow_batch(100, source_id=""), flow_headers),  # empty source_id
        (flow, flow_batch(101), version_99),  # schema version 99 in the Kafka header
        (flow, flow_batch(102, schema_version=99), flow_headers),  # 99 in the record header
        (flow, flow_batch(103), wrong_type),  # a flow batch under another type's header
        (flow, probes, flow_headers),  # a probe batch under the flows' type header
        (flow, b"", flow_headers),  # empty payload
        (flow, b"\xff\xfe garbage \x00\x01", flow_headers),  # garbage
        (flow, flow_batch(104), None),  # no headers at all
        (flow, flow_batch(2), flow_headers),
        (int_, int_batch(1), int_headers),
        (int_, int_batch(100, source_id=""), int_headers),  # empty source_id
        (int_, int_batch(101, schema_version=99), int_headers),
        (int_, probes, int_headers),
        (int_, int_batch(5), int_headers),
    ]
    want: dict[str, list[str]] = {flow: [], int_: []}
    producer = BatchProducer(stack_settings.bootstrap_servers)
    for topic, value, headers in messages:
        try:
            decode(TOPICS[topic], value, headers)
        except DecodeError as exc:
            want[topic].append(str(exc))
        producer.send_raw(topic, value, key=source, headers=headers)
    producer.flush()
    assert [len(v) for v in want.values()] == [8, 3]
    # Every bad message on the dead-letter topic (read back through the sink), in order,
    # with the consumers' reason.
    letters = sink_store.wait_for(
        "SELECT topic, hex(reason) FROM cgloop.dead_letters WHERE key = {s:String}"
        " AND consumer_group = {g:String} ORDER BY topic, offset",
        lambda r: len(r) >= 11,
        s=source,
        g=sink_store.group,
    )
    got: dict[str, list[str]] = {flow: [], int_: []}
    for topic, reason in letters:
        got[topic].append(bytes.fromhex(reason).decode())
    assert got == want
    # Every good message stored, nothing of the bad ones.
    counts = (
        "SELECT (SELECT groupArray(sequence) FROM (SELECT sequence FROM cgloop.flow_records"
        " WHERE source_id = {s:String} ORDER BY sequence)),"
        " (SELECT count() FROM cgloop.int_flow_records WHERE source_id = {s:String}),"
        " (SELECT count() FROM cgloop.int_hop_records WHERE source_id = {s:String})"
    )
    rows = sink_store.wait_for(counts, lambda r: r == [["[1,2]", "2", "2"]], s=source)
    assert rows == [["[1,2]", "2", "2"]]


def _wait_committed(bootstrap: str, group: str, topic: str, timeout_s: float = 60) -> None:
    """Wait until `group` has committed every partition of `topic` up to its end (read-only:
    GroupOffsets joins no group)."""
    from cgloop.bus.kafka import GroupOffsets

    offsets = GroupOffsets(bootstrap, group)
    try:
        ends = offsets.ends(offsets.partitions([topic]))
        deadline = time.monotonic() + timeout_s
        while True:
            done = kafka_answer(lambda: offsets.committed(ends))
            behind = {
                k: (done.get(k), end)
                for k, end in ends.items()
                if end > 0 and done.get(k, -1) < end
            }
            if not behind:
                return
            assert time.monotonic() < deadline, f"{group} behind on {topic}: {behind}"
            time.sleep(0.3)
    finally:
        offsets.close()


def test_a_crash_between_insert_and_commit_loses_nothing_and_counts_nothing_twice(
    stack_settings: Settings, tmp_path: Path
) -> None:
    source = f"sink-crash-{uuid.uuid4()}"
    group = f"t-crash-{uuid.uuid4()}"
    folder = tmp_path / "store"
    producer = BatchProducer(stack_settings.bootstrap_servers)
    # 40 flow batches of 1 record each on one partition (same key), 40 distinct sequences.
    for i in range(40):
        producer.send(FLOWS.name, sample(FLOWS.name, source, i + 1), key=source)
    producer.flush()
    # The standalone embedded sink inserts its first chunk, then dies before committing.
    crashed = subprocess.run(
        cgloop_cmd(
            "sink",
            "--path",
            str(folder),
            "--bootstrap",
            stack_settings.bootstrap_servers,
            "--group",
            group,
            "--topic",
            "flow",
            "--max-chunk-messages",
            "1000000",
            "--crash-after-inserts",
            "1",
        ),
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ},
    )
    assert crashed.returncode == 17, crashed.stderr
    # Restart on the same folder and group: the chunk is replayed with the same offsets and
    # dropped by the store; more data arriving afterwards is still taken.
    store = SinkStore(folder, stack_settings.bootstrap_servers, group, "--close-minutes-every", "1")
    try:
        for i in range(40, 50):
            producer.send(FLOWS.name, sample(FLOWS.name, source, i + 1), key=source)
        producer.flush()
        count = (
            "SELECT count(), uniqExact(sequence) FROM cgloop.flow_records"
            " WHERE source_id = {s:String}"
        )
        rows = store.wait_for(count, lambda r: r == [["50", "50"]], s=source)
        assert rows == [["50", "50"]]
        # Roll-ups too (a key-deduplicating table alone would not protect them). Read once the
        # sink has stored the whole topic (its commits follow its inserts): this source's 50
        # records say nothing of the other partitions (other tests' records of this flow), and
        # while a chunk of them is being inserted its raw rows are visible before its roll-up
        # rows (ClickHouse commits an insert table by table), so two reads at different times
        # could count one record in the raw table and not yet in the roll-up (the issue's "52
        # against 53", gone a moment later).
        _wait_committed(stack_settings.bootstrap_servers, group, FLOWS.name)
        both = store.query(
            "SELECT (SELECT sum(records) FROM cgloop.flow_stats_1m"
            " WHERE src_addr = toIPv6('198.51.100.7') AND dst_port = 51000"
            " AND window = toDateTime('2025-06-15 15:06:00', 'UTC')),"
            " (SELECT count() FROM cgloop.flow_records"
            " WHERE src_addr = toIPv6('198.51.100.7') AND dst_port = 51000)"
        )
        assert both[0][0] == both[0][1], both
        # The minute (2025: long closed) is finalised, and finalised again when late rows
        # arrive; FINAL reads the newest version, equal to what the t-digest view computes.
        # (The group read the topic from its start: other tests' records of this flow count.)
        flow = (
            " src_addr = toIPv6('198.51.100.7') AND dst_port = 51000 AND {t}"
            " = toDateTime('2025-06-15 15:06:00', 'UTC')"
        )
        check = (
            "SELECT (SELECT count() FROM cgloop.flow_records WHERE"
            + flow.format(t="toStartOfMinute(interval_start)")
            + "),"
            " (SELECT any(records) FROM cgloop.flow_minutes_closed FINAL WHERE"
            + flow.format(t="minute")
            + "),"
            " (SELECT any(p99_jitter_ns) FROM cgloop.flow_minutes_closed FINAL WHERE"
            + flow.format(t="minute")
            + "),"
            " (SELECT any(p99_jitter_ns) FROM cgloop.flow_minutes WHERE"
            + flow.format(t="minute")
            + ")"
        )

        def caught_up(least: int) -> Callable[[list[list[str]]], bool]:
            return lambda r: int(r[0][0]) >= least and r[0][0] == r[0][1]

        first = store.wait_for(check, caught_up(50))
        assert first[0][0] == first[0][1] and first[0][2] == first[0][3], first
        for i in range(50, 60):
            producer.send(FLOWS.name, sample(FLOWS.name, source, i + 1), key=source)
        producer.flush()
        again = store.wait_for(check, caught_up(int(first[0][0]) + 10))
        assert again[0][0] == again[0][1] and again[0][2] == again[0][3], again
    finally:
        store.stop()
