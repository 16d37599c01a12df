"""Each guard blocks what it should, and nothing else."""

from __future__ import annotations

import pytest
from cgloop.policy import model
from cgloop.policy.guards import NS, Budget, GuardBook, Proposal

BASE = {
    "id": "p",
    "match": {"kinds": ["slo_latency"]},
    "action": {"operation": "set_class_rate", "parameters": {"class_id": 0x10010, "rate_bps": 10}},
    "guards": {"hold_time": 0},
}


def pol(**guards: object) -> model.Policy:
    data = {**BASE, "guards": {"hold_time": 0, **guards}}
    return model.Policy.model_validate(data)


def prop(
    p: model.Policy, target: str = "node=a", op: str = "set_class_rate", n: int = 0, **kw: object
) -> Proposal:
    params = kw.pop("parameters", {"rate_bps": 10.0})
    return Proposal(f"id{n}", p, model.Operation(op), target, params, **kw)  # type: ignore[arg-type]


T0 = 1_000 * NS


def test_no_guard_fires_on_a_clean_first_action() -> None:
    book = GuardBook()
    assert book.check(prop(pol()), T0) is None


def test_blacklist_blocks_listed_node_device_address_only() -> None:
    p = pol(blacklist={"node_ids": ["core-1"], "addresses": ["10.9.9.9"], "device_ids": ["of:1"]})
    book = GuardBook()
    assert book.check(prop(p, node_id="core-1"), T0).guard == "blacklist"
    assert book.check(prop(p, device_id="of:1"), T0).guard == "blacklist"
    assert book.check(prop(p, addresses=("10.0.0.1", "10.9.9.9")), T0).guard == "blacklist"
    assert book.check(prop(p, node_id="edge-1", addresses=("10.0.0.1",)), T0) is None


def test_bounds_block_out_of_range_values_only() -> None:
    p = pol(bounds={"rate_bps": {"min": 5, "max": 100}})
    book = GuardBook()
    assert "below the minimum" in book.check(prop(p, parameters={"rate_bps": 4}), T0).reason
    assert "above the maximum" in book.check(prop(p, parameters={"rate_bps": 101}), T0).reason
    assert book.check(prop(p, parameters={"rate_bps": 100}), T0) is None
    assert book.check(prop(p, parameters={"ceil_bps": 1}), T0) is None  # other parameter


def test_one_action_in_flight_per_target() -> None:
    p = pol()
    book = GuardBook()
    book.started(prop(p, n=1), T0)
    assert book.check(prop(p, n=2), T0).guard == "in_flight"
    assert book.check(prop(p, target="node=b", n=2), T0) is None
    book.finished("node=a", "id1", T0)
    assert book.check(prop(p, n=2), T0) is None


def test_hold_time_per_policy_and_target() -> None:
    p, other = pol(hold_time="2s"), pol(hold_time="2s").model_copy(update={"id": "q"})
    book = GuardBook()
    book.started(prop(p, n=1), T0)
    book.finished("node=a", "id1", T0)
    assert book.check(prop(p, n=2), T0 + NS).guard == "hold_time"
    assert book.check(prop(other, n=2), T0 + NS) is None  # another policy
    assert book.check(prop(p, target="node=b", n=2), T0 + NS) is None  # another target
    assert book.check(prop(p, n=2), T0 + 2 * NS) is None


def test_cooldown_after_any_action_on_the_target() -> None:
    p = pol(cooldown="3s")
    other = pol(cooldown="3s").model_copy(update={"id": "q"})
    book = GuardBook()
    book.started(prop(p, n=1), T0)
    book.finished("node=a", "id1", T0 + NS)
    assert book.check(prop(other, n=2), T0 + 3 * NS).guard == "cooldown"
    assert book.check(prop(other, n=2), T0 + 4 * NS) is None
    assert book.check(prop(other, target="node=b", n=2), T0 + 2 * NS) is None


def test_frequency_limit_per_operation_and_target_in_window() -> None:
    p = pol(frequency={"limit": 2, "window": "10s"})
    book = GuardBook()
    for n, t in enumerate((0, 1)):
        book.started(prop(p, n=n), T0 + t * NS)
        book.finished("node=a", f"id{n}", T0 + t * NS)
    assert book.check(prop(p, n=3), T0 + 5 * NS).guard == "frequency"
    assert book.check(prop(p, op="notify", n=3, parameters={}), T0 + 5 * NS) is None
    assert book.check(prop(p, n=3), T0 + 10 * NS + 1) is None  # first one left the window


def test_coordination_blocks_listed_operations_during_the_hold() -> None:
    power = model.Policy.model_validate(
        {
            "id": "power",
            "match": {"kinds": ["node_overload"]},
            "action": {
                "operation": "set_power_policy",
                "parameters": {"cores": [1], "min_frequency_khz": 1, "max_frequency_khz": 2},
            },
            "guards": {"hold_time": "60s", "blocks": ["set_chain"]},
        }
    )
    book = GuardBook()
    book.started(prop(power, op="set_power_policy", n=1), T0)
    book.finished("node=a", "id1", T0 + NS)
    chain = pol()
    refusal = book.check(prop(chain, op="set_chain", n=2, parameters={}), T0 + 2 * NS)
    assert refusal.guard == "coordination" and "power" in refusal.reason
    assert book.check(prop(chain, op="set_class_rate", n=2), T0 + 2 * NS) is None
    assert book.check(prop(chain, op="set_chain", n=2, parameters={}), T0 + 61 * NS) is None


def test_global_budget_counts_all_policies() -> None:
    book = GuardBook(budget=Budget(limit=3, window_s=60))
    for n in range(3):
        p = pol().model_copy(update={"id": f"p{n}"})
        book.started(prop(p, target=f"node={n}", n=n), T0)
        book.finished(f"node={n}", f"id{n}", T0)
    assert book.check(prop(pol(), target="node=x", n=9), T0 + NS).guard == "budget"
    assert book.check(prop(pol(), target="node=x", n=9), T0 + 61 * NS) is None


@pytest.mark.parametrize("guard", ["hold_time", "cooldown"])
def test_refusal_text_names_the_guard(guard: str) -> None:
    p = pol(**{guard: "5s"})
    book = GuardBook()
    book.started(prop(p, n=1), T0)
    book.finished("node=a", "id1", T0)
    assert str(book.check(prop(p, n=2), T0 + NS)).startswith(f"guard {guard}:")
