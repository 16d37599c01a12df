"""Faults the lab injects into itself, each with `apply` and `revert`.

| kind | mechanism |
|---|---|
| congestion | iperf3 TCP flows from the bulk sender through the bottleneck (BulkSession) |
| core_congestion | iperf3 TCP flows from the bulk sender to a sink on an edge router: they fill \
the core router's shaped egress towards that edge (the INT source's queue) and nothing else |
| cpu_hog | busy processes in a node's namespace pinned to given cores (sched_setaffinity) |
| rate_cap | change a shaped link's HTB rate (both the link class and its default leaf) |
| loss | the eBPF random-drop program (`bpf.py`) on clsact egress of an interface |
| ect1_abuse | an unresponsive ECT(1)-marked UDP flow through the bottleneck |
| burst_flood | an unresponsive classic UDP flood in large bursts through the bottleneck |

The loss fault is the lab's own until the node agent ships its BPF drop program; it uses
filter priority LOSS_PRIO on clsact egress, so it can sit beside the agent's programs.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from pathlib import Path
from typing import Annotated, Literal, TypeVar

import psutil
from cgloop.lab import procs
from cgloop.lab.bpf import CLSACT_EGRESS, load_sched_cls, loss_program
from cgloop.lab.lab import Lab
from cgloop.lab.sessions import (
    BulkSession,
    BulkSpec,
    Ect1Spec,
    MediaSession,
    Session,
    StartSignal,
    UdpBurstSpec,
    listening,
    make_session,
)
from pydantic import BaseModel, ConfigDict, Field, model_validator
from pyroute2 import IPRoute
from pyroute2.netlink.exceptions import NetlinkError

_S = TypeVar("_S", bound=BaseModel)

LOSS_PRIO = 0xC1  # clsact egress filter priority of the lab's loss program
LOSS_NAME = "cgl_lab_loss"


class _Fault(BaseModel):
    model_config = ConfigDict(extra="forbid")

    at: float = Field(ge=0, description="seconds after the scenario's traffic started")
    duration: float = Field(gt=0)


class Congestion(_Fault, BulkSpec):
    """A bulk TCP flood (BulkSpec's fields) for the fault's duration."""

    kind: Literal["congestion"] = "congestion"  # type: ignore[assignment]
    port: int = Field(5202, ge=1024, le=65535)  # beside a background bulk session's 5201


class CoreCongestion(_Fault, BulkSpec):
    """A bulk TCP flood (BulkSpec's fields) that ends at an edge router (`dst`, default edge1):
    it crosses the core router's shaped link towards that edge and no home bottleneck, so the
    core's queue is the one it fills (and INT sees), for that edge's sessions only."""

    kind: Literal["core_congestion"] = "core_congestion"  # type: ignore[assignment]
    dst: str = "edge1"
    port: int = Field(5203, ge=1024, le=65535)


# A busy loop in the smallest process there is: starts in milliseconds, burns its core.
HOG_ARGV = ["/bin/sh", "-c", "while :; do :; done"]


class CpuHog(_Fault):
    """`processes` busy processes in `node`'s namespace (and cgroup), each pinned to `cores` (a
    node near its capacity, or the core of a chain function's worker saturated).

    Every lab node shares the machine's cores with a loaded lab, where a hog at the default
    priority gets only its fair share of a core; `nice` (down to -20) makes it take most of
    its cores, `realtime_priority` (SCHED_FIFO 1..99) all of them but what the kernel's RT
    throttling leaves (sched_rt_runtime_us): what it takes to starve a SCHED_FIFO worker of
    lower priority, such as a chain's AF_XDP worker (the node agent's advanced_rt_priority)."""

    kind: Literal["cpu_hog"] = "cpu_hog"
    node: str
    cores: list[int] = Field(min_length=1, max_length=256)
    processes: int = Field(1, ge=1, le=64)
    nice: int = Field(0, ge=-20, le=19)
    realtime_priority: int = Field(0, ge=0, le=99)

    @model_validator(mode="after")
    def _cores(self) -> CpuHog:
        if any(c < 0 for c in self.cores) or len(set(self.cores)) != len(self.cores):
            raise ValueError(f"cores {self.cores}: core numbers must be distinct and ≥ 0")
        return self


class RateCap(_Fault):
    kind: Literal["rate_cap"] = "rate_cap"
    rate_mbit: float = Field(gt=0, le=100_000)
    direction: Literal["down", "up"] = "down"
    # The shaped egress (node's interface towards `peer`); default: the first access
    # bottleneck, downstream or upstream as `direction` says.
    node: str | None = None
    peer: str | None = None

    @model_validator(mode="after")
    def _both_or_neither(self) -> RateCap:
        if (self.node is None) != (self.peer is None):
            raise ValueError("rate_cap: give both `node` and `peer` (the shaped egress) or neither")
        return self


class Loss(_Fault):
    kind: Literal["loss"] = "loss"
    percent: float = Field(gt=0, le=100)
    # The egress interface (node's interface towards `peer`); default: bottleneck downstream.
    node: str | None = None
    peer: str | None = None


class Ect1Abuse(_Fault, Ect1Spec):
    """The ECT(1) abuser (Ect1Spec's fields) for the fault's duration."""

    kind: Literal["ect1_abuse"] = "ect1_abuse"  # type: ignore[assignment]


class BurstFlood(_Fault, UdpBurstSpec):
    """The classic UDP burst flood (UdpBurstSpec's fields) for the fault's duration."""

    kind: Literal["burst_flood"] = "burst_flood"  # type: ignore[assignment]


FaultSpec = Annotated[
    Congestion | CoreCongestion | CpuHog | RateCap | Loss | Ect1Abuse | BurstFlood,
    Field(discriminator="kind"),
]


class ActiveFault:
    """A fault in effect: knows how to undo itself."""

    def __init__(self, lab: Lab, spec: FaultSpec, ident: str, out_dir: Path) -> None:
        self.lab, self.spec, self.ident, self.out_dir = lab, spec, ident, out_dir
        self.session: Session | None = None
        self._restore: tuple[str, str, float] | None = None
        self._loss_at: tuple[str, str] | None = None
        self._hogs: list[subprocess.Popen] = []
        self.detail: dict = {}
        self.onset_ns: int | None = None  # known in advance for prepared faults
        self.prepared = False

    def prepare(self, start: StartSignal) -> None:
        """Start generator-based faults ahead of time, to begin when `start` says (the runner
        fixes it once every generator is ready, then calls `started_at`), so that Python
        start-up (seconds on a busy machine) never delays their onset."""
        if isinstance(self.spec, Ect1Abuse | BurstFlood):
            self._start_flood(self.spec, start)
            self.prepared = True
        elif isinstance(self.spec, Congestion | CoreCongestion) and not listening(
            self.lab.ns(self.spec.dst), self.spec.port
        ):
            # The iperf3 server listens in advance; onset is when the flood's client starts. A
            # port an earlier flood's (one-shot) server holds is left to apply time.
            bulk = make_session(self.lab, self.ident, self.out_dir, _as(BulkSpec, self.spec))
            assert isinstance(bulk, BulkSession)
            bulk.listen()
            self.session = bulk

    def started_at(self, start_ns: int) -> None:
        """The runner fixed the start: a prepared fault's onset is its `at` after it."""
        if self.prepared:
            self.onset_ns = start_ns + int(self.spec.at * 1e9)
            if isinstance(self.session, MediaSession):
                self.session.started_at(self.onset_ns)

    def _start_flood(self, spec: Ect1Abuse | BurstFlood, start: StartSignal | None) -> None:
        traffic = _as(Ect1Spec, spec) if isinstance(spec, Ect1Abuse) else _as(UdpBurstSpec, spec)
        self.session = make_session(self.lab, self.ident, self.out_dir, traffic)
        self.session.start(spec.duration, start)

    def apply(self) -> None:
        spec, lab = self.spec, self.lab
        if self.onset_ns is not None:
            return  # prepared: its generator starts itself on time
        if isinstance(spec, Congestion | CoreCongestion):
            if self.session is None:
                self.session = make_session(lab, self.ident, self.out_dir, _as(BulkSpec, spec))
            self.session.start(spec.duration)
        elif isinstance(spec, Ect1Abuse | BurstFlood):
            self._start_flood(spec, None)
        elif isinstance(spec, CpuHog):
            self._start_hogs(spec)
        elif isinstance(spec, RateCap):
            if spec.node and spec.peer:
                node, peer = spec.node, spec.peer
            else:
                link = lab.topo.bottleneck()
                node, peer = (link.a, link.b) if spec.direction == "down" else (link.b, link.a)
            before = lab.rate_mbit(node, peer)
            if before is None:
                raise RuntimeError(f"no HTB shaper on {node}→{peer}: is the lab up?")
            lab.set_rate(node, peer, spec.rate_mbit)
            self._restore = (node, peer, before)
            self.detail = {"from_mbit": before, "to_mbit": spec.rate_mbit}
        elif isinstance(spec, Loss):
            link = lab.topo.bottleneck()
            node, peer = spec.node or link.a, spec.peer or link.b
            add_loss(lab, node, peer, spec.percent / 100)
            self._loss_at = (node, peer)
            self.detail = {"interface": f"{node}:{peer}"}

    def _start_hogs(self, spec: CpuHog) -> None:
        for k in range(spec.processes):
            p = self.lab.spawn(spec.node, HOG_ARGV, role=f"{self.ident}:hog{k}", cpus=spec.cores)
            self._hogs.append(p)
            if spec.realtime_priority:
                os.sched_setscheduler(
                    p.pid, os.SCHED_FIFO, os.sched_param(spec.realtime_priority)
                )
            elif spec.nice:
                os.setpriority(os.PRIO_PROCESS, p.pid, spec.nice)
        # What the kernel says, not what was asked: the cores each hog may run on, its
        # scheduling class and nice value, and the cgroup it runs in.
        self.detail = {
            "node": spec.node,
            "pids": [p.pid for p in self._hogs],
            "affinity": [sorted(os.sched_getaffinity(p.pid)) for p in self._hogs],
            "scheduler": [
                "fifo" if os.sched_getscheduler(p.pid) == os.SCHED_FIFO else "other"
                for p in self._hogs
            ],
            "nice": [os.getpriority(os.PRIO_PROCESS, p.pid) for p in self._hogs],
            "cgroup": str(self.lab.cgroup(spec.node) or ""),
        }

    def _stop_hogs(self) -> None:
        cpu_s = []
        for p in self._hogs:
            try:
                t = psutil.Process(p.pid).cpu_times()
                cpu_s.append(round(t.user + t.system, 3))
            except psutil.Error:
                cpu_s.append(None)
        procs.stop([(p.pid, None) for p in self._hogs])
        for p in self._hogs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(1)
        self.lab.forget([p.pid for p in self._hogs])
        self.detail = {**self.detail, "cpu_s": cpu_s}
        self._hogs = []

    def revert(self) -> None:
        if self._hogs:
            self._stop_hogs()
        if self.session:
            self.session.stop()
            self.detail = self.session.result()
            if isinstance(self.session, MediaSession):
                # The generator needs a moment to start: when its first packet really left.
                with contextlib.suppress(OSError):
                    sent = self.session.packets("down").send_ns
                    self.detail["first_packet_ns"] = int(sent.min()) if len(sent) else None
        if self._restore:
            lab_node, peer, rate = self._restore
            self.lab.set_rate(lab_node, peer, rate)
        if self._loss_at:
            remove_loss(self.lab, *self._loss_at)


def _as(model: type[_S], fault: _Fault) -> _S:
    """The traffic spec a generator-based fault carries (its fields minus kind and timing)."""
    return model.model_validate(fault.model_dump(include=set(model.model_fields) - {"kind"}))


def add_loss(lab: Lab, node: str, peer: str, probability: float) -> None:
    """Drop `probability` of the packets leaving `node` towards `peer` (clsact egress)."""
    with IPRoute(netns=lab.ns(node)) as ipr:
        idx = ipr.link_lookup(ifname=peer)[0]
        if not any(q.get_attr("TCA_KIND") == "clsact" for q in ipr.get_qdiscs(index=idx)):
            ipr.tc("add", "clsact", idx)
        _del_loss_filter(ipr, idx)
        fd = load_sched_cls(loss_program(probability), LOSS_NAME)
        try:
            ipr.tc(
                "add-filter",
                "bpf",
                idx,
                ":1",
                fd=fd,
                name=LOSS_NAME,
                parent=CLSACT_EGRESS,
                classid=1,
                direct_action=True,
                prio=LOSS_PRIO,
            )
        finally:
            os.close(fd)  # the filter holds its own reference


def remove_loss(lab: Lab, node: str, peer: str) -> None:
    with IPRoute(netns=lab.ns(node)) as ipr:
        found = ipr.link_lookup(ifname=peer)
        if found:
            _del_loss_filter(ipr, found[0])


def _del_loss_filter(ipr: IPRoute, idx: int) -> None:
    try:
        ipr.tc("del-filter", "bpf", idx, parent=CLSACT_EGRESS, prio=LOSS_PRIO)
    except NetlinkError as exc:
        if exc.code not in (2, 22):  # ENOENT/EINVAL: no such filter, nothing to remove
            raise
