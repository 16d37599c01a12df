"""Labelled flows from the real data in the lab's data folder (docs/sources.md) and the
synthetic generator.

Every source ends as LabelledFlow objects holding FlowRecords, so features always come from
`features.window_features`:

* Xbox Cloud Gaming (dcomp-leris/VR-AR-CG-network-telemetry, BSD-3-Clause): the files give one
  summary row per flow direction (mean size, mean gap, frames). Each row is expanded into a
  stationary packet sequence with those means (no variance is published, so none is invented)
  and read by the probe's pcap twin like any capture (`packets.py`). Label: the UDP pair with
  an Xbox Cloud Gaming server in 13.104.0.0/16 on a port in 1000-1120 is `cloud_gaming`
  (platform xc); every other row is real background (`web_other`).
* nDPI test pcaps (ntop/nDPI, LGPL-3.0): records from the probe's pcap twin
  (`records.records_from_pcap`, i.e. `cgloop.pcaprecords`); each conversation is labelled by
  nDPI run on the capture (`dpi.dissect`, through nfstream), not from the `.out` files.
* Synthetic platform profiles (`synthetic.py`): marked synthetic everywhere.
"""

from __future__ import annotations

import csv
import hashlib
import ipaddress
import zlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from cgloop.analytics.dpi import dissect
from cgloop.analytics.features import FEATURE_NAMES, conversations, window_features
from cgloop.analytics.packets import Packet, records_from_packets
from cgloop.analytics.records import NS, conversation_key, records_from_pcap
from cgloop.analytics.synthetic import PROFILES, gaming_records, random_session_records
from cgloop.v1.common_pb2 import FiveTuple
from cgloop.v1.flow_pb2 import FlowRecord

CLASSES: tuple[str, ...] = (
    "cloud_gaming",
    "video_streaming",
    "realtime_call",
    "online_game",
    "bulk",
    "web_other",
)
# Prefix lengths (s) at which training examples and time-to-decision are taken.
PREFIXES_S: tuple[float, ...] = (0.5, 1.0, 2.0, 5.0)
XBOX_SERVERS = ipaddress.ip_network("13.104.0.0/16")
XBOX_PORTS = range(1000, 1121)
# Expanded Xbox rows cover at most this much of the flow: they are stationary by construction.
XBOX_EXPAND_S = 6.0
# Random synthetic sessions (`synthetic.draw_session`) in training by default.
RANDOM_SESSIONS = 120


def default_data_root() -> Path:
    from cgloop.config import find_project_root

    root = find_project_root()
    candidates = [Path("/work/shared/data")]
    if root is not None:
        candidates.insert(0, root.parent / "shared" / "data")
    return next((c for c in candidates if c.is_dir()), candidates[0])


@dataclass
class LabelledFlow:
    capture: str  # the unit held out in evaluation
    label: str
    records: list[FlowRecord]
    platform: str = ""
    synthetic: bool = False
    source: str = ""
    name: str = ""

    @property
    def span_s(self) -> float:
        lo = min(r.interval_start_ns for r in self.records)
        hi = max(r.interval_end_ns for r in self.records)
        return (hi - lo) / NS


# ---------------------------------------------------------------- Xbox Cloud Gaming summaries


def _f(value: str) -> float:
    try:
        return float(value)
    except ValueError:
        return 0.0


def _expand_row(row: dict[str, str], seed: int, start_ns: int) -> list[Packet]:
    """A stationary packet sequence with the row's means (size, gaps, frames)."""
    src = ipaddress.ip_address(row["SrcIP"]).packed
    dst = ipaddress.ip_address(row["DstIP"]).packed
    transport = row["Protocol"].upper()
    proto = {"UDP": 17, "TCP": 6}.get(transport, 0)
    key = (src, dst, int(_f(row["SrcPort"])), int(_f(row["DstPort"])), proto)
    n_total = max(1, int(_f(row["FlowSizePackets"])))
    size = max(20, round(_f(row["PS"])))
    ipi = max(0.0, _f(row["IPI"]))
    frames, ifi, per_frame = int(_f(row["NumFrames"])), _f(row["IFI"]), _f(row["FS(PKT)"])
    rng = np.random.default_rng(seed)
    out: list[Packet] = []
    if frames > 1 and ifi > 0 and per_frame >= 1:
        t, n = 0.0, 0
        while n < n_total and t < XBOX_EXPAND_S:
            k = int(per_frame) + int(rng.random() < per_frame - int(per_frame))
            for i in range(max(1, k)):
                out.append(Packet(ts_ns=start_ns + int((t + i * 50e-6) * NS), key=key, length=size))
                n += 1
            t += ifi
    else:
        for i in range(min(n_total, 100_000)):
            t = i * ipi
            if t > XBOX_EXPAND_S and i:
                break
            out.append(Packet(ts_ns=start_ns + int(t * NS), key=key, length=size))
    return out


def _is_xbox_game(row: dict[str, str]) -> bool:
    if row.get("Protocol", "").upper() != "UDP":
        return False
    for ip, port in ((row["SrcIP"], row["SrcPort"]), (row["DstIP"], row["DstPort"])):
        try:
            if ipaddress.ip_address(ip) in XBOX_SERVERS and int(_f(port)) in XBOX_PORTS:
                return True
        except ValueError:
            continue
    return False


def xbox_flows(root: Path, max_background: int | None = None, seed: int = 0) -> list[LabelledFlow]:
    base = root / "xbox-cloud-gaming"
    out: list[LabelledFlow] = []
    files = sorted(base.glob("*/*/*/Features/*.csv"))
    rng = np.random.default_rng(seed)
    for path in files:
        game, players = path.parts[-4], path.parts[-3]
        capture = f"xbox/{path.stem}"
        with path.open(newline="") as fh:
            rows = list(csv.DictReader(fh))
        pairs: dict[tuple, list[dict[str, str]]] = {}
        for row in rows:
            try:
                ft = FiveTuple(
                    src_addr=ipaddress.ip_address(row["SrcIP"]).packed,
                    dst_addr=ipaddress.ip_address(row["DstIP"]).packed,
                    src_port=int(_f(row["SrcPort"])),
                    dst_port=int(_f(row["DstPort"])),
                    ip_protocol=17 if row["Protocol"].upper() == "UDP" else 6,
                )
            except (ValueError, KeyError):
                continue  # a malformed row costs only itself
            pairs.setdefault(conversation_key(ft), []).append(row)
        keys = sorted(pairs)
        game_keys = [k for k in keys if _is_xbox_game(pairs[k][0])]
        bg_keys = [k for k in keys if k not in set(game_keys)]
        if max_background is not None and len(bg_keys) > max_background:
            pick = rng.choice(len(bg_keys), size=max_background, replace=False)
            bg_keys = [bg_keys[i] for i in sorted(pick)]
        for j, k in enumerate(game_keys + bg_keys):
            is_game = j < len(game_keys)
            start = 1_700_000_000 * NS
            packets: list[Packet] = []
            for i, row in enumerate(pairs[k]):
                seed = zlib.crc32(f"{capture}/{j}/{i}".encode())
                packets += _expand_row(row, seed=seed, start_ns=start)
            recs = records_from_packets(packets, f"dataset/{capture}")
            if not recs:
                continue
            out.append(
                LabelledFlow(
                    capture=capture,
                    label="cloud_gaming" if is_game else "web_other",
                    platform="xc" if is_game else "",
                    records=recs,
                    source=f"xbox-cloud-gaming/{game}/{players}",
                    name=f"{capture}#{j}",
                )
            )
    return out


# ---------------------------------------------------------------- nDPI pcaps


def ndpi_flows(root: Path, min_packets: int = 4) -> list[LabelledFlow]:
    """Every conversation of nDPI's test pcaps with at least `min_packets` packets, its records
    from the probe's pcap twin, its label from nDPI itself run on the same capture
    (`dpi.dissect`, nfstream): the application nDPI names, mapped by `dpi.ndpi_class`."""
    out: list[LabelledFlow] = []
    for pcap in sorted((root / "ndpi-pcaps").glob("*.pcap*")):
        if pcap.suffix == ".out":
            continue
        labels = dissect(pcap)
        for key, recs in conversations(records_from_pcap(pcap)).items():
            if key not in labels or sum(r.packets for r in recs) < min_packets:
                continue
            flow = labels[key]
            cls, platform = flow.label()
            out.append(
                LabelledFlow(
                    capture=f"ndpi/{pcap.stem}", label=cls, platform=platform, records=recs,
                    source=f"ndpi-pcaps/{pcap.name} ({flow.app})",
                    name=f"ndpi/{pcap.stem}#{flow.app}",
                )
            )
    return out


def synthetic_flows(
    per_platform: int = 3, duration_s: float = 6.0, seed: int = 0, random_sessions: int = 0
) -> list[LabelledFlow]:
    """`per_platform` sessions of each published platform profile (they name a platform, for
    the platform forest) and `random_sessions` sessions whose bitrate, frame rate, GOP, pacing,
    input cadence, RTP visibility, jitter, loss and adaptation are drawn at random
    (`synthetic.draw_session`; no platform). All marked synthetic."""
    out: list[LabelledFlow] = []
    for k in range(random_sessions):
        d, recs = random_session_records(duration_s, seed=(seed + 7) * 100_003 + 2 * k)
        out.append(LabelledFlow(
            capture=f"synthetic/random/{k}", label="cloud_gaming", records=recs, synthetic=True,
            source=(f"synthetic random {d.down_mbps:.1f} Mbit/s {d.fps:.0f} fps "
                    f"gop {d.gop_frames} rtp {int(d.rtp)}"),
            name=f"synthetic/random/{k}",
        ))
    for i, platform in enumerate(sorted(PROFILES)):
        for k in range(per_platform):
            recs = gaming_records(platform, duration_s, seed=seed * 1000 + i * 100 + k)
            out.append(
                LabelledFlow(
                    capture=f"synthetic/{platform}/{k}", label="cloud_gaming", platform=platform,
                    records=recs, synthetic=True, source=f"synthetic profile {platform}",
                    name=f"synthetic/{platform}/{k}",
                )
            )
    return out


# ---------------------------------------------------------------- examples


@dataclass
class Examples:
    """One row per (flow, prefix window): full feature vectors, labels, held-out groups."""

    X: np.ndarray
    y: np.ndarray
    platform: np.ndarray
    groups: np.ndarray  # capture ids
    flow: np.ndarray  # flow index into the source list
    prefix_s: np.ndarray
    synthetic: np.ndarray
    feature_names: tuple[str, ...] = FEATURE_NAMES
    sources: dict[str, str] = field(default_factory=dict)

    def digest(self) -> str:
        """Training-data hash: features, labels and groups, byte-exact."""
        h = hashlib.sha256()
        for arr in (self.X, self.y.astype(str), self.groups.astype(str)):
            h.update(np.ascontiguousarray(arr).tobytes())
        h.update(",".join(self.feature_names).encode())
        return h.hexdigest()

    def subset(self, mask: np.ndarray) -> Examples:
        return Examples(
            self.X[mask], self.y[mask], self.platform[mask], self.groups[mask], self.flow[mask],
            self.prefix_s[mask], self.synthetic[mask], self.feature_names, self.sources,
        )


def prefix_windows(flow: LabelledFlow, prefixes: Sequence[float] = PREFIXES_S):
    """(prefix length, features) for each prefix up to the flow's span (at least one)."""
    start = min(r.interval_start_ns for r in flow.records)
    span = flow.span_s
    out = []
    for p in prefixes:
        out.append((p, window_features(flow.records, start, start + int(p * NS))))
        if p >= span:
            break
    return out


def build_examples(
    flows: Sequence[LabelledFlow], prefixes: Sequence[float] = PREFIXES_S, progress=None
) -> Examples:
    rows, y, plat, groups, idx, pre, syn = [], [], [], [], [], [], []
    for i, f in enumerate(flows):
        for p, x in prefix_windows(f, prefixes):
            rows.append(x)
            y.append(f.label)
            plat.append(f.platform)
            groups.append(f.capture)
            idx.append(i)
            pre.append(p)
            syn.append(f.synthetic)
        if progress is not None:
            progress()
    return Examples(
        np.array(rows).reshape(-1, len(FEATURE_NAMES)), np.array(y), np.array(plat),
        np.array(groups), np.array(idx), np.array(pre), np.array(syn, dtype=bool),
        sources={f.capture: f.source for f in flows},
    )


def load_all(
    root: Path | None = None,
    max_background: int | None = 150,
    synthetic_per_platform: int = 3,
    include: Iterable[str] = ("xbox", "ndpi", "synthetic"),
    synthetic_random: int = RANDOM_SESSIONS,
) -> list[LabelledFlow]:
    root = root or default_data_root()
    include = set(include)
    flows: list[LabelledFlow] = []
    if "xbox" in include:
        flows += xbox_flows(root, max_background=max_background)
    if "ndpi" in include:
        flows += ndpi_flows(root)
    if "synthetic" in include and (synthetic_per_platform or synthetic_random):
        flows += synthetic_flows(synthetic_per_platform, random_sessions=synthetic_random)
    return flows


def lab_case_flows(n: int = 40, duration_s: float = 6.0, seed: int = 0) -> list[LabelledFlow]:
    """The non-circular cloud-gaming sessions (`labcases.py`): a generator training never
    uses, at bitrates outside the training range, clean and under loss, jitter and a rate cap.
    Marked synthetic; evaluated apart, never trained on."""
    from cgloop.analytics.labcases import case_records, draw_cases

    out = []
    for case in draw_cases(n, seed):
        out.append(LabelledFlow(
            capture=case.name, label="cloud_gaming", records=case_records(case, duration_s),
            synthetic=True, source=f"lab case {case.condition}", name=case.name,
        ))
    return out


def lab_other_flows(n: int = 30, duration_s: float = 6.0, seed: int = 0) -> list[LabelledFlow]:
    """Non-circular sessions that are NOT cloud gaming (`labothers.py`: adaptive video
    streaming, video calls, bulk downloads from the lab cases' generator, clean and under loss,
    jitter and a rate cap), for false cloud-gaming alarms on traffic no training capture
    resembles. Marked synthetic; evaluated apart, never trained on."""
    from cgloop.analytics.labothers import draw_other_cases, other_records

    return [LabelledFlow(
        capture=case.name, label=case.kind, records=other_records(case, duration_s),
        synthetic=True, source=f"lab case {case.kind} {case.condition}", name=case.name,
    ) for case in draw_other_cases(n, seed)]
