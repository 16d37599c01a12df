"""The in-memory agent's ProtectFlows refuses what the agent's latency guard refuses (field and
bounds named, the same status codes), all or nothing, and keeps protections as it does: upsert
by (interface, flow), ttl 0 removes, a renewal changes only the expiry, replays by action id."""

from __future__ import annotations

import time
from collections.abc import Iterator

import grpc
import pytest
from cgloop.policy.testing import AgentBounds, AgentServer, MemoryNodeAgent, flow
from cgloop.v1 import node_agent_pb2 as na
from cgloop.v1.node_agent_pb2_grpc import NodeAgentServiceStub

S = 1_000_000_000


@pytest.fixture
def stub() -> Iterator[NodeAgentServiceStub]:
    bounds = AgentBounds(interfaces=["veth0"], max_protected_flows=2)
    with (
        AgentServer(MemoryNodeAgent(bounds=bounds)) as server,
        grpc.insecure_channel(server.address) as ch,
    ):
        yield NodeAgentServiceStub(ch)


def pf(port: int = 40000, **kw) -> na.ProtectedFlow:
    fields = dict(
        interface_name="veth0", flow=flow(port=port), latency_slo_ns=20_000_000,
        class_id=0x10010, rewrite_dscp=46, ttl_ns=30 * S,
    )
    fields.update(kw)
    return na.ProtectedFlow(**fields)


def call(stub, action_id: str, *flows: na.ProtectedFlow, dry_run: bool = False):
    return stub.ProtectFlows(
        na.ProtectFlowsRequest(action_id=action_id, dry_run=dry_run, flows=list(flows)), timeout=5
    )


def protected(stub) -> list[na.ProtectedFlow]:
    return list(stub.GetState(na.GetStateRequest(), timeout=5).state.protected_flows)


@pytest.mark.parametrize(
    ("flow_", "code", "words"),
    [
        (pf(latency_slo_ns=99_999), "INVALID_ARGUMENT",
         "flows[1].latency_slo_ns 99999 is outside 100000..10000000000 (100 µs..10 s)"),
        (pf(latency_slo_ns=10 * S + 1), "INVALID_ARGUMENT", "latency_slo_ns 10000000001"),
        (pf(ttl_ns=S - 1), "INVALID_ARGUMENT",
         "flows[1].ttl_ns 999999999 is outside 1000000000..3600000000000 (1 s..1 h; 0 removes)"),
        (pf(ttl_ns=3601 * S), "INVALID_ARGUMENT", "ttl_ns 3601000000000 is outside"),
        (pf(rewrite_dscp=64), "INVALID_ARGUMENT", "flows[1].rewrite_dscp 64 is not within 0..63"),
        (pf(class_id=0x10099), "FAILED_PRECONDITION",
         "flows[1].class_id 1:99: the class does not exist in veth0's hierarchy; name a leaf"),
        (pf(class_id=0x10001), "FAILED_PRECONDITION",
         "flows[1].class_id 1:1: the class has children in veth0's hierarchy"),
        (pf(class_id=0), "INVALID_ARGUMENT", "flows[1].class_id is 0: name the class"),
        (pf(interface_name="lo"), "PERMISSION_DENIED",
         'flows[1].interface_name: interface "lo" is not in the agent\'s [bounds] interfaces'),
        (pf(interface_name=""), "INVALID_ARGUMENT", "flows[1].interface_name is empty"),
        (na.ProtectedFlow(interface_name="veth0", ttl_ns=30 * S), "INVALID_ARGUMENT",
         "flows[1].flow is missing: name the 5-tuple to protect"),
    ],
)
def test_refusals_name_the_field_and_its_bounds_and_change_nothing(stub, flow_, code, words):
    with pytest.raises(grpc.RpcError) as exc:
        call(stub, "bad", pf(port=1), flow_)
    assert exc.value.code().name == code
    assert words in exc.value.details(), exc.value.details()
    assert protected(stub) == []  # all or nothing: flows[0] was fine


def test_an_empty_request_is_refused(stub) -> None:
    with pytest.raises(grpc.RpcError) as exc:
        call(stub, "a")
    assert exc.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "flows is empty: name a flow to protect" in exc.value.details()


def test_no_hierarchy_on_the_interface_is_a_failed_precondition() -> None:
    agent = MemoryNodeAgent(hierarchies=())
    with (
        AgentServer(agent) as server,
        grpc.insecure_channel(server.address) as ch,
        pytest.raises(grpc.RpcError) as exc,
    ):
        call(NodeAgentServiceStub(ch), "a", pf())
    assert exc.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "veth0 has no queue hierarchy" in exc.value.details()


def test_the_count_is_bounded_and_a_removal_makes_room(stub) -> None:
    call(stub, "a", pf(1), pf(2))
    with pytest.raises(grpc.RpcError) as exc:
        call(stub, "b", pf(3))
    assert exc.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "3 protected flows would be in place; [guard] max_protected_flows is 2" in (
        exc.value.details()
    )
    # Removing one (ttl 0, no other field checked) and adding another in one request fits.
    resp = call(stub, "c", na.ProtectedFlow(interface_name="veth0", flow=flow(port=1)), pf(3))
    assert [p.flow.dst_port for p in resp.previous] == [1]
    assert sorted(p.flow.dst_port for p in protected(stub)) == [2, 3]


def test_upsert_renewal_replay_and_dry_run(stub) -> None:
    first = call(stub, "a", pf())
    assert first.outcome.changed and not first.previous
    (applied,) = first.applied
    assert applied.expires_ns >= first.outcome.applied_ns + 30 * S - S
    # The same terms again: a renewal (later expiry, nothing changed in the datapath).
    renewal = call(stub, "b", pf())
    assert not renewal.outcome.changed
    assert renewal.outcome.message == "latency guard: 1 flow(s) protected, 0 released"
    assert renewal.applied[0].expires_ns > applied.expires_ns
    assert renewal.previous[0].latency_slo_ns == 20_000_000
    # The same action id again is a replay, whatever it carries.
    again = call(stub, "b", pf(latency_slo_ns=50_000_000))
    assert again.outcome.replayed and protected(stub)[0].latency_slo_ns == 20_000_000
    dry = call(stub, "c", pf(latency_slo_ns=50_000_000), dry_run=True)
    assert dry.outcome.dry_run and not dry.outcome.changed
    assert dry.applied[0].latency_slo_ns == 50_000_000
    assert protected(stub)[0].latency_slo_ns == 20_000_000
    changed = call(stub, "d", pf(latency_slo_ns=50_000_000))
    assert changed.outcome.changed and protected(stub)[0].latency_slo_ns == 50_000_000


def test_expired_protections_are_dropped(stub, monkeypatch) -> None:
    call(stub, "a", pf(ttl_ns=S))
    assert len(protected(stub)) == 1
    later = time.time_ns() + 2 * S
    monkeypatch.setattr(time, "time_ns", lambda: later)
    assert protected(stub) == []
