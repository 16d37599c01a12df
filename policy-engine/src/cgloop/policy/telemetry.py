"""Reading telemetry to verify actions.

`TelemetryReader` is what verification asks: the value of a metric for an action's subject
over a time window. `WindowStore` answers from the records themselves, kept in memory for a
bounded time: active probe results (cgloop.probes.v1: `probe.*` metrics, matched on the flow's
endpoints) and flow records (cgloop.flows.v1: `flow.*` metrics, matched on the five-tuple).
`KafkaTelemetryFeed` keeps a store fed from the topics in a background thread, so verification
never polls a database (MOSAICO §3.2, ONOS IntMon's lesson).
"""

from __future__ import annotations

import bisect
import logging
import threading
import uuid
from collections import defaultdict, deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from cgloop.policy import parameters
from cgloop.policy.detections import addr_text, flow_text
from cgloop.policy.nodes import NodeBook

if TYPE_CHECKING:
    from cgloop.metrics import PipelineMetrics
from cgloop.v1 import action_pb2 as apb
from cgloop.v1.common_pb2 import LatencySummary
from cgloop.v1.flow_pb2 import FlowRecordBatch
from cgloop.v1.node_pb2 import NodeSampleBatch
from cgloop.v1.probe_pb2 import ProbeRecordBatch

log = logging.getLogger(__name__)

PROBE_METRICS = ("p50_rtt_ns", "p90_rtt_ns", "p99_rtt_ns", "max_rtt_ns", "loss_ratio")
FLOW_METRICS = ("rtp_jitter_ns", "rtp_loss_ratio", "ce_ratio", "throughput_bps")


@dataclass(frozen=True)
class Reading:
    value: float
    samples: int
    latency: LatencySummary | None = None


class TelemetryReader(Protocol):
    def read(
        self, metric: str, action: apb.Action, start_ns: int, end_ns: int, phase: str = "after"
    ) -> Reading | None:
        """The metric over [start_ns, end_ns) for the action's subject; None without data.
        `phase` is "before" for the baseline window ahead of the action, else "after".
        (WindowStore also takes `dscp=`: only the probes sent with that DSCP.)"""
        ...


def _quantile(sorted_values: list[int], q: float) -> int:
    # Nearest-rank: an observed value, never an interpolation between two.
    idx = max(0, min(len(sorted_values) - 1, int(-(-q * len(sorted_values) // 1)) - 1))
    return sorted_values[idx]


def summarise(values: list[int]) -> LatencySummary:
    s = sorted(values)
    return LatencySummary(
        samples=len(s),
        p50_ns=_quantile(s, 0.5),
        p90_ns=_quantile(s, 0.9),
        p99_ns=_quantile(s, 0.99),
        p999_ns=_quantile(s, 0.999),
        max_ns=s[-1],
    )


def probe_dscp(action: apb.Action) -> int | None:
    """The DSCP of the probes that measure what an action changed: a flow moved and re-marked
    is verified by the probes sent with its new DSCP (the queue it now uses); None: any."""
    if action.operation == apb.ACTION_OPERATION_REPRIORITISE_FLOW:
        try:
            spec = parameters.spec_of(action)  # typed, or an old action's map read into it
        except parameters.ParameterError:
            return None
        if isinstance(spec, apb.ReprioritiseFlowAction) and spec.HasField("rewrite_dscp"):
            return spec.rewrite_dscp
    return None


class WindowStore:
    """The last `retention_s` of probe and flow records, indexed for verification windows."""

    def __init__(self, retention_s: float = 300.0, max_per_key: int = 100_000) -> None:
        self.retention_ns = int(retention_s * 1e9)
        self.max_per_key = max_per_key
        self._lock = threading.Lock()
        # (probe target address, DSCP) -> [(sent_ns, rtt_ns or -1 when lost)] in time order
        self._probes: dict[tuple[str, int], deque[tuple[int, int]]] = defaultdict(deque)
        # node that sent the probes (its source id's `<node>/…`) -> its (address, DSCP) keys
        self._probe_nodes: dict[str, set[tuple[str, int]]] = defaultdict(set)
        # flow text -> [(interval_end_ns, FlowRecord summary tuple)]
        self._flows: dict[str, deque[tuple[int, tuple[int, int, int, int, int, int]]]] = (
            defaultdict(deque)
        )
        self.ingested = 0

    def ingest_probes(self, batch: ProbeRecordBatch) -> None:
        with self._lock:
            for r in batch.records:
                if r.overdue:
                    continue  # an early notice: the reply or the loss of that probe follows
                key = (addr_text(r.target_addr), r.dscp)
                self._probe_nodes[r.header.source_id.partition("/")[0]].add(key)
                q = self._probes[key]
                entry = (r.sent_ns, -1 if r.lost else r.rtt_ns)
                if q and q[-1][0] > r.sent_ns:
                    # A loss is known only at its timeout, after newer replies: keep the
                    # deque in send order, which the windows' bisection relies on.
                    bisect.insort(q, entry)
                else:
                    q.append(entry)
                self._trim(q, r.sent_ns)
                self.ingested += 1

    def ingest_flows(self, batch: FlowRecordBatch) -> None:
        with self._lock:
            for r in batch.records:
                key = flow_text(r.five_tuple)
                total = r.ecn_not_ect_packets + r.ecn_ect0_packets + r.ecn_ect1_packets
                total += r.ecn_ce_packets
                span = max(1, r.interval_end_ns - r.interval_start_ns)
                q = self._flows[key]
                q.append(
                    (
                        r.interval_end_ns,
                        (
                            r.rtp.jitter_ns,
                            r.rtp.lost_packets,
                            r.packets,
                            r.ecn_ce_packets,
                            total,
                            r.bytes * 8 * 1_000_000_000 // span,
                        ),
                    )
                )
                self._trim(q, r.interval_end_ns)
                self.ingested += 1

    def _trim(self, q: deque, now_ns: int) -> None:
        while q and (q[0][0] < now_ns - self.retention_ns or len(q) > self.max_per_key):
            q.popleft()

    @staticmethod
    def _window(q: deque, start_ns: int, end_ns: int) -> list:
        items = list(q)
        keys = [t for t, _ in items]
        return items[bisect.bisect_left(keys, start_ns) : bisect.bisect_left(keys, end_ns)]

    def _probe_keys(self, action: apb.Action) -> list[tuple[str, int]]:
        """Whose probes measure the action: those to either endpoint of its flow; without a
        flow (a chain, a queue, a node), those of the node it changed, or of the node its
        interface leads to (the lab names an interface after the node at its other end: the
        core's `edge1` leads to edge1), else every probe. The last is a proxy: edge1's probes
        measure the path beyond edge1 to its clients, not the core's queue towards edge1 (the
        lab's core runs no probes of its own)."""
        flow = action.target.flow
        if flow.src_addr or flow.dst_addr:
            addrs = {addr_text(flow.dst_addr), addr_text(flow.src_addr)}
            return [k for k in self._probes if k[0] in addrs]
        for node in (action.target.node_id, action.target.interface_name):
            if node and self._probe_nodes.get(node):
                return sorted(self._probe_nodes[node])
        return list(self._probes)

    def read(
        self,
        metric: str,
        action: apb.Action,
        start_ns: int,
        end_ns: int,
        phase: str = "after",
        dscp: int | None = None,
    ) -> Reading | None:
        family, _, name = metric.partition(".")
        flow = action.target.flow
        with self._lock:
            if family == "probe" and name in PROBE_METRICS:
                rows: list[tuple[int, int]] = []
                keys = self._probe_keys(action)
                if dscp is not None:
                    keys = [k for k in keys if k[1] == dscp]  # the expectation's probes only
                dscp = probe_dscp(action) if dscp is None else None
                if dscp is not None and any(d == dscp for _, d in keys):
                    # The flow's new queue is probed: after = that queue, before = the others.
                    keys = [k for k in keys if (k[1] == dscp) == (phase == "after")]
                for k in keys:
                    rows += self._window(self._probes[k], start_ns, end_ns)
                rows.sort()
                if not rows:
                    return None
                rtts = [v for _, v in rows if v >= 0]
                if name == "loss_ratio":
                    return Reading((len(rows) - len(rtts)) / len(rows), len(rows))
                if not rtts:
                    return Reading(float("inf"), len(rows))  # everything lost: worst possible
                summary = summarise(rtts)
                value = {
                    "p50_rtt_ns": summary.p50_ns,
                    "p90_rtt_ns": summary.p90_ns,
                    "p99_rtt_ns": summary.p99_ns,
                    "max_rtt_ns": summary.max_ns,
                }[name]
                return Reading(float(value), len(rtts), summary)
            if family == "flow" and name in FLOW_METRICS:
                got = self._window(self._flows.get(flow_text(flow), deque()), start_ns, end_ns)
                if not got:
                    return None
                vals = [v for _, v in got]
                if name == "rtp_jitter_ns":
                    return Reading(max(v[0] for v in vals), len(vals))
                if name == "rtp_loss_ratio":
                    pk = sum(v[2] for v in vals)
                    lost = sum(v[1] for v in vals)
                    return Reading(lost / (pk + lost) if pk + lost else 0.0, len(vals))
                if name == "ce_ratio":
                    tot = sum(v[4] for v in vals)
                    return Reading(sum(v[3] for v in vals) / tot if tot else 0.0, len(vals))
                return Reading(sum(v[5] for v in vals) / len(vals), len(vals))
        raise ValueError(
            f"unknown metric {metric!r}: probe.{{{','.join(PROBE_METRICS)}}} or "
            f"flow.{{{','.join(FLOW_METRICS)}}}"
        )


class KafkaTelemetryFeed:
    """Feeds a WindowStore from the probes and flows topics, and a NodeBook (the overload
    guard's and the planners' view of the nodes) from the nodes topic, in a background
    thread; either may be None."""

    def __init__(
        self,
        bootstrap: str,
        store: WindowStore | None,
        group_id: str | None = None,
        metrics: PipelineMetrics | None = None,
        nodes: NodeBook | None = None,
    ) -> None:
        from cgloop.bus.kafka import BatchConsumer
        from cgloop.bus.topics import FLOWS, NODES, PROBES

        self.store = store
        self.nodes = nodes
        topics = [PROBES.name, FLOWS.name] if store is not None else []
        if nodes is not None:
            topics.append(NODES.name)
        if not topics:
            raise ValueError("a telemetry feed needs a store or a node book to feed")
        # A private group: every engine instance needs every record (old ones age out).
        self._consumer = BatchConsumer(
            bootstrap,
            group_id or f"cgloop-policy-telemetry-{uuid.uuid4()}",
            topics,
            metrics=metrics,  # records in and lag of the verification's inputs
        )
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="telemetry-feed", daemon=True)

    def start(self) -> KafkaTelemetryFeed:
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                item = self._consumer.poll(0.2)
            except Exception:
                log.exception("telemetry feed poll failed")
                continue
            if item is None:
                continue
            _, batch, _ = item
            if isinstance(batch, NodeSampleBatch):
                if self.nodes is not None:
                    self.nodes.ingest(batch)
            elif self.store is None:
                continue
            elif isinstance(batch, ProbeRecordBatch):
                self.store.ingest_probes(batch)
            elif isinstance(batch, FlowRecordBatch):
                self.store.ingest_flows(batch)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self._consumer.close()
