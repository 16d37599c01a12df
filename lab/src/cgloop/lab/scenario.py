"""Scenarios: background traffic for a while, faults on a schedule, a report at the end.

Every fault's onset (the moment its apply step began: tc change, BPF filter attach, iperf3
start; for a prepared generator, the instant it was scheduled to start sending) is recorded in
CLOCK_REALTIME ns, the clock the traffic generators stamp packets with, and written to
`events.jsonl` as it happens, so the loop benchmark can line onsets up with detections, actions
and the gaming flows' latency. When each traffic session begins sending (sessions may start
mid-scenario, `at:`) is written to `traffic.jsonl` as the run starts.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

from cgloop.lab.faults import ActiveFault, CoreCongestion, CpuHog, FaultSpec, Loss, RateCap
from cgloop.lab.lab import Lab
from cgloop.lab.sessions import (
    GamingSpec,
    MediaSession,
    Session,
    StartSignal,
    TrafficSpec,
    make_session,
)
from cgloop.lab.topology import Tier, Topology
from cgloop.lab.traffic.stats import DelaySummary
from cgloop.lab.yamlfile import load_yaml_model
from pydantic import BaseModel, ConfigDict, Field, model_validator

DEFAULT_SCENARIO = "scenario.yaml"  # for the default (v2) topology
V1_SCENARIO = "scenario-v1.yaml"  # for topology-v1.yaml
SETTLE_NS = 1_000_000_000
# Once every generator is ready: how far ahead the start is fixed (each reads it within 10 ms)
STARTUP_S = 0.5
# At most this long for the generators to be ready (a loaded 2-core VM took up to 17 s)
READY_TIMEOUT_S = 60.0


class Scenario(BaseModel):
    model_config = ConfigDict(extra="forbid")

    duration: float = Field(gt=0, le=3600, description="seconds of traffic")
    traffic: list[TrafficSpec] = Field(default_factory=list)
    faults: list[FaultSpec] = Field(default_factory=list)

    @model_validator(mode="after")
    def _faults_fit(self) -> Scenario:
        for i, t in enumerate(self.traffic):
            at = getattr(t, "at", 0.0)
            if at >= self.duration:
                raise ValueError(
                    f"traffic[{i}] ({t.kind}) starts at {at} s, not before the scenario's end "
                    f"({self.duration} s)"
                )
        for i, f in enumerate(self.faults):
            if f.at + f.duration > self.duration:
                raise ValueError(
                    f"faults[{i}] ({f.kind}) ends at {f.at + f.duration} s, after the scenario's "
                    f"{self.duration} s"
                )
        return self


NODE_FIELDS = ("server", "client", "a", "b", "src", "dst", "node", "peer")


def check_scenario(scenario: Scenario, topology: Topology) -> None:
    """Refuse, before anything starts, a scenario that does not fit the topology (unknown
    nodes, an egress that is no link or not shaped, a core flood that crosses no core link) or
    this machine (a CPU hog on a core the lab may not use)."""
    names = {n.name for n in topology.nodes}
    problems = []
    for section, specs in (("traffic", scenario.traffic), ("faults", scenario.faults)):
        for i, spec in enumerate(specs):
            where = f"{section}[{i}]"
            unknown = False
            for field in NODE_FIELDS:
                value = getattr(spec, field, None)
                if value is not None and value not in names:
                    problems.append(f"{where}.{field}: no node {value!r}")
                    unknown = True
            needs_bottleneck = spec.kind in ("rate_cap", "loss") and not getattr(spec, "node", 0)
            if needs_bottleneck and not topology.access_links():
                problems.append(f"{where} ({spec.kind}) needs a bottleneck link")
            if not unknown:
                problems += _fault_problems(where, spec, topology)
    if problems:
        raise ValueError(
            f"scenario does not fit topology {topology.name!r}: " + "; ".join(problems)
        )


def _fault_problems(where: str, spec, topo: Topology) -> list[str]:
    if isinstance(spec, Loss | RateCap) and spec.node and spec.peer:
        if spec.peer not in topo.neighbours(spec.node):
            return [f"{where}.peer: {spec.node} has no link to {spec.peer!r}"]
        if isinstance(spec, RateCap) and not topo.link_between(spec.node, spec.peer).bottleneck:
            return [f"{where}: the link {spec.node}-{spec.peer} is not shaped (no bottleneck)"]
    if isinstance(spec, CpuHog):
        usable = os.sched_getaffinity(0)
        missing = [c for c in spec.cores if c not in usable]
        if missing:
            return [f"{where}.cores: {missing} not usable here (cores {sorted(usable)})"]
    if isinstance(spec, CoreCongestion):
        hops = topo.shaped_hops(spec.src, spec.dst)
        core = {h for h in hops if topo.link_between(*h).bottleneck.tier == Tier.core}  # type: ignore[union-attr]
        if not core:
            return [f"{where}.dst: {spec.src}→{spec.dst} crosses no core link"]
        slowest = min(hops, key=lambda h: topo.egress_mbit(*h) or 0.0)
        if slowest not in core:
            return [
                f"{where}.dst: {spec.src}→{spec.dst} is limited by {slowest[0]}→{slowest[1]} "
                f"({topo.egress_mbit(*slowest):g} Mbit/s), not by the core: its TCP flows "
                "would queue there; name an edge router (e.g. dst: edge1)"
            ]
    return []


def load_scenario(path: Path | None = None, shipped: str = DEFAULT_SCENARIO) -> Scenario:
    """The scenario in `path` (YAML), or the shipped file `shipped` (the v2 default, or
    V1_SCENARIO)."""
    return load_yaml_model(Scenario, path, shipped, "scenario")


class FaultEvent(BaseModel):
    id: str
    kind: str
    spec: dict
    onset_ns: int
    end_ns: int | None = None
    apply_ms: float  # how long the apply step itself took
    detail: dict = Field(default_factory=dict)


class TrafficEvent(BaseModel):
    """When a traffic session begins sending (CLOCK_REALTIME ns, scheduled)."""

    id: str
    kind: str
    spec: dict
    start_ns: int


class FaultWindows(BaseModel):
    """One gaming flow's downstream delay before, during and after one fault."""

    fault: str
    session: str
    before: DelaySummary
    during: DelaySummary
    after: DelaySummary


class Report(BaseModel):
    run_dir: str
    started_ns: int
    faults: list[FaultEvent]
    sessions: dict[str, dict]
    windows: list[FaultWindows]
    traffic: list[TrafficEvent] = Field(default_factory=list)


class Runner:
    """Runs one scenario in a lab that is up; `on_event(text)` hears progress."""

    def __init__(
        self,
        lab: Lab,
        scenario: Scenario,
        run_dir: Path,
        on_event: Callable[[str], None] = lambda _: None,
    ) -> None:
        self.lab, self.scenario, self.run_dir, self.say = lab, scenario, run_dir, on_event
        self.sessions: dict[str, Session] = {}
        self.events: list[FaultEvent] = []
        self.traffic: list[TrafficEvent] = []

    def run(self) -> Report:
        sc = self.scenario
        check_scenario(sc, self.lab.topo)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        active: dict[str, tuple[ActiveFault, FaultEvent]] = {}
        # Everything starts at one instant, fixed once every generator that can wait is ready
        # (its socket bound), so slow process start-up shifts neither the traffic nor the
        # faults; t0 is that instant.
        signal = self.run_dir / "start.ns"
        for stale in (signal, *self.run_dir.glob("*.ready")):  # a reused folder's
            stale.unlink(missing_ok=True)
        faults = [
            ActiveFault(self.lab, f, f"{f.kind}{i}", self.run_dir) for i, f in enumerate(sc.faults)
        ]
        try:
            planned = []
            for i, spec in enumerate(sc.traffic):
                ident = f"{spec.kind}{i}"
                # A late session's generators start now too, silent until their instant.
                at = getattr(spec, "at", 0.0)
                planned.append((ident, spec, at))
                self.sessions[ident] = make_session(self.lab, ident, self.run_dir, spec)
                self.sessions[ident].start(sc.duration - at, StartSignal(signal, at))
            for fault in faults:
                fault.prepare(StartSignal(signal, fault.spec.at))
            self._await_ready(faults)
            start_ns = time.time_ns() + int(STARTUP_S * 1e9)
            StartSignal(signal).fix(start_ns)
            t0 = time.monotonic() + (start_ns - time.time_ns()) / 1e9
            for ident, spec, at in planned:
                begin_ns = start_ns + int(at * 1e9)
                session = self.sessions[ident]
                if isinstance(session, MediaSession):
                    session.started_at(begin_ns)
                started = TrafficEvent(
                    id=ident, kind=spec.kind, spec=spec.model_dump(), start_ns=begin_ns
                )
                self.traffic.append(started)
                with open(self.run_dir / "traffic.jsonl", "a") as f:
                    f.write(started.model_dump_json() + "\n")
                self.say(f"traffic {ident} started" + (f" (sends from t={at:g} s)" if at else ""))
            for fault in faults:
                fault.started_at(start_ns)
            self._sleep_until(t0)
            started_ns = start_ns
            steps = sorted(
                [(f.at, 1, i) for i, f in enumerate(sc.faults)]
                + [(f.at + f.duration, 0, i) for i, f in enumerate(sc.faults)]
            )  # at equal times, reverts (0) go before applies (1)
            for at, is_apply, i in steps:
                self._sleep_until(t0 + at)
                spec = sc.faults[i]
                ident = f"{spec.kind}{i}"
                if is_apply:
                    fault = faults[i]
                    t_apply = time.monotonic()
                    # Onset = when applying began: the kernel may act on it before apply returns.
                    began_ns = time.time_ns()
                    fault.apply()
                    event = FaultEvent(
                        id=ident,
                        kind=spec.kind,
                        spec=spec.model_dump(),
                        onset_ns=fault.onset_ns or began_ns,
                        apply_ms=(time.monotonic() - t_apply) * 1000,
                    )
                    active[ident] = (fault, event)
                    self._log(event)
                    self.say(f"t={at:5.1f} s  fault {ident} on")
                else:
                    fault, event = active.pop(ident)
                    fault.revert()
                    event.end_ns = time.time_ns()
                    event.detail = fault.detail
                    self.events.append(event)
                    self._log(event)
                    self.say(f"t={at:5.1f} s  fault {ident} off")
            self._sleep_until(t0 + sc.duration)
            for session in self.sessions.values():
                session.wait(15)
        finally:
            for fault, event in active.values():  # interrupted: undo what is still applied
                fault.revert()
                event.end_ns = time.time_ns()
                self.events.append(event)
            for fault in faults:  # prepared but never reached
                if fault.session and not any(f is fault for f, _ in active.values()):
                    fault.session.stop()
            for session in self.sessions.values():
                session.stop()
        return self.report(started_ns)

    def _await_ready(self, faults: list[ActiveFault]) -> None:
        """Until every generator waiting for the start signal is ready (or READY_TIMEOUT_S:
        the run then starts without the laggards and says which)."""
        sessions = [*self.sessions.values(), *(f.session for f in faults if f.prepared)]
        markers = [m for s in sessions if s is not None for m in s.ready_markers()]
        deadline = time.monotonic() + READY_TIMEOUT_S
        waited = time.monotonic()
        while (missing := [m for m in markers if not m.exists()]) and (
            time.monotonic() < deadline
        ):
            time.sleep(0.05)
        if missing:
            self.say(f"started without {len(missing)} generator(s) not ready after "
                     f"{READY_TIMEOUT_S:g} s: {', '.join(m.name for m in missing)}")
        elif (spent := time.monotonic() - waited) > 1.0:
            self.say(f"every generator ready after {spent:.1f} s")

    def _sleep_until(self, when: float) -> None:
        delay = when - time.monotonic()
        if delay > 0:
            time.sleep(delay)

    def _log(self, event: FaultEvent) -> None:
        with open(self.run_dir / "events.jsonl", "a") as f:
            f.write(event.model_dump_json() + "\n")

    def report(self, started_ns: int) -> Report:
        windows = []
        for ident, session in self.sessions.items():
            if not isinstance(session, MediaSession) or not ident.startswith("gaming"):
                continue
            try:
                packets = session.packets("down")
            except OSError:
                continue
            events = sorted(self.events, key=lambda e: e.onset_ns)
            for k, ev in enumerate(events):
                end = ev.end_ns or ev.onset_ns
                if end <= session.started_ns:
                    continue  # over before this (late) session began sending
                span = end - ev.onset_ns
                # Windows as long as the fault, clipped so they never overlap a neighbour fault;
                # "after" starts a settling second late (the queue the fault built drains first).
                prev_end = (events[k - 1].end_ns or 0) + SETTLE_NS if k else 0
                next_onset = events[k + 1].onset_ns if k + 1 < len(events) else None
                after_end = end + SETTLE_NS + span
                if next_onset is not None:
                    after_end = min(after_end, next_onset)
                windows.append(
                    FaultWindows(
                        fault=ev.id,
                        session=ident,
                        before=packets.window(
                            max(ev.onset_ns - span, prev_end), ev.onset_ns
                        ).summary(),
                        during=packets.window(ev.onset_ns, end).summary(),
                        after=packets.window(end + SETTLE_NS, after_end).summary(),
                    )
                )
        report = Report(
            run_dir=str(self.run_dir),
            started_ns=started_ns,
            faults=self.events,
            sessions={k: s.result() for k, s in self.sessions.items()},
            windows=windows,
            traffic=self.traffic,
        )
        (self.run_dir / "report.json").write_text(report.model_dump_json(indent=1))
        return report


__all__ = [
    "FaultEvent", "GamingSpec", "Report", "Runner", "Scenario", "TrafficEvent", "load_scenario"
]
