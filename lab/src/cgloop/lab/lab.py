"""Build, inspect and tear down a lab: namespaces, veth pairs, addresses, routes, bottleneck.

Everything is done over netlink with pyroute2. `up` converges: it creates what is missing and
leaves what exists (so it is idempotent and never disturbs queues another component, e.g. the
node agent, has added under the bottleneck's HTB root). `down` stops every process in the
lab's namespaces and deletes the namespaces, which takes their veths and qdiscs with them.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cgloop.lab import cgroups, procs
from cgloop.lab.state import LabState, ProcRecord, StateStore, default_state_dir
from cgloop.lab.topology import Link, Role, Topology
from pydantic import BaseModel
from pyroute2 import IPRoute, netns

HTB_ROOT = 0x10000  # 1:
HTB_TOP = 0x10001  # 1:1  the link rate
HTB_DEFAULT = 0x10010  # 1:10 the default leaf (a FIFO of limit_packets)
FIFO_HANDLE = 0x100000  # 10:


class InterfaceStatus(BaseModel):
    ifname: str
    state: str
    address: str | None
    qdisc: str | None = None
    rate_mbit: float | None = None
    tx_packets: int = 0
    drops: int = 0
    backlog_packets: int = 0


class NodeStatus(BaseModel):
    node: str
    netns: str
    exists: bool
    interfaces: list[InterfaceStatus] = []
    processes: int = 0


class LabStatus(BaseModel):
    name: str
    up: bool
    nodes: list[NodeStatus]


def in_netns(ns: str, fn: Callable[[], Any]) -> Any:
    """Run `fn` in a short-lived thread that has joined `ns` (setns is per thread)."""
    result: dict[str, Any] = {}

    def run() -> None:
        fd = os.open(procs.netns_path(ns), os.O_RDONLY)
        try:
            procs.enter_netns(fd, f"namespace {ns}")
            result["value"] = fn()
        except BaseException as exc:
            result["error"] = exc
        finally:
            os.close(fd)

    thread = threading.Thread(target=run, name=f"netns-{ns}")
    thread.start()
    thread.join()
    if "error" in result:
        raise result["error"]
    return result.get("value")


def _htb_rates(cls) -> tuple[int, int, int]:
    """(rate, ceil) in bytes/s and the priority of an HTB class from a netlink class dump."""
    params = cls.get_nested("TCA_OPTIONS", "TCA_HTB_PARMS")
    rate = cls.get_nested("TCA_OPTIONS", "TCA_HTB_RATE64") or params["rate"]
    ceil = cls.get_nested("TCA_OPTIONS", "TCA_HTB_CEIL64") or params["ceil"]
    return int(rate), int(ceil), int(params.get("prio", 0))


def _sysctl(path: str, value: str) -> Callable[[], None]:
    def write() -> None:
        Path("/proc/sys", path).write_text(value)

    return write


class Lab:
    def __init__(self, topology: Topology, state_dir: Path | None = None) -> None:
        self.topo = topology
        self.store = StateStore(state_dir or default_state_dir(), topology.name)

    @property
    def name(self) -> str:
        return self.topo.name

    @property
    def run_dir(self) -> Path:
        return self.store.run_dir

    def ns(self, node: str) -> str:
        return self.topo.netns(node)

    # --- up ------------------------------------------------------------------------------------
    def up(self) -> None:
        wanted = [self.ns(n.name) for n in self.topo.nodes]
        with self.store.edit(self.topo) as state:  # recorded before anything exists
            state.namespaces = sorted(set(state.namespaces) | set(wanted))
        existing = set(netns.listnetns())
        for node in self.topo.nodes:
            ns = self.ns(node.name)
            if ns not in existing:
                netns.create(ns)
            forward = "1" if node.role == Role.router else "0"
            in_netns(ns, _sysctl("net/ipv4/ip_forward", forward))
            # No IPv6 in the lab: no DAD or router solicitations in the probe's flow records.
            in_netns(ns, _sysctl("net/ipv6/conf/all/disable_ipv6", "1"))
            in_netns(ns, _sysctl("net/ipv6/conf/default/disable_ipv6", "1"))
            with IPRoute(netns=ns) as ipr:
                ipr.link("set", index=ipr.link_lookup(ifname="lo")[0], state="up")
        for link in self.topo.links:
            self._ensure_link(link)
        for node in self.topo.nodes:
            with IPRoute(netns=self.ns(node.name)) as ipr:
                for dst, gw in self.topo.routes(node.name):
                    ipr.route("replace", dst=str(dst), gateway=str(gw))
        for link in self.topo.bottlenecks():
            b = link.bottleneck
            assert b is not None
            self._ensure_shaper(link.a, link.b, b.down_mbit, b.limit_packets)
            self._ensure_shaper(link.b, link.a, b.up_mbit, b.limit_packets)
        cgroups.ensure(self.name, [n.name for n in self.topo.nodes])

    def cgroup(self, node: str) -> Path | None:
        """The cgroup v2 directory `node`'s processes start in (cgloop.lab.cgroups), None when
        the machine has none for the lab."""
        d = cgroups.lab_dir(self.name)
        return d / node if d is not None and (d / node).is_dir() else None

    def _ensure_link(self, link: Link) -> None:
        ns_a, ns_b = self.ns(link.a), self.ns(link.b)
        with IPRoute(netns=ns_a) as ia, IPRoute(netns=ns_b) as ib:
            have_a, have_b = ia.link_lookup(ifname=link.b), ib.link_lookup(ifname=link.a)
            if not (have_a and have_b):
                # A half-made pair (crash mid-up): delete the leftover end and start again.
                if have_a:
                    ia.link("del", index=have_a[0])
                if have_b:
                    ib.link("del", index=have_b[0])
                ia.link(
                    "add",
                    ifname=link.b,
                    kind="veth",
                    peer={"ifname": link.a, "net_ns_fd": ns_b},
                )
            for ipr, ifname, addr in ((ia, link.b, link.addr_a), (ib, link.a, link.addr_b)):
                idx = ipr.link_lookup(ifname=ifname)[0]
                have = {a.get_attr("IFA_ADDRESS") for a in ipr.get_addr(index=idx)}
                if str(addr) not in have:
                    ipr.addr("add", index=idx, address=str(addr), prefixlen=link.subnet.prefixlen)
                ipr.link("set", index=idx, state="up")

    def _ensure_shaper(self, node: str, peer: str, rate_mbit: float, limit: int) -> None:
        with IPRoute(netns=self.ns(node)) as ipr:
            idx = ipr.link_lookup(ifname=peer)[0]
            root = [q for q in ipr.get_qdiscs(index=idx) if q["parent"] == 0xFFFFFFFF]
            if root and root[0].get_attr("TCA_KIND") == "htb" and root[0]["handle"] == HTB_ROOT:
                classes = {c["handle"] for c in ipr.get_classes(index=idx)}
                if {HTB_TOP, HTB_DEFAULT} <= classes:
                    return  # already shaped (maybe with extra classes from the node agent): keep
            if root and root[0]["handle"] != 0:  # handle 0: the built-in noqueue/pfifo_fast
                ipr.tc("del", index=idx, handle=root[0]["handle"], parent=0xFFFFFFFF)
            rate = f"{round(rate_mbit * 1000)}kbit"
            ipr.tc("add", "htb", idx, HTB_ROOT, default=0x10)
            ipr.tc("add-class", "htb", idx, HTB_TOP, parent=HTB_ROOT, rate=rate, ceil=rate)
            ipr.tc("add-class", "htb", idx, HTB_DEFAULT, parent=HTB_TOP, rate=rate, ceil=rate)
            ipr.tc("add", "pfifo", idx, FIFO_HANDLE, parent=HTB_DEFAULT, limit=limit)

    def set_rate(self, node: str, peer: str, rate_mbit: float) -> None:
        """Change the shaped rate of node's egress towards peer (the rate-cap fault).

        The link class `1:1` gets the new rate. Its children (the default leaf, and the classes
        the node agent added) are scaled with it, so their guaranteed rates still add up to the
        link and no class can send more than the link carries: a gaming class moved out of the
        default leaf must not escape the cap. A ceil at the old link rate follows the link;
        each class keeps its priority.
        """
        new_bps = round(rate_mbit * 1e6 / 8)  # bytes/s, as the kernel counts
        with IPRoute(netns=self.ns(node)) as ipr:
            idx = ipr.link_lookup(ifname=peer)[0]
            classes = {c["handle"]: c for c in ipr.get_classes(index=idx)}
            top = classes.get(HTB_TOP)
            if top is None:
                raise RuntimeError(f"{self.ns(node)}/{peer}: no HTB link class 1:1 to cap")
            old_bps, _, _ = _htb_rates(top)
            ratio = new_bps / max(old_bps, 1)
            rate = f"{round(rate_mbit * 1000)}kbit"
            ipr.tc("change-class", "htb", idx, HTB_TOP, parent=HTB_ROOT, rate=rate, ceil=rate)
            for handle, cls in classes.items():
                if cls["parent"] != HTB_TOP:
                    continue
                c_rate, c_ceil, prio = _htb_rates(cls)
                ceil = new_bps if c_ceil >= old_bps else min(new_bps, round(c_ceil * ratio))
                ipr.tc(
                    "change-class", "htb", idx, handle, parent=HTB_TOP,
                    rate=f"{max(1, round(c_rate * ratio * 8 / 1000))}kbit",
                    ceil=f"{max(1, round(ceil * 8 / 1000))}kbit", prio=prio,
                )

    def rate_mbit(self, node: str, peer: str) -> float | None:
        with IPRoute(netns=self.ns(node)) as ipr:
            idx = ipr.link_lookup(ifname=peer)[0]
            for cls in ipr.get_classes(index=idx):
                if cls["handle"] == HTB_TOP:
                    params = cls.get_nested("TCA_OPTIONS", "TCA_HTB_PARMS")
                    rate64 = cls.get_nested("TCA_OPTIONS", "TCA_HTB_RATE64")
                    bps = rate64 or params["rate"]
                    return bps * 8 / 1e6
        return None

    # --- processes -----------------------------------------------------------------------------
    def spawn(
        self,
        node: str,
        argv: list[str],
        role: str,
        log: Path | None = None,
        cpus: list[int] | None = None,
    ):
        """Start a process in `node`'s namespace and record it in the state file; with `cpus`,
        pinned to those cores."""
        proc = procs.spawn(self.ns(node), argv, log=log, cpus=cpus, cgroup=self.cgroup(node))
        with self.store.edit(self.topo) as state:
            state.processes.append(
                ProcRecord(
                    pid=proc.pid, ticks=procs.start_ticks(proc.pid), netns=self.ns(node), role=role
                )
            )
        return proc

    def forget(self, pids: list[int]) -> None:
        with self.store.edit(self.topo) as state:
            state.processes = [p for p in state.processes if p.pid not in pids]

    # --- down ----------------------------------------------------------------------------------
    def namespaces(self) -> list[str]:
        """The lab's namespaces: recorded ones and any `<name>-<node>` left on the machine."""
        state = self.store.load()
        recorded = set(state.namespaces) if state else set()
        found = {ns for ns in netns.listnetns() if ns.rsplit("-", 1)[0] == self.name}
        return sorted(recorded | found)

    def down(self) -> list[str]:
        """Remove everything; returns the namespaces deleted. Safe to run any number of times."""
        state = self.store.load()
        targets = self.namespaces()
        recorded = [(p.pid, p.ticks) for p in state.processes] if state else []
        in_ns = [(pid, None) for ns in targets for pid in procs.pids_in_netns(ns)]
        procs.stop(recorded + in_ns)
        existing = set(netns.listnetns())
        removed = []
        for ns in targets:
            if ns in existing:
                netns.remove(ns)
                removed.append(ns)
        cgroups.remove(self.name)
        self.store.remove()
        return removed

    # --- status --------------------------------------------------------------------------------
    def status(self) -> LabStatus:
        existing = set(netns.listnetns())
        nodes = []
        for node in self.topo.nodes:
            ns = self.ns(node.name)
            if ns not in existing:
                nodes.append(NodeStatus(node=node.name, netns=ns, exists=False))
                continue
            ifaces = []
            with IPRoute(netns=ns) as ipr:
                for link in ipr.get_links():
                    ifname = link.get_attr("IFLA_IFNAME")
                    if ifname == "lo":
                        continue
                    idx = link["index"]
                    addrs = [a.get_attr("IFA_ADDRESS") for a in ipr.get_addr(index=idx)]
                    st = InterfaceStatus(
                        ifname=ifname,
                        state=link.get_attr("IFLA_OPERSTATE") or "?",
                        address=addrs[0] if addrs else None,
                    )
                    for q in ipr.get_qdiscs(index=idx):
                        if q["parent"] == 0xFFFFFFFF:
                            st.qdisc = q.get_attr("TCA_KIND")
                            stats = q.get_attr("TCA_STATS") or {}
                            st.tx_packets = stats.get("packets", 0)
                            st.drops = stats.get("drop", 0)
                            st.backlog_packets = stats.get("qlen", 0)
                    if st.qdisc == "htb":
                        st.rate_mbit = self.rate_mbit(node.name, ifname)
                    ifaces.append(st)
            nodes.append(
                NodeStatus(
                    node=node.name,
                    netns=ns,
                    exists=True,
                    interfaces=ifaces,
                    processes=len(procs.pids_in_netns(ns)),
                )
            )
        return LabStatus(name=self.name, up=all(n.exists for n in nodes), nodes=nodes)

    def state(self) -> LabState | None:
        return self.store.load()
