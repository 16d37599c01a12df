"""The node micro loop's latency guard against the real agent and kernel (issue 19): the
ProtectFlows contract over gRPC (what it refuses, with which status and naming which field and
bound; idempotent action ids; dry run; removal; the journal), and a protected flow promoted to
the gaming class and re-marked while its class's queue builds.

The namespaces, the agent and the traffic are those of tests/test_node_agent_netns.py.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time

import grpc
import pytest
from cgloop.bus.kafka import BatchConsumer
from cgloop.bus.topics import ACTIONS
from cgloop.v1 import action_pb2 as apb
from cgloop.v1 import node_agent_pb2 as na

from tests import test_node_agent_netns as netns
from tests.test_node_agent_netns import (
    DEFAULT,
    GAMING,
    ROOT,
    Lab,
    Receiver,
    apply,
    in_netns,
)

pytestmark = pytest.mark.root

MS = 1_000_000
SLO = 20 * MS

# The namespaces fixture of the agent's netns tests (pytest finds it by this name).
lab = netns.lab


def protection(lab: Lab, sport: int, dport: int = 9500, **kw) -> na.ProtectedFlow:
    fields = {"latency_slo_ns": SLO, "class_id": GAMING, "rewrite_dscp": 46, "ttl_ns": 30_000 * MS}
    fields.update(kw)
    return na.ProtectedFlow(interface_name=lab.if_a, flow=lab.flow(sport, dport), **fields)


def protect(stub, action: str, *flows: na.ProtectedFlow, dry_run: bool = False):
    req = na.ProtectFlowsRequest(action_id=action, flows=list(flows), dry_run=dry_run)
    return stub.ProtectFlows(req, timeout=10)


def refused(call, code: grpc.StatusCode, *needles: str) -> None:
    with pytest.raises(grpc.RpcError) as err:
        call()
    assert err.value.code() == code, err.value.details()
    for needle in needles:
        assert needle in err.value.details(), err.value.details()


def state(stub) -> na.NodeState:
    return stub.GetState(na.GetStateRequest(), timeout=10).state


def test_protect_flows_upserts_refuses_by_field_and_bound_and_survives_a_restart(lab: Lab):
    stub = lab.stub()
    refused(lambda: protect(stub, "p0", protection(lab, 41000)),
            grpc.StatusCode.FAILED_PRECONDITION, "no queue hierarchy")
    apply(stub, lab)
    dry = protect(stub, "p1", protection(lab, 41000), dry_run=True)
    assert dry.outcome.dry_run and not state(stub).protected_flows, "a dry run protects nothing"

    before = time.time_ns()
    first = protect(stub, "p2", protection(lab, 41000))
    assert first.outcome.changed and not first.previous
    assert before + 30_000 * MS <= first.applied[0].expires_ns <= time.time_ns() + 30_000 * MS
    again = protect(stub, "p2", protection(lab, 41000))
    assert again.outcome.replayed and list(again.applied) == list(first.applied)
    refused(lambda: protect(stub, "p2", protection(lab, 41001)),
            grpc.StatusCode.ALREADY_EXISTS, "action_id")
    renewal = protect(stub, "p3", protection(lab, 41000))
    assert not renewal.outcome.changed, "a renewal only moves the expiry"
    assert renewal.previous[0].expires_ns == first.applied[0].expires_ns
    assert renewal.applied[0].expires_ns > first.applied[0].expires_ns

    s = state(stub)
    assert [p.flow.src_port for p in s.protected_flows] == [41000]
    assert s.micro_loop.protected_flows == 1
    assert s.protected_flows[0].class_id == GAMING and s.protected_flows[0].rewrite_dscp == 46

    bad = {
        "latency_slo_ns": (dict(latency_slo_ns=99_999), grpc.StatusCode.INVALID_ARGUMENT,
                           ("flows[0].latency_slo_ns 99999", "100000..10000000000")),
        "ttl_ns": (dict(ttl_ns=500 * MS), grpc.StatusCode.INVALID_ARGUMENT,
                   ("flows[0].ttl_ns 500000000", "1000000000..3600000000000")),
        "rewrite_dscp": (dict(rewrite_dscp=64), grpc.StatusCode.INVALID_ARGUMENT,
                         ("flows[0].rewrite_dscp 64", "0..63")),
        "unknown class": (dict(class_id=0x10099), grpc.StatusCode.FAILED_PRECONDITION,
                          ("flows[0].class_id 1:99", "does not exist")),
        "inner class": (dict(class_id=ROOT), grpc.StatusCode.FAILED_PRECONDITION,
                        ("flows[0].class_id 1:1", "has children")),
    }
    for i, (what, (change, code, needles)) in enumerate(bad.items()):
        refused(lambda c=change, i=i: protect(stub, f"bad{i}", protection(lab, 41001, **c)),
                code, *needles)
        assert len(state(stub).protected_flows) == 1, what
    outside = na.ProtectedFlow(
        interface_name="lo", flow=lab.flow(1, 2), latency_slo_ns=SLO, class_id=GAMING,
        ttl_ns=30_000 * MS,
    )
    refused(lambda: protect(stub, "bad-if", outside), grpc.StatusCode.PERMISSION_DENIED,
            "flows[0].interface_name", "lo")
    no_flow = na.ProtectedFlow(interface_name=lab.if_a, latency_slo_ns=SLO, class_id=GAMING,
                               ttl_ns=30_000 * MS)
    refused(lambda: protect(stub, "bad-flow", no_flow), grpc.StatusCode.INVALID_ARGUMENT,
            "flows[0].flow is missing")
    refused(lambda: protect(stub, "empty"), grpc.StatusCode.INVALID_ARGUMENT, "flows is empty")

    # The journal keeps the protections (with their expiry) across a restart.
    state(stub)
    lab.kill()
    with (lab.tmp / "agent.toml").open("a") as f:
        f.write("[guard]\nmax_protected_flows = 2\n")
    lab.start()
    stub = lab.stub()
    restored = state(stub).protected_flows
    assert [(p.flow.src_port, p.expires_ns) for p in restored] == [
        (41000, renewal.applied[0].expires_ns)
    ]
    protect(stub, "p4", protection(lab, 41001))
    refused(lambda: protect(stub, "p5", protection(lab, 41002)),
            grpc.StatusCode.RESOURCE_EXHAUSTED, "max_protected_flows is 2")
    # Releasing one and protecting another in one request fits the bound.
    swap = protect(stub, "p6", protection(lab, 41001, ttl_ns=0), protection(lab, 41002))
    assert swap.outcome.changed and [p.flow.src_port for p in swap.previous] == [41001]
    assert sorted(p.flow.src_port for p in state(stub).protected_flows) == [41000, 41002]


def flood(lab: Lab, sport: int, dport: int, seconds: float, stop: threading.Event) -> None:
    """Unclassified UDP as fast as one thread sends: the default class queues."""

    def run() -> None:
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.bind((lab.addr_a, sport))
        payload = b"\0" * 1400
        until = time.monotonic() + seconds
        while time.monotonic() < until and not stop.is_set():
            try:
                s.sendto(payload, (lab.addr_b, dport))
            except OSError:
                time.sleep(0.0005)  # qdisc full: back off a little
        s.close()

    in_netns(lab.ns_a, run)


def congest_until_promoted(lab: Lab, stub, sport: int, dport: int):
    """Floods the default class while the protected flow sends, until GetState shows it
    promoted (or 20 s pass); returns (the protection, its datapath rules, what B received).
    The default class is capped at 10 Mbit/s first, so even a sender slowed by a loaded machine
    builds its queue."""
    stub.SetClassRate(na.SetClassRateRequest(
        action_id=f"cap-{sport}", interface_name=lab.if_a, class_id=DEFAULT,
        rate_bps=5_000_000, ceil_bps=10_000_000), timeout=10)
    rx = Receiver(lab, dport)
    lab.send(sport, dport, 10, gap_s=0.002, size=200)  # before the queue: not re-marked
    stop = threading.Event()
    flooders = [threading.Thread(target=flood, args=(lab, sport + 100 + i, 9700, 20.0, stop))
                for i in range(2)]
    for t in flooders:
        t.start()
    promoted, rules = None, []
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            lab.send(sport, dport, 10, gap_s=0.002, size=200)
            s = state(stub)
            if s.protected_flows and s.protected_flows[0].promoted:
                promoted = s.protected_flows[0]
                rules = [r for r in s.flow_classes if r.flow.src_port == sport]
                break
        lab.send(sport, dport, 20, gap_s=0.002, size=200)
    finally:
        stop.set()
        for t in flooders:
            t.join(10)
    return promoted, rules, rx.stop()


def skip_without_monitor(stub) -> None:
    status = state(stub).micro_loop
    if "no queue monitor" in status.reason:
        pytest.skip(f"this build has no queue monitor: {status.reason}")


def test_a_protected_flow_is_promoted_and_remarked_when_its_class_queues(lab: Lab):
    stub = lab.stub()
    apply(stub, lab)
    protect(stub, "g1", protection(lab, 42000, dport=9600))
    skip_without_monitor(stub)
    promoted, rules, got = congest_until_promoted(lab, stub, 42000, 9600)
    assert promoted is not None, f"never promoted; micro loop: {state(stub).micro_loop}"
    assert promoted.promotions >= 1
    # The datapath rule the guard wrote: the gaming class with the re-mark.
    assert rules and rules[0].class_id == GAMING and rules[0].rewrite_dscp == 46, rules
    # The 20 packets sent once it was promoted all carry the re-mark (packets queued in the
    # default class before it may still arrive after them, unmarked).
    assert sum(dscp == 46 for _, dscp in got) >= 20, got
    assert any(dscp == 0 for _, dscp in got), "packets before it were not re-marked"


class LoopbackRelay:
    """Makes the host's Kafka (on the host's loopback) reachable at the same address from inside
    the agent's namespace: a listener there, each connection relayed to the host's port."""

    def __init__(self, lab: Lab, port: int) -> None:
        def listen() -> socket.socket:
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(("127.0.0.1", port))
            s.listen(16)
            s.settimeout(0.2)
            return s

        self._listener = in_netns(lab.ns_a, listen)  # a socket keeps its namespace
        self._port = port
        self._stop = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                inside, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return  # closed
            outside = socket.create_connection(("127.0.0.1", self._port))
            for a, b in ((inside, outside), (outside, inside)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        self._stop.set()
        self._listener.close()


@pytest.mark.kafka
def test_the_promotion_is_audited_on_the_actions_topic(lab: Lab, stack_settings):
    """The guard's move arrives on cgloop.actions.v1 as a node-level action with its result."""
    host, port = stack_settings.bootstrap_servers.split(",")[0].rsplit(":", 1)
    assert host in ("127.0.0.1", "localhost"), stack_settings.bootstrap_servers
    relay = LoopbackRelay(lab, int(port))
    lab.kill()
    toml = lab.tmp / "agent.toml"
    toml.write_text(f'kafka_bootstrap = "{stack_settings.bootstrap_servers}"\n' + toml.read_text())
    lab.start()
    stub = lab.stub()
    apply(stub, lab)
    protect(stub, "g1", protection(lab, 42500, dport=9650))
    skip_without_monitor(stub)
    consumer = BatchConsumer(stack_settings.bootstrap_servers, f"guard-{lab.tag}", [ACTIONS.name])
    try:
        promoted, _, _ = congest_until_promoted(lab, stub, 42500, 9650)
        assert promoted is not None, f"never promoted; micro loop: {state(stub).micro_loop}"
        actions: dict[str, apb.Action] = {}
        results: dict[str, apb.ActionResult] = {}
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not any(
            a.cause.startswith("promoted") and i in results for i, a in actions.items()
        ):
            item = consumer.poll(1.0)
            if item is None:
                continue
            for ev in item[1].events:
                if ev.WhichOneof("event") == "action" and ev.action.target.flow.src_port == 42500:
                    actions[ev.action.id] = ev.action
                elif ev.WhichOneof("event") == "result":
                    results[ev.result.action_id] = ev.result
    finally:
        consumer.close()
        lab.kill()
        relay.close()
    ids = [i for i in actions.keys() & results.keys() if actions[i].cause.startswith("promoted")]
    assert ids, f"no audited promotion: {len(actions)} actions, {len(results)} results"
    a, r = actions[ids[0]], results[ids[0]]
    assert a.level == apb.ACTION_LEVEL_NODE
    assert a.operation == apb.ACTION_OPERATION_REPRIORITISE_FLOW
    node = f"lab-{lab.tag}"
    assert a.header.source_id == f"{node}/node-agent" and a.target.node_id == node
    assert a.reprioritise_flow.class_id == GAMING and a.reprioritise_flow.rewrite_dscp == 46
    assert a.cause.startswith("promoted: class 1:30 queue delay"), a.cause
    assert r.state == apb.ACTION_STATE_APPLIED and r.applied_ns > 0
    assert r.previous.WhichOneof("state") == "flow_class"
    assert not r.previous.flow_class.HasField("class_id"), "no rule before: rollback removes it"
    print(f"guard: queue tick -> applied {r.detection_to_apply_ns / 1e6:.2f} ms, "
          f"map write {r.apply_latency_ns / 1e3:.0f} µs")
