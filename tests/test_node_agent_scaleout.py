"""Natif's scale-out of an advanced (AF_XDP) chain function, through the agent's gRPC API
against the real kernel (the lab of test_node_agent_netns.py, reused): a swap from one
instance to two under traffic delivers every packet, each flow stays whole on one instance,
and a scale-out that fails while it is applied leaves the previous chain in force.

Which instance a flow went to is read from the instances' veth ports (`cglxdp0`,
`cglxdp0-1`): `cgl_fn_to_user` redirects a frame to its instance's port, whose transmit
counter counts it.
"""

from __future__ import annotations

import json
import socket
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from cgloop.policy.planners import catalogue
from cgloop.v1 import node_agent_pb2 as na

from tests import test_node_agent_netns as netns

pytestmark = pytest.mark.root


PORTS = ("cglxdp0", "cglxdp0-1")  # the agent's default advanced_port and instance 1's
DPORT = 9500


@pytest.fixture
def lab(tmp_path: Path) -> Iterator[netns.Lab]:
    netns._skip_without_root()
    lab = netns.Lab(tmp_path)
    try:
        yield lab.up()
    finally:
        lab.down()


class FlowReceiver:
    """UDP receiver in namespace B counting datagrams per source port."""

    def __init__(self, lab: netns.Lab, port: int) -> None:
        self.got: Counter[int] = Counter()
        self._stop = threading.Event()
        ready = threading.Event()

        def run() -> None:
            s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
            s.bind((lab.addr_b, port))
            s.settimeout(0.1)
            ready.set()
            while not self._stop.is_set():
                try:
                    _, (_, sport) = s.recvfrom(2048)
                except TimeoutError:
                    continue
                self.got[sport] += 1
            s.close()

        self._thread = threading.Thread(target=netns.in_netns, args=(lab.ns_b, run), daemon=True)
        self._thread.start()
        ready.wait(5)

    def stop(self) -> Counter[int]:
        time.sleep(0.3)
        self._stop.set()
        self._thread.join(5)
        return self.got


def dpi_chain(instances: int, pattern: str = "NEVER") -> na.ServiceChain:
    dpi = netns.fn({"dpi": {"text": pattern, "mark_dscp": 46}}, na.FUNCTION_KIND_ADVANCED)
    dpi.instances = instances
    return netns.chain("gaming", netns.fn({"mark": {"dscp": 10}}, na.FUNCTION_KIND_BASIC), dpi)


def port_tx(lab: netns.Lab) -> dict[str, int]:
    """Frames each instance's port has taken (0 for a port that does not exist)."""
    out = {}
    for port in PORTS:
        res = subprocess.run(["ip", "-n", lab.ns_a, "-j", "-s", "link", "show", "dev", port],
                             capture_output=True, text=True, timeout=10)
        out[port] = (json.loads(res.stdout)[0]["stats64"]["tx"]["packets"]
                     if res.returncode == 0 else 0)
    return out


def flows(stub, lab: netns.Lab, n: int) -> list[int]:
    sports = [45_000 + i for i in range(n)]
    for sport in sports:
        netns.set_flow(stub, lab, f"flow-{sport}", sport, DPORT, netns.GAMING)
    return sports


def test_one_to_two_instances_under_traffic_loses_nothing_and_keeps_flows_whole(lab):
    stub = lab.stub()
    netns.apply(stub, lab)
    sports = flows(stub, lab, 16)
    stub.SetChain(na.SetChainRequest(action_id="one", chain=dpi_chain(1)), timeout=10)

    # Four flows at ~2000 packets/s each; the chain goes from one instance to two mid-way.
    rx = FlowReceiver(lab, DPORT)
    per_flow = 2000
    senders = [
        threading.Thread(target=lab.send, args=(sport, DPORT, per_flow), kwargs={"gap_s": 0.0005})
        for sport in sports[:4]
    ]
    for t in senders:
        t.start()
    time.sleep(0.4)
    resp = stub.SetChain(na.SetChainRequest(action_id="two", chain=dpi_chain(2)), timeout=10)
    assert resp.outcome.changed
    for t in senders:
        t.join(60)
    got = rx.stop()
    assert {s: got[s] for s in sports[:4]} == dict.fromkeys(sports[:4], per_flow), (
        "packets lost across the swap"
    )
    state = stub.GetState(na.GetStateRequest(), timeout=10).state
    dpi = state.chains[0].functions[1]
    assert catalogue.name_of(dpi) == "dpi" and dpi.instances == 2
    # The counters restart with the new chain; it saw the packets sent after it took over.
    assert 0 < dpi.packets <= 4 * per_flow

    # Whole flows: each flow's packets all go to one instance's port, and both get flows.
    chosen = Counter()
    for sport in sports:
        before = port_tx(lab)
        lab.send(sport, DPORT, 50)
        time.sleep(0.05)
        after = port_tx(lab)
        delta = {p: after[p] - before[p] for p in PORTS}
        busy = max(delta, key=delta.get)
        # A port may send a stray frame of its own (IPv6 neighbour discovery), never a flow's.
        assert delta[busy] >= 50 and min(delta.values()) <= 3, (sport, delta)
        chosen[busy] += 1
    assert set(chosen) == set(PORTS), f"16 flows all on one instance: {chosen}"

    # A killed agent restores the scaled-out chain from its journal: both instances again.
    lab.kill()
    lab.start()
    stub = lab.stub()
    rx = FlowReceiver(lab, DPORT)
    for sport in sports:
        lab.send(sport, DPORT, 20)
    assert rx.stop() == dict.fromkeys(sports, 20)
    assert all(port_tx(lab)[p] >= 20 for p in PORTS), port_tx(lab)
    fns = stub.GetState(na.GetStateRequest(), timeout=10).state.chains[0].functions
    assert fns[1].instances == 2 and fns[1].packets == 20 * len(sports)


def test_a_scale_out_that_fails_while_applied_leaves_the_previous_chain(lab):
    stub = lab.stub()
    netns.apply(stub, lab)
    (sport,) = flows(stub, lab, 1)
    stub.SetChain(na.SetChainRequest(action_id="one", chain=dpi_chain(1, "GAME")), timeout=10)
    before = stub.GetState(na.GetStateRequest(), timeout=10).state.chains

    # Injected failure: the name of instance 1's veth peer is taken, so its port cannot be made
    # (after validation passed: the request is good).
    netns.sh("ip", "-n", lab.ns_a, "link", "add", "cglxdp0-1p", "type", "veth", "peer",
             "name", "cglblock")
    with pytest.raises(grpc.RpcError) as err:
        stub.SetChain(na.SetChainRequest(action_id="two", chain=dpi_chain(2, "GAME")), timeout=10)
    assert err.value.code() == grpc.StatusCode.INTERNAL
    assert "cglxdp0-1" in err.value.details() and "2 AF_XDP instance" in err.value.details()
    after = stub.GetState(na.GetStateRequest(), timeout=10).state.chains
    for chains in (before, after):
        for c in chains:
            for f in c.functions:
                f.packets = f.dropped_packets = 0
    assert list(after) == list(before), "the chain changed although its change failed"
    assert port_tx(lab)["cglxdp0-1"] == 0 and subprocess.run(
        ["ip", "-n", lab.ns_a, "link", "show", "cglxdp0-1"], capture_output=True
    ).returncode != 0, "the half-made port is left"
    # The previous chain still works: the pattern marked EF by the one instance.
    rx = netns.Receiver(lab, DPORT)
    lab.send(sport, DPORT, 30, payload=b"..GAME..")
    got = rx.stop()
    assert sorted(d for _, d in got) == [46] * 30, got

    # The same request once the name is free again is applied (the action id is new: a
    # refused change is not remembered as done).
    netns.sh("ip", "-n", lab.ns_a, "link", "del", "cglxdp0-1p")
    stub.SetChain(na.SetChainRequest(action_id="two-again", chain=dpi_chain(2, "GAME")),
                  timeout=10)
    rx = netns.Receiver(lab, DPORT)
    lab.send(sport, DPORT, 30, payload=b"..GAME..")
    assert sorted(d for _, d in rx.stop()) == [46] * 30
    fns = stub.GetState(na.GetStateRequest(), timeout=10).state.chains[0].functions
    assert fns[1].instances == 2 and fns[1].packets == 30
