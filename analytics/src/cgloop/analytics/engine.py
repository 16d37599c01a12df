"""The analytics engine: records in, detections out, bounded state. No Kafka here.

The streaming worker (`worker.py`) feeds it decoded batches; tests and the benchmark feed it
directly. Per-conversation state is an LRU of at most `max_flows` conversations, each keeping
only the last `window_s` of records; idle ones are evicted on `evict()`.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from dataclasses import dataclass, field

import numpy as np
from cgloop.analytics import decision
from cgloop.analytics.detectors.base import Suppressor, ev, make_detection
from cgloop.analytics.detectors.l4s import L4sAbuseDetector
from cgloop.analytics.detectors.overload import QueueOverloadDetector
from cgloop.analytics.detectors.slo import SeriesParams, SloDetector, platform_slos
from cgloop.analytics.features import FEATURE_NAMES, split_directions, window_features
from cgloop.analytics.model import FlowModel
from cgloop.analytics.records import (
    NS,
    TupleKey,
    conversation_key,
    flow_label,
    observation_labels,
    tuple_key,
)
from cgloop.v1.action_pb2 import Action, ActionOperation, ActionState
from cgloop.v1.common_pb2 import FiveTuple
from cgloop.v1.detection_pb2 import Detection, DetectionKind, Severity
from cgloop.v1.flow_pb2 import FlowRecord
from cgloop.v1.probe_pb2 import ProbeRecord

ANOMALY_THRESHOLD = -0.05  # IsolationForest decision function below this is reported
# A missing sequence number is lost once the source's records are this much further on.
GAP_LATENESS_NS = 5 * NS


@dataclass
class _SeqState:
    contiguous: int  # every sequence number up to here has arrived (or was declared lost)
    pending: dict[int, int] = field(default_factory=dict)  # seen above it → event time


@dataclass
class _Conv:
    records: deque = field(default_factory=deque)
    first_ns: int = 0
    last_ns: int = 0
    next_check_ns: int = 0
    label: str = ""
    anomaly_checked_ns: int = 0


@dataclass
class EngineConfig:
    window_s: float = 5.0
    check_every_s: float = 0.5
    min_observed_s: float = 0.5
    # A conversation decided to be something other than cloud gaming is re-examined until it
    # has been seen this long (its first second can look like a video stream); a cloud-gaming
    # label is final. The decision rule itself is decision.py's, with the model's thresholds.
    settle_s: float = decision.SETTLE_S
    max_flows: int = 50_000
    idle_s: float = 30.0
    anomaly: bool = True  # detections for dashboards; labelled remediation=off
    # A deployment profile of the SLO table (cgloop.slo) whose objectives replace every
    # platform's where it sets them (`lab`: the lab's gaming latency objective); None: each
    # platform's own.
    slo_profile: str | None = None
    # How long a value must stay past its SLO before an episode fires.
    slo_min_duration_s: float = 1.0
    # The same for latency alone (None: slo_min_duration_s). Probes sample latency every few
    # ms, flow records the other metrics every 100 ms: a span that holds several probes may
    # hold a single flow record, one noisy interval.
    latency_min_duration_s: float | None = None
    # > 0: latency samples are averaged over windows of this length before the detectors see
    # them (how telemetry-window loops such as MOSAICO's work; the loop benchmark's baseline).
    latency_window_s: float = 0.0
    # INT switch id -> node id, and (switch id, egress port) -> interface name: the labels a
    # switch-queue detection carries for policies (lab v2: {1: "core"}).
    int_switch_nodes: dict[int, str] = field(default_factory=dict)
    int_switch_ports: dict[tuple[int, int], str] = field(default_factory=dict)
    # INT flow records' end-to-end latency as the flow's latency (SLO) and path delay (jitter
    # corroboration). Only where the INT domain spans the flow's whole path: lab v2's one INT
    # switch (the core) reports its own hop, a fraction of the path the probes measure, and
    # mixing the two in one series would keep a latency breach from ever holding.
    int_flow_latency: bool = False


class AnalyticsEngine:
    def __init__(self, model: FlowModel | None, model_version: str = "",
                 config: EngineConfig | None = None) -> None:
        self.model = model
        self.model_version = model_version
        self.cfg = config or EngineConfig()
        profiles = platform_slos(self.cfg.slo_profile)
        latency_min = self.cfg.latency_min_duration_s
        self.slo = SloDetector(
            profiles, SeriesParams(min_duration_ns=int(self.cfg.slo_min_duration_s * NS)),
            latency_params=None if latency_min is None
            else SeriesParams(min_duration_ns=int(latency_min * NS)),
        )
        self.l4s = L4sAbuseDetector()
        self.overload = QueueOverloadDetector(
            switch_nodes=self.cfg.int_switch_nodes, switch_ports=self.cfg.int_switch_ports
        )
        self.convs: OrderedDict[TupleKey, _Conv] = OrderedDict()
        # Gaming conversations by endpoint address (server and client): active probes toward
        # either end measure the path the flow takes.
        self.servers: dict[bytes, set[TupleKey]] = {}
        # DSCP a flow's packets now carry, when an action rewrote it (from cgloop.actions.v1):
        # probes are matched to flows by the queue (DSCP) they measure. Per conversation, then
        # per direction: an action on one direction (say a client's input stream) does not
        # move the other one's packets. With the time the change was applied: an action older
        # than the conversation (a replay, or an earlier run on the same five-tuple, whose
        # agent state is gone) does not say where its packets are.
        self.flow_dscp: dict[TupleKey, dict[TupleKey, tuple[int, int]]] = {}
        self._actions: OrderedDict[str, Action] = OrderedDict()
        self._latency_windows: dict[TupleKey, tuple[int, float, int]] = {}
        self._seq: dict[str, _SeqState] = {}
        self.watermark_ns = 0
        self.classified = 0
        # Inputs whose per-source sequence gaps this engine judges (telemetry_gap). A worker
        # that holds only some partitions of a topic sees only some of a source's numbers:
        # it leaves that topic out (worker.py says who checks what in a group).
        self.sequence_checks: set[str] = {"flows", "int", "probes", "nodes"}

    def reset_partitioned(self) -> None:
        """Forget the state built from the partitioned inputs (flows, INT, nodes): the worker
        gave up its partitions in a rebalance, and rebuilds what it keeps by replaying them.
        What the side inputs taught stays (the DSCP of flows the loop moved)."""
        self.slo = SloDetector(self.slo.profiles, self.slo.params, self.slo.max_flows,
                               self.slo.idle_ns, self.slo.latency_params)
        self.l4s = L4sAbuseDetector()
        self.overload = QueueOverloadDetector(
            switch_nodes=self.cfg.int_switch_nodes, switch_ports=self.cfg.int_switch_ports
        )
        self.convs.clear()
        self.servers.clear()
        self._latency_windows.clear()
        self._seq.clear()

    # ------------------------------------------------------------------ flows

    def on_flows(self, records: list[FlowRecord]) -> list[Detection]:
        out: list[Detection] = []
        due: list[tuple[TupleKey, _Conv]] = []
        for r in records:
            if "flows" in self.sequence_checks:
                out += self._sequence(r.header.source_id, r.header.sequence, r.interval_end_ns)
            self.watermark_ns = max(self.watermark_ns, r.interval_end_ns)
            out += self.l4s.on_flow(r)
            out += self.slo.on_flow(r)
            key = conversation_key(r.five_tuple)
            conv = self.convs.get(key)
            if conv is None:
                conv = self.convs[key] = _Conv(first_ns=r.interval_start_ns)
                conv.next_check_ns = r.interval_start_ns + int(self.cfg.min_observed_s * NS)
                while len(self.convs) > self.cfg.max_flows:
                    self.convs.popitem(last=False)
            else:
                self.convs.move_to_end(key)
            conv.records.append(r)
            conv.last_ns = max(conv.last_ns, r.interval_end_ns)
            horizon = conv.last_ns - int(self.cfg.window_s * NS)
            while conv.records and conv.records[0].interval_end_ns <= horizon:
                conv.records.popleft()
            if self.model is not None and conv.last_ns >= conv.next_check_ns and (
                not conv.label
                or (conv.label != "cloud_gaming"
                    and conv.last_ns - conv.first_ns < self.cfg.settle_s * NS)
            ):
                due.append((key, conv))
        if due:
            out += self._classify(due)
        return out

    def _classify(self, due: list[tuple[TupleKey, _Conv]]) -> list[Detection]:
        assert self.model is not None
        uniq = {k: c for k, c in due}
        keys = list(uniq)
        X = np.vstack([window_features(list(uniq[k].records)) for k in keys])
        proba = self.model.predict_proba(X)
        classes = self.model.classes_
        plat, plat_p = self.model.predict_platform(X)
        # IsolationForest once per conversation (on its first check), not on every re-check
        first = np.array([uniq[k].anomaly_checked_ns == 0 for k in keys])
        scores = None
        if self.cfg.anomaly and first.any():
            scores = np.zeros(len(keys))
            scores[first] = self.model.anomaly_score(X[first])
            for k, is_first in zip(keys, first, strict=True):
                if is_first:
                    uniq[k].anomaly_checked_ns = uniq[k].last_ns
        out = []
        for i, k in enumerate(keys):
            conv = uniq[k]
            conv.next_check_ns = conv.last_ns + int(self.cfg.check_every_s * NS)
            self.classified += 1
            if scores is not None and scores[i] < ANOMALY_THRESHOLD:
                out.append(self._anomaly(conv, X[i], float(scores[i])))
            j = decision.decided(proba[i], self.model.decision_threshold_)
            if j is None:
                continue
            conv.label = str(classes[j])
            if conv.label != "cloud_gaming":
                continue
            down, up = split_directions(list(conv.records))
            if not down:
                continue
            d_ft = down[0].five_tuple
            platform = str(plat[i])
            self.slo.watch(d_ft, platform, down=True, t_ns=conv.last_ns,
                           where=observation_labels(down[-1]))
            if up:
                self.slo.watch(up[0].five_tuple, platform, down=False, t_ns=conv.last_ns,
                               where=observation_labels(up[-1]))
            self.servers.setdefault(d_ft.src_addr, set()).add(k)
            self.servers.setdefault(d_ft.dst_addr, set()).add(k)
            out.append(make_detection(
                DetectionKind.DETECTION_KIND_GAMING_FLOW_CLASSIFIED, Severity.SEVERITY_INFO,
                float(proba[i, j]),
                [ev("p_cloud_gaming", proba[i, j], self.model.decision_threshold_[j], 0.0,
                    "probability"),
                 ev("p_platform", plat_p[i], 0.0, 0.0, "probability"),
                 ev("observed_s", (conv.last_ns - conv.first_ns) / NS, self.cfg.min_observed_s,
                    0.0, "s"),
                 *(ev(n, X[i, FEATURE_NAMES.index(n)], 0.0, 0.0, u) for n, u in (
                     ("dn_bps", "bps"), ("up_pps", "pps"), ("dn_burst_rate", "1/s")))],
                "flow-classifier", (conv.first_ns, conv.last_ns), d_ft, conv.first_ns,
                labels={**observation_labels(down[-1]), "class": conv.label,
                        "platform": platform, "flow": flow_label(d_ft)},
                model_version=self.model_version or "untracked",
            ))
        return out

    def _anomaly(self, conv: _Conv, x: np.ndarray, score: float) -> Detection:
        r0 = conv.records[-1]
        top = np.argsort(-np.abs(np.log1p(np.abs(x))))[:3]
        return make_detection(
            DetectionKind.DETECTION_KIND_FLOW_ANOMALY, Severity.SEVERITY_INFO,
            min(1.0, 0.5 - score),
            [ev("isolation_score", score, ANOMALY_THRESHOLD, 0.0, "score"),
             *(ev(FEATURE_NAMES[i], x[i], 0.0, 0.0, "") for i in top)],
            "flow-anomaly", (conv.first_ns, conv.last_ns), r0.five_tuple, conv.first_ns,
            labels={"remediation": "off", "flow": flow_label(r0.five_tuple)},
            model_version=self.model_version or "untracked",
        )

    # ------------------------------------------------------------------ other topics

    def on_probes(self, records: list[ProbeRecord]) -> list[Detection]:
        out: list[Detection] = []
        for p in records:
            if "probes" in self.sequence_checks:
                out += self._sequence(p.header.source_id, p.header.sequence,
                                      p.header.timestamp_ns)
            if p.lost or not p.rtt_ns:
                continue
            # An overdue notice's RTT is a lower bound, known before the reply: evidence that
            # latency is at least that much, early. Averaged 1 s windows (MOSAICO's telemetry)
            # take only measured RTTs: a bound and its reply would count the probe twice.
            if p.overdue and self.cfg.latency_window_s > 0:
                continue
            for key in self.servers.get(p.target_addr, ()):
                conv = self.convs.get(key)
                if conv is None or not conv.records:
                    continue
                down, _ = split_directions(list(conv.records))
                if not down:
                    continue
                dscp = down[-1].last_dscp
                moved = self.flow_dscp.get(key, {}).get(tuple_key(down[0].five_tuple))
                if moved is not None and moved[1] >= conv.first_ns:
                    dscp = moved[0]
                if p.dscp != dscp:
                    continue  # a probe of another queue than the one this flow is in
                if not p.overdue:  # the path's delay variation, against which jitter is judged
                    self.slo.on_path_delay(down[0].five_tuple, p.header.timestamp_ns, p.rtt_ns)
                out += self._latency(key, down[0].five_tuple, p.header.timestamp_ns, p.rtt_ns)
        return out

    def _latency(self, key: TupleKey, ft: FiveTuple, t_ns: int, latency_ns: int) -> list:
        """A latency sample for a flow; with `latency_window_s`, window means instead."""
        w = int(self.cfg.latency_window_s * NS)
        if w <= 0:
            return self.slo.on_latency(ft, t_ns, latency_ns)
        start, total, n = self._latency_windows.get(key, (t_ns - t_ns % w, 0.0, 0))
        if t_ns >= start + w and n:
            self._latency_windows[key] = (t_ns - t_ns % w, float(latency_ns), 1)
            return self.slo.on_latency(ft, start + w, total / n)
        self._latency_windows[key] = (start, total + latency_ns, n + 1)
        return []

    def on_actions(self, events) -> list[Detection]:
        """Follow the DSCP of flows the loop reprioritised (applied, then maybe rolled back)."""
        for e in events:
            which = e.WhichOneof("event")
            if which == "action":
                a = e.action
                if (a.operation == ActionOperation.ACTION_OPERATION_REPRIORITISE_FLOW
                        and _rewrite_dscp(a) is not None and not a.dry_run):
                    self._actions[a.id] = a
                    while len(self._actions) > 10_000:
                        self._actions.popitem(last=False)
            elif which == "result":
                a = self._actions.get(e.result.action_id)
                if a is None:
                    continue
                key = conversation_key(a.target.flow)
                direction = tuple_key(a.target.flow)
                if e.result.state in (ActionState.ACTION_STATE_APPLIED,
                                      ActionState.ACTION_STATE_VERIFIED):
                    dscp = _rewrite_dscp(a)
                    if dscp is None:
                        continue
                    applied = e.result.applied_ns or e.result.header.timestamp_ns
                    self.flow_dscp.setdefault(key, {})[direction] = (dscp, applied)
                elif e.result.state == ActionState.ACTION_STATE_ROLLED_BACK:
                    marks = self.flow_dscp.get(key, {})
                    marks.pop(direction, None)
                    if not marks:
                        self.flow_dscp.pop(key, None)
        return []

    def on_int(self, records) -> list[Detection]:
        out: list[Detection] = []
        for env in records:
            which = env.WhichOneof("record")
            rec = getattr(env, which) if which else None
            if rec is None:
                continue
            if "int" in self.sequence_checks:
                out += self._sequence(rec.header.source_id, rec.header.sequence,
                                      rec.header.timestamp_ns)
            if which == "queue":
                out += self.overload.on_int_queue(rec)
            elif which == "flow" and rec.end_to_end_latency_ns and self.cfg.int_flow_latency:
                self.slo.on_path_delay(rec.five_tuple, rec.header.timestamp_ns,
                                       rec.end_to_end_latency_ns)
                out += self.slo.on_latency(rec.five_tuple, rec.header.timestamp_ns,
                                           rec.end_to_end_latency_ns)
        return out

    def on_nodes(self, records) -> list[Detection]:
        out: list[Detection] = []
        for n in records:
            if "nodes" in self.sequence_checks:
                out += self._sequence(n.header.source_id, n.header.sequence,
                                      n.header.timestamp_ns)
            out += self.overload.on_node(n)
        return out

    def _sequence(self, source: str, seq: int, t_ns: int) -> list[Detection]:
        """A per-source sequence gap means telemetry was lost: the loop is partly blind.

        A source's records travel on several partitions, so they may arrive out of order: a
        missing number is only declared lost once a later record of the source is older than
        `GAP_LATENESS_NS` of event time and the number still has not arrived."""
        st = self._seq.get(source)
        if st is None:
            st = self._seq[source] = _SeqState(contiguous=seq - 1)
            if len(self._seq) > 100_000:  # bounded: forget the oldest source
                self._seq.pop(next(iter(self._seq)))
        if seq <= st.contiguous or seq in st.pending:
            return []  # duplicate or already counted
        st.pending[seq] = t_ns
        out: list[Detection] = []
        while st.pending:
            if st.contiguous + 1 in st.pending:
                st.pending.pop(st.contiguous + 1)
                st.contiguous += 1
                continue
            first = min(st.pending)
            late = t_ns - st.pending[first] > GAP_LATENESS_NS or len(st.pending) > 10_000
            if not late:
                break
            missing = first - st.contiguous - 1
            out.append(make_detection(
                DetectionKind.DETECTION_KIND_TELEMETRY_GAP, Severity.SEVERITY_WARNING, 1.0,
                [ev("missing_records", missing, 0, 0, "records")],
                "telemetry-gap", (st.pending[first], t_ns), source, st.contiguous + 1,
                labels={"source": source},
            ))
            st.contiguous = first - 1
        return out

    # ------------------------------------------------------------------ housekeeping

    def evict(self) -> int:
        """Drop conversations and detector state idle for `idle_s` of event time."""
        limit = self.watermark_ns - int(self.cfg.idle_s * NS)
        n = 0
        for k in [k for k, c in self.convs.items() if c.last_ns < limit]:
            del self.convs[k]
            n += 1
        for k in [k for k in self.flow_dscp if k not in self.convs]:
            del self.flow_dscp[k]
        for k in [k for k in self._latency_windows if k not in self.convs]:
            del self._latency_windows[k]
        for addr in list(self.servers):
            self.servers[addr] = {k for k in self.servers[addr] if k in self.convs}
            if not self.servers[addr]:
                del self.servers[addr]
        n += self.slo.evict(self.watermark_ns) + self.l4s.evict(self.watermark_ns)
        n += self.overload.evict(self.watermark_ns)
        return n

    def state_size(self) -> dict[str, int]:
        return {
            "conversations": len(self.convs),
            "records": sum(len(c.records) for c in self.convs.values()),
            "slo_flows": len(self.slo.flows),
            "slo_paths": len(self.slo.paths),
            "l4s_flows": len(self.l4s.flows),
            "overload_subjects": len(self.overload.subjects),
        }


def five_tuple_of(key: TupleKey) -> FiveTuple:
    return FiveTuple(src_addr=key[0], dst_addr=key[1], src_port=key[2], dst_port=key[3],
                     ip_protocol=key[4])


__all__ = ["AnalyticsEngine", "EngineConfig", "Suppressor"]


def _rewrite_dscp(a: Action) -> int | None:
    """The DSCP a reprioritise_flow action marks the flow with: its typed parameters
    (Action.reprioritise_flow), or the `parameters` map of an action decided before them."""
    if a.HasField("reprioritise_flow"):
        spec = a.reprioritise_flow
        return spec.rewrite_dscp if spec.HasField("rewrite_dscp") else None
    try:
        return int(a.parameters["rewrite_dscp"], 0)
    except (KeyError, ValueError):
        return None
