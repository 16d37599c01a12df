"""The loop's report: per fault, the lever that acted first and its level (node: the agent's
micro loop; micro/global: the policy engine), onset → detection → decision → action applied →
verified → gaming latency recovered, and the gaming flows' latency before, during and after.

Times come from two clocks that are the same clock here (CLOCK_REALTIME on one machine): fault
onsets and the gaming packets' one-way delays from the lab (ground truth, measured at the
receivers), detection/decision/applied/verified from the records the services wrote to the
store: the policy engine's under its run's source id, the node agent's own (level NODE: RFC 9957
sanctions, the latency guard's promotions) under `<node>/node-agent`. Recovery is read from
the ground truth: the end of the last 250 ms window whose gaming p99 exceeded the SLO, when
every later window of the fault stays under it.
"""

from __future__ import annotations

import base64
import html
import io
import time
from pathlib import Path

import clickhouse_connect
from cgloop.lab.scenario import FaultEvent
from cgloop.lab.traffic.stats import Packets
from pydantic import BaseModel
from rich.console import Console
from rich.table import Table

RECOVERY_WINDOW_NS = 250_000_000
# Detection kinds that concern a fault's victims or culprits (not classification, anomalies):
# SLO breaches, L4S abuse, overloads of a node or of a chain function, INT's switch queues.
FAULT_KINDS = tuple(
    f"DETECTION_KIND_{k}" for k in (
        "SLO_LATENCY", "SLO_JITTER", "SLO_LOSS", "SLO_THROUGHPUT",
        "L4S_UNRESPONSIVE_ECN", "L4S_MICROBURST", "CLASSIC_QUEUE_BURST", "QUEUE_OVERLOAD",
        "NODE_OVERLOAD", "FUNCTION_OVERLOAD", "QUEUE_CONGESTION", "PACKET_DROPS",
    )
)
# A session joining is no fault: what the loop answers is its classification (then placement).
JOIN_KINDS = ("DETECTION_KIND_GAMING_FLOW_CLASSIFIED",)
SESSION_JOIN = "session_join"
# Where each lever acts: the loop level the report names (node: the agent alone; micro: an
# engine policy on one node; global: across nodes or through ONOS) comes from the action record.
MAX_LEVERS = 12  # engine actions listed per fault


def _short(enum_name: str, prefix: str) -> str:
    """`DETECTION_KIND_SLO_LATENCY` → `slo_latency` (the store keeps protobuf enum names)."""
    return enum_name.removeprefix(prefix).lower()


class Latency(BaseModel):
    p50_ms: float | None = None
    p99_ms: float | None = None
    loss_pct: float | None = None
    packets: int = 0


class Lever(BaseModel):
    """One engine action during a fault: what, at which level, on which node or switch, its
    times (ns) and how it ended."""

    operation: str
    level: str
    node: str
    decision_ns: int | None = None
    applied_ns: int | None = None
    verified_ns: int | None = None
    verdict: str | None = None
    detail: str = ""

    @property
    def verified(self) -> bool:
        return (self.verdict or "").startswith("verified")


class FaultOutcome(BaseModel):
    trial: str
    fault: str
    kind: str
    # where the fault was applied: its node (a CPU hog's), else its flood's destination
    target: str | None = None
    onset_ns: int
    end_ns: int
    # how much later than scheduled the fault's generator really sent its first packet (a
    # Python generator starting on a loaded machine); onset_ns is that first packet
    late_start_ms: float = 0.0
    # ground truth: did the fault push any gaming flow's p99 over the SLO, and when it was
    # back under (None: affected until the fault ended)
    affected: bool = False
    recovered_ns: int | None = None
    detection_ns: int | None = None
    detection_kind: str | None = None
    decision_ns: int | None = None
    applied_ns: int | None = None
    verified_ns: int | None = None
    verdict: str | None = None
    action: str | None = None
    # the first engine action's node (or ONOS device), and every engine action of the fault
    node: str | None = None
    levers: list[Lever] = []
    # every detection between onset - 1 s and the fault's end: (ms after onset, kind, subject)
    detections: list[tuple[float, str, str]] = []
    # the node's micro loop during the fault: (ms after onset, operation, flow "src>dst" ports)
    node_actions: list[tuple[float, str, str]] = []
    # flows ("src>dst" ports) the latency guard held in the gaming class when the fault began:
    # promoted earlier (a queue before the fault) and not released since. A fault cannot
    # queue such a flow in the class it floods, so the node has nothing left to do for it.
    node_placed_at_onset: list[str] = []
    first_sanction_ns: int | None = None  # RFC 9957 queue protection's first sanction
    first_promotion_ns: int | None = None  # the latency guard's first promotion
    # the first lever applied during the fault, whichever level: node (the agent alone),
    # micro or global (the policy engine), and when
    first_level: str | None = None
    first_lever: str | None = None
    first_node: str | None = None
    first_ns: int | None = None
    before: Latency = Latency()
    during: Latency = Latency()
    after: Latency = Latency()

    def ms(self, t: int | None) -> float | None:
        return None if t is None else (t - self.onset_ns) / 1e6


class LoopReport(BaseModel):
    run_dir: str
    slo_p99_ms: float
    loop: str
    faults: list[FaultOutcome]
    gaming_flows_classified: int
    rows: dict[str, int]
    # what is emulated and what was left out of the run (one line each), from the loop
    notes: list[str] = []
    # what the ONOS contract server recorded (flows, intents, meters)
    onos: dict[str, int] = {}

    def levers(self) -> dict[str, tuple[int, int]]:
        """{operation: (times it acted, times verified)} over the run: the engine's levers,
        and the node's own (level node: acted, verified by the node as it applies them)."""
        out: dict[str, list[int]] = {}
        for f in self.faults:
            for lever in f.levers:
                n = out.setdefault(lever.operation, [0, 0])
                n[0] += 1
                n[1] += lever.verified
            for _, op, _ in f.node_actions:
                if op != "release":
                    out.setdefault(f"{op} (node)", [0, 0])[0] += 1
        return {k: (v[0], v[1]) for k, v in sorted(out.items())}


def _worst(packets: list[Packets], start: int, end: int) -> Latency:
    """The gaming session with the highest p99 in [start, end)."""
    worst = Latency()
    for p in packets:
        s = p.window(start, end).summary()
        if s.p99_ms is not None and (worst.p99_ms is None or s.p99_ms > worst.p99_ms):
            worst = Latency(p50_ms=s.p50_ms, p99_ms=s.p99_ms, loss_pct=s.loss_pct,
                            packets=s.packets)
    return worst


def recovery(
    packets: list[Packets], onset: int, end: int, slo_ms: float
) -> tuple[bool, int | None]:
    """(affected, recovered_ns) from every gaming flow's downstream packets during the fault."""
    last_bad = None
    t = onset
    while t < end:
        p99s = [
            w.summary().p99_ms for p in packets if len(w := p.window(t, t + RECOVERY_WINDOW_NS))
        ]
        if any(v is not None and v > slo_ms for v in p99s):
            last_bad = t + RECOVERY_WINDOW_NS
        t += RECOVERY_WINDOW_NS
    if last_bad is None:
        return False, None
    if last_bad >= end:
        return True, None
    return True, last_bad


def _ns(x) -> int | None:
    """ns since the epoch of a store time (a datetime: µs exact, no float rounding)."""
    if x is None:
        return None
    if hasattr(x, "timestamp"):
        ns = int(x.replace(microsecond=0).timestamp()) * 1_000_000_000 + x.microsecond * 1000
    else:
        ns = round(float(x) * 1e9)
    return ns if ns > 0 else None


def effective_onset(ev: FaultEvent) -> int:
    """When the fault really began: a generator fault's first packet when it left later than
    its scheduled onset (its sender's first send, else the first packet its receiver saw)."""
    up = ev.detail.get("up") if isinstance(ev.detail.get("up"), dict) else {}
    for first in (up.get("first_send_ns"), ev.detail.get("first_packet_ns")):
        if isinstance(first, int) and first > ev.onset_ns:
            return first
    return ev.onset_ns


# Detections are looked for from this long before onset: a fault can be seen as it is applied.
LOOKBACK_NS = 1_000_000_000


def loop_timeline(
    client, onset: int, end: int, run_source: str, kinds: tuple[str, ...] = FAULT_KINDS
) -> dict:
    """The first fault detection from just before onset (of `kinds`), and every engine action
    it and the fault's later detections led to (the first one also in the flat fields)."""
    out: dict = {}
    every = client.query(
        "SELECT id, kind, time, labels['flow'] FROM cgloop.detections FINAL "
        "WHERE time >= fromUnixTimestamp64Nano({a:Int64}) "
        "AND time < fromUnixTimestamp64Nano({b:Int64}) ORDER BY time LIMIT 1000",
        parameters={"a": onset - LOOKBACK_NS, "b": end},
    ).result_rows
    out["detections"] = [
        (round((_ns(t) - onset) / 1e6, 1), _short(k, "DETECTION_KIND_"), subject)
        for _, k, t, subject in every[:200]
    ]
    rows = [r for r in every if r[1] in kinds]
    if not rows:
        return out
    out["detection_kind"] = _short(rows[0][1], "DETECTION_KIND_")
    out["detection_ns"] = _ns(rows[0][2])
    ids = [r[0] for r in rows]
    acts = client.query(
        "SELECT id, operation, parameters, time, level, target_node_id, target_device_id "
        "FROM cgloop.actions FINAL "
        "WHERE hasAny(reason_detection_ids, {ids:Array(String)}) AND source_id = {src:String} "
        "AND rollback_of_action_id = '' ORDER BY time LIMIT {n:UInt32}",
        parameters={"ids": ids, "src": run_source, "n": MAX_LEVERS},
    ).result_rows
    levers = []
    for aid, op, params, t, level, node, device in acts:
        op = _short(op, "ACTION_OPERATION_")
        lever = Lever(
            operation=op,
            level=_short(level, "ACTION_LEVEL_") or "global",
            # ONOS's levers act on a device (the engine may fill node_id with its switch id)
            node=(device or node if op.startswith("onos_") else node or device) or "?",
            decision_ns=_ns(t),
            detail=",".join(f"{k}={v}" for k, v in sorted(params.items())),
        )
        results = client.query(
            "SELECT state, verdict, applied, verified FROM cgloop.action_results FINAL "
            "WHERE action_id = {id:String} ORDER BY time",
            parameters={"id": aid},
        ).result_rows
        for state, verdict, applied, verified in results:
            if _ns(applied):
                lever.applied_ns = _ns(applied)
            if _ns(verified):
                lever.verified_ns = _ns(verified)
            state = _short(state, "ACTION_STATE_")
            verdict = _short(verdict or "", "VERDICT_")
            lever.verdict = (
                f"{state} ({verdict})" if verdict not in ("", "unspecified") else state
            )
        levers.append(lever)
    if not levers:
        return out
    first = levers[0]
    out.update(
        levels=levers, level=first.level, node=first.node,
        action=f"{first.operation} {first.detail}".strip(), decision_ns=first.decision_ns,
        applied_ns=first.applied_ns, verified_ns=first.verified_ns, verdict=first.verdict,
    )
    return out


# What the node's micro loop records (cgloop.actions.v1, level NODE); the agent's header source.
SANCTION = "queue_protection_sanction"
PROMOTION = "reprioritise_flow"
# The latency guard's releases are REPRIORITISE_FLOW too; its cause says which (`released: …`).
RELEASED = "released"
RELEASE = "release"


NODE_FIELDS = ("node_actions", "first_sanction_ns", "first_promotion_ns")


def node_source(node: str) -> str:
    return f"{node}/node-agent"


def _nodes(node: str | list[str]) -> list[str]:
    return [node] if isinstance(node, str) else list(node)


def node_timeline(client, onset: int, end: int, node: str | list[str]) -> dict:
    """The agents' own actions applied in [onset, end) on `node` (one or several): sanctions,
    promotions, frequency."""
    rows = client.query(
        "SELECT a.id, a.operation, a.time, a.target_flow_src_port, a.target_flow_dst_port, "
        "r.applied, a.cause, a.source_id FROM (SELECT id, operation, time, "
        "target_flow_src_port, target_flow_dst_port, cause, source_id FROM cgloop.actions "
        "FINAL WHERE source_id IN {src:Array(String)} "
        "AND level = 'ACTION_LEVEL_NODE' AND time >= fromUnixTimestamp64Nano({a:Int64}) "
        "AND time < fromUnixTimestamp64Nano({b:Int64})) AS a "
        "LEFT JOIN (SELECT action_id, max(applied) AS applied FROM cgloop.action_results FINAL "
        "GROUP BY action_id) AS r ON r.action_id = a.id ORDER BY a.time LIMIT 1000",
        parameters={"src": [node_source(n) for n in _nodes(node)], "a": onset, "b": end},
    ).result_rows
    out: dict = {"node_actions": []}
    for _, op, t, sport, dport, applied, cause, source in rows:
        at = _ns(applied) or _ns(t)
        if at is None:
            continue
        op = _short(op, "ACTION_OPERATION_")
        if op == PROMOTION and cause.startswith(RELEASED):
            op = RELEASE
        out["node_actions"].append((round((at - onset) / 1e6, 1), op, f"{sport}>{dport}"))
        if op == RELEASE:
            continue  # the guard undoing a promotion: not a lever against the fault
        key = {SANCTION: "first_sanction_ns", PROMOTION: "first_promotion_ns"}.get(op)
        if key and key not in out:
            out[key] = at
        if "first_ns" not in out:
            out.update(first_ns=at, first_level="node", first_lever=op,
                       first_node=source.removesuffix("/node-agent"))
    return out


PLACEMENT_LOOKBACK_NS = 120_000_000_000  # longer than the guard's protections live (30 s)


def node_placed_at(client, onset: int, node: str | list[str]) -> list[str]:
    """Flows whose last move by a node's guard before `onset` was a promotion."""
    rows = client.query(
        "SELECT target_flow_src_port, target_flow_dst_port, argMax(cause, time) FROM "
        "cgloop.actions FINAL WHERE source_id IN {src:Array(String)} "
        "AND level = 'ACTION_LEVEL_NODE' "
        "AND operation = 'ACTION_OPERATION_REPRIORITISE_FLOW' "
        "AND time >= fromUnixTimestamp64Nano({a:Int64}) "
        "AND time < fromUnixTimestamp64Nano({b:Int64}) "
        "GROUP BY target_flow_src_port, target_flow_dst_port ORDER BY 1, 2",
        parameters={"src": [node_source(n) for n in _nodes(node)],
                    "a": onset - PLACEMENT_LOOKBACK_NS, "b": onset},
    ).result_rows
    return [f"{sport}>{dport}" for sport, dport, cause in rows if not cause.startswith(RELEASED)]


def first_lever(timeline: dict, node: dict, onset: int) -> dict:
    """The node's first action or the engine's first applied one, whichever came first."""
    out = {k: node[k] for k in ("first_ns", "first_level", "first_lever", "first_node")
           if k in node}
    applied = timeline.get("applied_ns")
    if applied and applied >= onset and (out.get("first_ns") is None or applied < out["first_ns"]):
        out = {
            "first_ns": applied,
            "first_level": timeline.get("level", "global"),
            "first_lever": (timeline.get("action") or "").split(" ")[0] or None,
            "first_node": timeline.get("node"),
        }
    return out


def build_report(
    store_url: str,
    run_dir: Path,
    trials: list[tuple[str, list[FaultEvent], list[Packets]]],
    slo_ms: float,
    run_source: str,
    loop: str,
    wait_s: float = 30.0,
    node: str | list[str] = "edge",
    notes: list[str] | None = None,
    onos: dict[str, int] | None = None,
) -> LoopReport:
    """Wait until the store holds the run's last actions/results (the sink commits in batches),
    then put the timeline of every fault together."""
    client = clickhouse_connect.get_client(dsn=store_url)
    faults: list[FaultOutcome] = []
    last_end = max((ev.end_ns or ev.onset_ns for _, evs, _ in trials for ev in evs), default=0)
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        n = client.query(
            "SELECT count() FROM cgloop.flow_records WHERE interval_end >= "
            "fromUnixTimestamp64Nano({t:Int64})", parameters={"t": last_end},
        ).result_rows[0][0]
        if n:
            break
        time.sleep(1)
    time.sleep(2)  # the detections/actions topics flush on their own batch timers
    for trial, events, packets in trials:
        for ev in events:
            onset = effective_onset(ev)
            end = max(ev.end_ns or onset, onset)
            span = end - onset
            affected, recovered = recovery(packets, onset, end, slo_ms)
            kinds = JOIN_KINDS if ev.kind == SESSION_JOIN else FAULT_KINDS
            timeline = loop_timeline(client, onset, end, run_source, kinds)
            local = node_timeline(client, onset, end, node)
            o = FaultOutcome(
                trial=trial, fault=ev.id, kind=ev.kind, onset_ns=onset, end_ns=end,
                target=ev.spec.get("node") or ev.spec.get("dst") or ev.spec.get("client"),
                late_start_ms=(onset - ev.onset_ns) / 1e6, affected=affected,
                recovered_ns=recovered, levers=timeline.get("levels", []),
                **{k: v for k, v in timeline.items() if k not in ("level", "levels")},
                **{k: v for k, v in local.items() if k in NODE_FIELDS},
                **first_lever(timeline, local, onset),
                node_placed_at_onset=node_placed_at(client, onset, node),
            )
            o.before = _worst(packets, onset - span, onset)
            o.during = _worst(packets, onset, end)
            o.after = _worst(packets, end + 1_000_000_000, end + 1_000_000_000 + span)
            faults.append(o)
    counts = {}
    for table in ("flow_records", "probe_records", "node_samples", "int_queue_records",
                  "detections", "actions", "action_results"):
        counts[table] = client.query(f"SELECT count() FROM cgloop.{table}").result_rows[0][0]
    classified = client.query(
        "SELECT count(DISTINCT flow_src_port, flow_dst_port) FROM cgloop.detections "
        "WHERE kind = 'DETECTION_KIND_GAMING_FLOW_CLASSIFIED' "
        "AND time >= fromUnixTimestamp64Nano({t:Int64})",
        parameters={"t": min((ev.onset_ns for _, evs, _ in trials for ev in evs), default=0)
                    - 60_000_000_000},
    ).result_rows[0][0]
    report = LoopReport(
        run_dir=str(run_dir), slo_p99_ms=slo_ms, loop=loop, faults=faults,
        gaming_flows_classified=classified, rows=counts, notes=notes or [], onos=onos or {},
    )
    (run_dir / "loop-report.json").write_text(report.model_dump_json(indent=1))
    return report


def _f(x: float | None, fmt: str = "{:.0f}") -> str:
    return "-" if x is None else fmt.format(x)


def first_cell(o: FaultOutcome) -> str:
    """`12 ms reprioritise_flow (node) edge1`: when, what, which level and where acted
    first."""
    if o.first_ns is None:
        return "none"
    where = f" {o.first_node}" if o.first_node else ""
    return f"{_f(o.ms(o.first_ns))} ms {o.first_lever or '?'} ({o.first_level}){where}"


def fault_cell(o: FaultOutcome) -> str:
    """`trial00-congestion-1 (congestion) @ home1`: the fault, its kind and where it was."""
    return f"{o.fault} ({o.kind})" + (f" @ {o.target}" if o.target else "")


def levers_cell(o: FaultOutcome) -> str:
    """Each engine action of the fault: `set_chain micro edge1: verified (improved)`."""
    if not o.levers:
        return "-"
    return "\n".join(
        f"{lv.operation} {lv.level} {lv.node}: {lv.verdict or 'no result'}" for lv in o.levers
    )


def summary_lines(report: LoopReport) -> list[str]:
    """Under the table: which levers acted and were verified, what is emulated, the store."""
    acted = report.levers()
    lines = ["levers (acted / verified): " + (", ".join(
        f"{op} {n}/{v}" if not op.endswith("(node)") else f"{op} {n}"
        for op, (n, v) in acted.items()) or "none")]
    if report.onos:
        lines.append("ONOS contract server recorded: " + ", ".join(
            f"{k} {v}" for k, v in report.onos.items()))
    lines += [f"note: {n}" for n in report.notes]
    lines.append(f"gaming flows classified: {report.gaming_flows_classified}; rows in the "
                 "store: " + ", ".join(f"{k} {v}" for k, v in report.rows.items()))
    return lines


# The terminal table fits this many columns (report.html keeps the full table).
TERMINAL_WIDTH = 100


def print_report(report: LoopReport, console: Console) -> None:
    """The per-fault table for a terminal, at most `TERMINAL_WIDTH` columns wide (narrower
    when the console is): decided/applied/verified share a column, and a long value folds
    onto the next line, never cut. report.html has one column per step."""
    width = min(console.width, TERMINAL_WIDTH)
    t = Table(title=f"cgloop closed loop ({report.loop}): gaming SLO p99 < "
              f"{report.slo_p99_ms:g} ms; times in ms after the fault's onset",
              show_lines=True, width=width)
    for col, ratio, least in (
            ("fault", 3, 10), ("first lever (level) node", 3, 10), ("detected", 2, 8),
            ("decided / applied / verified", 2, 8), ("recovered", 2, 9),
            ("engine's levers: level node: verdict", 4, 12),
            ("gaming p99 before / during / after", 2, 8)):
        t.add_column(col, ratio=ratio, min_width=least, overflow="fold")
    for o in report.faults:
        rec = ("not affected" if not o.affected
               else _f(o.ms(o.recovered_ns)) if o.recovered_ns else "not within the fault")
        t.add_row(
            fault_cell(o), first_cell(o),
            f"{_f(o.ms(o.detection_ns))} {o.detection_kind or ''}".strip(),
            f"{_f(o.ms(o.decision_ns))} / {_f(o.ms(o.applied_ns))} / "
            f"{_f(o.ms(o.verified_ns))}",
            rec,
            levers_cell(o),
            f"{_f(o.before.p99_ms, '{:.1f}')} / {_f(o.during.p99_ms, '{:.1f}')} / "
            f"{_f(o.after.p99_ms, '{:.1f}')} ms",
        )
    console.print(t, width=width)
    for line in summary_lines(report):  # plain text: a note may hold [brackets]
        console.print(line, width=width, overflow="fold", markup=False, highlight=False)


def _plot(report: LoopReport, trials_packets: dict[str, list[Packets]]) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = max(1, len(report.faults))
    fig, axes = plt.subplots(n, 1, figsize=(9, 2.6 * n), squeeze=False)
    for ax, o in zip(axes[:, 0], report.faults, strict=False):
        for p in trials_packets.get(o.trial, []):
            w = p.window(o.onset_ns - 5_000_000_000, o.end_ns + 5_000_000_000)
            if not len(w):
                continue
            ax.plot((w.send_ns - o.onset_ns) / 1e9, (w.recv_ns - w.send_ns) / 1e6, ",", alpha=0.5)
        ax.axhline(report.slo_p99_ms, color="k", lw=0.8, ls="--", label="SLO")
        ax.axvspan(0, (o.end_ns - o.onset_ns) / 1e9, color="tab:red", alpha=0.08, label="fault")
        for t, label, c in ((o.detection_ns, "detected", "tab:orange"),
                            (o.first_ns, f"first lever ({o.first_level})", "tab:purple"),
                            (o.applied_ns, "engine applied", "tab:green"),
                            (o.recovered_ns, "recovered", "tab:blue")):
            if t:
                ax.axvline((t - o.onset_ns) / 1e9, color=c, lw=1, label=label)
        ax.set_title(f"{o.fault} ({o.kind})", fontsize=9)
        ax.set_ylabel("one-way delay, ms")
        ax.set_yscale("log")
        ax.legend(fontsize=7, loc="upper right")
    axes[-1, 0].set_xlabel("seconds after the fault's onset")
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90)
    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode()


def write_html(report: LoopReport, path: Path, trials_packets: dict[str, list[Packets]]) -> Path:
    """A self-contained page: the table and the plots (PNG embedded)."""
    rows = []
    for o in report.faults:
        rec = ("not affected" if not o.affected
               else _f(o.ms(o.recovered_ns)) if o.recovered_ns else "not within the fault")
        cells = [fault_cell(o), first_cell(o),
                 f"{_f(o.ms(o.detection_ns))} {o.detection_kind or ''}",
                 _f(o.ms(o.decision_ns)), _f(o.ms(o.applied_ns)), _f(o.ms(o.verified_ns)), rec,
                 levers_cell(o),
                 f"{_f(o.before.p99_ms, '{:.1f}')} / {_f(o.during.p99_ms, '{:.1f}')} / "
                 f"{_f(o.after.p99_ms, '{:.1f}')}"]
        rows.append("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in cells) + "</tr>")
    head = "".join(f"<th>{h}</th>" for h in (
        "fault", "first lever (level)", "detected (ms)", "decided (ms)", "applied (ms)",
        "verified (ms)",
        "recovered (ms)", "engine's levers: level node: verdict",
        "gaming p99 before / during / after (ms)"))
    png = _plot(report, trials_packets)
    page = f"""<!doctype html><html><head><meta charset="utf-8"><title>cgloop loop report</title>
<style>body{{font-family:sans-serif;margin:2em}}td,th{{border:1px solid #ccc;padding:4px 8px;
font-size:13px}}table{{border-collapse:collapse}}</style></head><body>
<h1>cgloop closed loop ({html.escape(report.loop)})</h1>
<p>Gaming SLO: one-way p99 &lt; {report.slo_p99_ms:g} ms. Times in ms after each fault's onset.</p>
<ul>{"".join(f"<li>{html.escape(line)}</li>" for line in summary_lines(report))}</ul>
<table><tr>{head}</tr>{"".join(rows)}</table>
<h2>Gaming one-way delay around each fault</h2><img src="data:image/png;base64,{png}">
</body></html>"""
    path.write_text(page)
    return path


__all__ = [
    "Lever", "LoopReport", "build_report", "first_lever", "node_timeline", "print_report",
    "recovery", "write_html",
]
