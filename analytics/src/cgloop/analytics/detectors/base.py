"""Building Detection records, and suppressing repeats of an alert."""

from __future__ import annotations

import time
import uuid
from collections import OrderedDict

from cgloop.contracts import SCHEMA_VERSION
from cgloop.v1.common_pb2 import FiveTuple, RecordHeader
from cgloop.v1.detection_pb2 import Detection, Evidence, QueueRef

_NAMESPACE = uuid.UUID("6f1c3c1e-6a55-4d1b-9d0e-8f5b1f0c2a77")
DETECTOR_VERSION = "2026.11.1"


def subject_text(subject: FiveTuple | QueueRef | str) -> str:
    if isinstance(subject, FiveTuple):
        return subject.SerializeToString(deterministic=True).hex()
    if isinstance(subject, QueueRef):
        return f"q/{subject.node_id}/{subject.interface_name}/{subject.queue_id}"
    return subject


def detection_scope(subject_field: str, labels: dict[str, str] | None) -> str:
    """What tells apart subjects that share a name: a function's name is the same on every node
    and instance, so its node and instance belong to its identity (ids, suppression, keys)."""
    if subject_field != "function_name" or not labels:
        return ""
    return f"@{labels.get('node_id', '')}#{labels.get('instance', '')}"


def subject_key(det: Detection) -> str:
    """A detection's subject as text, scoped (see `detection_scope`): the unit the suppressor
    and the worker's Kafka key work on."""
    which = det.WhichOneof("subject") or ""
    subj = getattr(det, which) if which else ""
    return subject_text(subj) + detection_scope(which, dict(det.labels))


def make_detection(
    kind: int,
    severity: int,
    confidence: float,
    evidence: list[Evidence],
    detector: str,
    window: tuple[int, int],
    subject: FiveTuple | QueueRef | str,
    episode_start_ns: int,
    labels: dict[str, str] | None = None,
    model_version: str = DETECTOR_VERSION,
    subject_field: str = "node_id",
) -> Detection:
    """A detection whose id is derived from (detector, subject, episode start): replays of the
    same episode produce the same id, so consumers can drop duplicates. A text subject is a
    node id, or with `subject_field="function_name"` a function's name (whose node and
    instance labels then scope it)."""
    scope = detection_scope(subject_field, labels) if isinstance(subject, str) else ""
    det = Detection(
        header=RecordHeader(
            schema_version=SCHEMA_VERSION,
            source_id=f"analytics/{detector}",
            timestamp_ns=window[1],
        ),
        id=str(uuid.uuid5(_NAMESPACE, f"{detector}|{kind}|{subject_text(subject)}{scope}|"
                                      f"{episode_start_ns}")),
        kind=kind,
        severity=severity,
        confidence=max(0.0, min(1.0, confidence)),
        evidence=evidence,
        detector=detector,
        model_version=model_version,
        window_start_ns=window[0],
        window_end_ns=window[1],
        # map values must never be empty (common.proto wire rules)
        labels={k: v for k, v in (labels or {}).items() if k and v},
    )
    if isinstance(subject, FiveTuple):
        det.flow.CopyFrom(subject)
    elif isinstance(subject, QueueRef):
        det.queue.CopyFrom(subject)
    elif subject_field == "function_name":
        det.function_name = subject
    else:
        det.node_id = subject
    return det


def ev(name: str, value: float, threshold: float, baseline: float, unit: str) -> Evidence:
    return Evidence(
        name=name, value=float(value), threshold=float(threshold), baseline=float(baseline),
        unit=unit,
    )


class Suppressor:
    """Remembers the last alert per (kind, subject) so an ongoing episode alerts once, also
    across restarts (the worker persists it). Bounded: the oldest keys go first."""

    def __init__(self, realert_after_ns: int = 60 * 1_000_000_000, max_keys: int = 100_000):
        self.realert_after_ns = realert_after_ns
        self.max_keys = max_keys
        self.last: OrderedDict[str, int] = OrderedDict()

    @staticmethod
    def key(det: Detection) -> str:
        """What an alert is about. A detector that tracks its own episodes (the overload
        detector: an episode ends when its subject drops back) names each one in the label
        `episode`, so a new episode alerts even within `realert_after_ns` of the last."""
        key = f"{det.detector}|{det.kind}|{subject_key(det)}"
        # without the label, the key as state files written before it hold it
        return f"{key}|{det.labels['episode']}" if "episode" in det.labels else key

    def allow(self, det: Detection) -> bool:
        key = self.key(det)
        prev = self.last.get(key)
        if prev is not None and det.window_end_ns - prev < self.realert_after_ns:
            self.last[key] = max(prev, det.window_end_ns)
            self.last.move_to_end(key)
            return False
        self.last[key] = det.window_end_ns
        self.last.move_to_end(key)
        while len(self.last) > self.max_keys:
            self.last.popitem(last=False)
        return True

    def observe(self, det: Detection) -> None:
        """An alert emitted elsewhere (another worker of the group, read back from the
        detections topic): remembered as if this suppressor had allowed it."""
        key = self.key(det)
        self.last[key] = max(self.last.get(key, 0), det.window_end_ns)
        self.last.move_to_end(key)
        while len(self.last) > self.max_keys:
            self.last.popitem(last=False)

    def state(self) -> dict[str, int]:
        return dict(self.last)

    def load(self, state: dict[str, int]) -> None:
        self.last = OrderedDict(sorted(state.items(), key=lambda kv: kv[1]))


def now_ns() -> int:
    return time.time_ns()
