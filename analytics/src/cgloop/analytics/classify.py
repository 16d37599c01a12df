"""`cgloop analytics classify`: per conversation of a capture, its class, platform, confidence,
the source of the label and the time to decision.

Two paths, both reported with their share:

* **signature**: nDPI (`dpi.py`) named a gaming platform from the flow's set-up. Where the
  platform settles the class (GeForce Now is cloud gaming; Steam, Nintendo, … on UDP are
  online games) the label is nDPI's, with confidence 1 and the time of the packet after which
  nDPI named it. Xbox and PlayStation run online games and cloud gaming alike: nDPI gives the
  platform, the behaviour gives the class.
* **behaviour**: the flow classifier on the probe's records (the Rust pcap twin), at the prefix
  lengths it was trained on (`datasets.PREFIXES_S`, 0.5 to 5 s), decided by the streaming
  engine's rule (`decision.py`, the model's fitted thresholds): the label the rule settles on
  and the prefix at which it was decided; a conversation never decided gets the top class at
  its longest prefix and no time. The confidence is the label's probability at that prefix.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

import numpy as np
from cgloop.analytics import decision
from cgloop.analytics.datasets import PREFIXES_S, LabelledFlow, prefix_windows
from cgloop.analytics.dpi import DpiError, DpiFlow, dissect
from cgloop.analytics.features import conversations, split_directions
from cgloop.analytics.model import FlowModel
from cgloop.analytics.records import NS, flow_label, read_capture
from pydantic import BaseModel


class NoFlows(ValueError):
    """A readable capture without a conversation to classify."""


class Conversation(BaseModel):
    flow: str  # the heavier direction, e.g. "udp 10.0.0.1:49003 -> 10.0.0.2:5000"
    packets: int
    duration_s: float
    label: str
    platform: str  # "" when neither path names one
    confidence: float
    source: Literal["signature", "behaviour"]
    platform_source: Literal["signature", "behaviour", ""]
    decision_s: float | None  # None: never decided
    ndpi_app: str  # nDPI's application ("" when nDPI did not run)


class CaptureReport(BaseModel):
    capture: str
    model_version: str
    conversations: list[Conversation]
    share: dict[str, float]  # label source → share of conversations
    counters: dict[str, int]  # the pcap twin's (packets, parse failures, …)
    dpi_error: str = ""  # why the signature path was off for this capture


def classify_capture(
    capture: str | os.PathLike[str],
    model: FlowModel,
    model_version: str = "",
    min_packets: int = 4,
    prefixes: Sequence[float] = PREFIXES_S,
) -> CaptureReport:
    """Classify every conversation of `capture` with at least `min_packets` packets.

    Raises what `records.read_capture` raises for a capture that cannot be read (CaptureError
    naming the packet and byte offset, ValueError, OSError) and NoFlows for one without a
    conversation; a capture nDPI cannot read loses only the signature path (`dpi_error`)."""
    path = Path(capture)
    records, counters = read_capture(path)
    convs = conversations(records)
    if not convs:
        skipped = ", ".join(f"{k} {v}" for k, v in counters.items()
                            if v and k not in ("packets", "accounted", "flows_created", "records"))
        raise NoFlows(f"{path}: no flows: {counters.get('packets', 0)} packets, none of them "
                      f"an IP flow the probe accounts ({skipped or 'nothing skipped'})")
    keys = [k for k, recs in convs.items() if sum(r.packets for r in recs) >= min_packets]
    if not keys:
        raise NoFlows(f"{path}: no flow with at least {min_packets} packets "
                      f"({len(convs)} shorter ones; see --min-packets)")
    dpi: dict = {}
    dpi_error = ""
    try:
        dpi = dissect(path)
    except DpiError as exc:
        dpi_error = str(exc)

    rows, owner, pre = [], [], []
    for i, k in enumerate(keys):
        for p, x in prefix_windows(LabelledFlow("", "", convs[k]), prefixes):
            rows.append(x)
            owner.append(i)
            pre.append(p)
    X = np.vstack(rows)
    proba = model.predict_proba(X)
    classes = model.classes_
    plat, _ = model.predict_platform(X)
    owner_a, pre_a = np.array(owner), np.array(pre)

    out: list[Conversation] = []
    for i, k in enumerate(keys):
        recs = convs[k]
        idx = np.where(owner_a == i)[0]
        label, decided_at = decision.decide(proba[idx], pre_a[idx], classes,
                                            model.decision_threshold_)
        label = label or str(classes[int(proba[idx[-1]].argmax())])
        conf = float(proba[idx[-1], list(classes).index(label)])
        down, up = split_directions(recs)
        head = (down or up)[0].five_tuple
        lo = min(r.interval_start_ns for r in recs)
        hi = max(r.interval_end_ns for r in recs)
        d: DpiFlow | None = dpi.get(k)
        sig = d.signature() if d is not None else None
        common = dict(flow=flow_label(head), packets=sum(r.packets for r in recs),
                      duration_s=round((hi - lo) / NS, 3), ndpi_app=d.app if d else "")
        if sig is not None and sig[0]:
            out.append(Conversation(
                **common, label=sig[0], platform=sig[1], confidence=1.0, source="signature",
                platform_source="signature", decision_s=d.decision_s,
            ))
            continue
        platform, platform_source = "", ""
        if sig is not None:
            platform, platform_source = sig[1], "signature"
        elif label == "cloud_gaming":
            platform, platform_source = str(plat[idx[-1]]), "behaviour"
        out.append(Conversation(
            **common, label=label, platform=platform, confidence=round(conf, 3),
            source="behaviour", platform_source=platform_source, decision_s=decided_at,
        ))
    n = len(out)
    share = {s: sum(1 for c in out if c.source == s) / n for s in ("signature", "behaviour")}
    return CaptureReport(capture=str(path), model_version=model_version, conversations=out,
                         share=share, counters=counters, dpi_error=dpi_error)
