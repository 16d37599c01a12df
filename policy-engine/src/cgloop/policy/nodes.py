"""What the engine knows of each node's load: its samples (cgloop.nodes.v1), kept in memory.

The node agents sample their cores (cpufreq view, utilisation) and their chain functions
(`FunctionCounters`: packets, forwarded, and for a user-space function instance its
`busy_ratio` and ring overflows `rx_dropped`) every export interval. `NodeBook` keeps the last
`retention_s` of them per node, fed by the engine's telemetry feed
(`telemetry.KafkaTelemetryFeed`), and answers three questions:

- the load now (`load`): each core's utilisation and each function instance's packet rate,
  busy ratio, drop rate and CPU time per packet, from the two newest samples: what the overload
  guard (`cgloop.policy.capacity`) and the planners (`cgloop.policy.planning`) read;
- the function counters over a verification window (`read`): `function.busy_ratio` (the
  busiest instance's mean busy ratio) and `function.rx_dropped_per_s` (ring overflows per
  second across the instances), for the functions an action changed;
- which functions run on a node (`functions_on`): a node whose samples show no instance of a
  chain's advanced function has no chain for it yet (placement).
"""

from __future__ import annotations

import threading
from collections import defaultdict, deque
from collections.abc import Iterable
from dataclasses import dataclass, field

from cgloop.v1 import node_pb2 as npb

NS = 1_000_000_000
FUNCTION_METRICS = ("busy_ratio", "rx_dropped_per_s")


@dataclass(frozen=True)
class InstanceLoad:
    """One instance of a chain function between the two newest samples of its node."""

    function: str
    instance: int
    core: int
    pps: float  # packets received per second
    busy_ratio: float | None  # share of the interval spent processing (user-space functions)
    rx_dropped_per_s: float  # frames lost because its ring was full

    @property
    def t_cpu_s(self) -> float | None:
        """CPU time per packet (Gallenmüller eq. 5.9's t_CPU, from the counters: busy time over
        packets processed); None without a busy ratio or packets."""
        if self.busy_ratio is None or self.pps <= 0:
            return None
        return self.busy_ratio / self.pps


@dataclass(frozen=True)
class NodeLoad:
    node_id: str
    at_ns: int
    interval_s: float
    cores: dict[int, float]  # core -> utilisation 0..1
    instances: list[InstanceLoad] = field(default_factory=list)
    # core -> (scaling min, scaling max) kHz as sampled
    frequencies: dict[int, tuple[int, int]] = field(default_factory=dict)

    def of(self, function: str) -> list[InstanceLoad]:
        return [i for i in self.instances if i.function == function]

    def busiest_core(self) -> float:
        return max(self.cores.values(), default=0.0)


class NodeBook:
    """The last `retention_s` of node samples per node (thread-safe: the feed writes, the
    engine's decision thread reads)."""

    def __init__(self, retention_s: float = 120.0, max_per_node: int = 10_000) -> None:
        self.retention_ns = int(retention_s * NS)
        self.max_per_node = max_per_node
        self._lock = threading.Lock()
        self._samples: dict[str, deque[npb.NodeSample]] = defaultdict(deque)
        self.ingested = 0

    def ingest(self, batch: npb.NodeSampleBatch) -> None:
        with self._lock:
            for s in batch.records:
                if not s.node_id:
                    continue
                q = self._samples[s.node_id]
                if q and q[-1].header.timestamp_ns >= s.header.timestamp_ns:
                    continue  # a redelivered or out-of-order sample: deltas need order
                q.append(s)
                while q and (
                    q[0].header.timestamp_ns < s.header.timestamp_ns - self.retention_ns
                    or len(q) > self.max_per_node
                ):
                    q.popleft()
                self.ingested += 1

    def nodes(self) -> list[str]:
        with self._lock:
            return sorted(self._samples)

    def load(self, node_id: str) -> NodeLoad | None:
        """The node's load from its two newest samples; None with fewer than two."""
        with self._lock:
            q = self._samples.get(node_id)
            if not q or len(q) < 2:
                return None
            prev, last = q[-2], q[-1]
        return _load(prev, last)

    def functions_on(self, node_id: str) -> set[str]:
        """Names of the chain functions the node's newest sample reports."""
        with self._lock:
            q = self._samples.get(node_id)
            return {f.function_name for f in q[-1].functions} if q else set()

    def read(
        self, metric: str, node_id: str, functions: Iterable[str], start_ns: int, end_ns: int
    ) -> tuple[float, int] | None:
        """(value, samples) of `function.busy_ratio` or `function.rx_dropped_per_s` for these
        functions of the node over [start_ns, end_ns); None without two samples in it."""
        name = metric.removeprefix("function.")
        if name not in FUNCTION_METRICS:
            raise ValueError(
                f"unknown metric {metric!r}: function.{{{','.join(FUNCTION_METRICS)}}}"
            )
        wanted = set(functions)
        with self._lock:
            window = [
                s
                for s in self._samples.get(node_id, ())
                if start_ns <= s.header.timestamp_ns < end_ns
            ]
        if len(window) < 2:
            return None
        if name == "busy_ratio":
            per: dict[tuple[str, int], list[float]] = defaultdict(list)
            for s in window:
                for f in s.functions:
                    if f.function_name in wanted and f.HasField("busy_ratio"):
                        per[(f.function_name, f.instance)].append(f.busy_ratio)
            if not per:
                return None
            return max(sum(v) / len(v) for v in per.values()), len(window)
        first, last = window[0], window[-1]
        span = (last.header.timestamp_ns - first.header.timestamp_ns) / NS
        drops = 0
        for f in last.functions:
            if f.function_name not in wanted:
                continue
            before = next(
                (
                    g.rx_dropped
                    for g in first.functions
                    if (g.function_name, g.instance) == (f.function_name, f.instance)
                ),
                None,
            )
            # An instance started inside the window counts from zero (its counters are new).
            drops += max(0, f.rx_dropped - (before or 0))
        return drops / span, len(window)


def _load(prev: npb.NodeSample, last: npb.NodeSample) -> NodeLoad:
    dt = max(1, last.header.timestamp_ns - prev.header.timestamp_ns) / NS
    before = {(f.function_name, f.instance): f for f in prev.functions}
    instances = []
    for f in last.functions:
        p = before.get((f.function_name, f.instance))
        # A restarted counter (a new instance) counts from zero.
        packets = f.packets - p.packets if p is not None and f.packets >= p.packets else f.packets
        dropped = (
            f.rx_dropped - p.rx_dropped
            if p is not None and f.rx_dropped >= p.rx_dropped
            else f.rx_dropped
        )
        instances.append(
            InstanceLoad(
                function=f.function_name,
                instance=f.instance,
                core=f.core,
                pps=packets / dt,
                busy_ratio=f.busy_ratio if f.HasField("busy_ratio") else None,
                rx_dropped_per_s=dropped / dt,
            )
        )
    return NodeLoad(
        node_id=last.node_id,
        at_ns=last.header.timestamp_ns,
        interval_s=dt,
        cores={c.core: c.utilization for c in last.cores},
        instances=instances,
        frequencies={c.core: (c.min_frequency_khz, c.max_frequency_khz) for c in last.cores},
    )
