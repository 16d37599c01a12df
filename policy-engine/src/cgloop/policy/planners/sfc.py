"""SFC placement heuristics LB, LC and LBLC (Xiang thesis §2.3, Fig. 2.2).

Nodes have a number of function slots; a chain is an ordered list of service functions (SFs).
* LB (load balancing): each SF on the least-loaded node (processing latency only).
* LC (least connection): start on the node running the service application, put as many SFs
  there as fit, then continue on another node (the thesis picks it at random; we take a seeded
  generator so plans are reproducible).
* LBLC: place like LB (same multiset of nodes, so the same load), then reorder the mapping
  of the chain's SFs onto the spawned instances so the chain crosses nodes as few times as
  possible: each node's SFs become contiguous, starting from the service node when it has any.
`inter_node_links` counts the chain's hops between different nodes (transmission latency).

`plan_chain` places the functions of a node-agent chain (`cgloop.v1.ServiceChain`, checked
against the chain catalogue as the agent would check it) with one of the three heuristics; the
bare functions take any SF names, for the thesis's examples.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from cgloop.policy.planners import catalogue
from cgloop.v1 import node_agent_pb2 as na


@dataclass(frozen=True)
class Node:
    name: str
    slots: int  # how many more SFs fit
    load: float = 0.0  # current computational load, same unit as sf_load


def _check(chain: Sequence[str], nodes: Sequence[Node]) -> None:
    if sum(n.slots for n in nodes) < len(chain):
        raise ValueError(
            f"{len(chain)} functions do not fit in {sum(n.slots for n in nodes)} free slots"
        )


def lb(chain: Sequence[str], nodes: Sequence[Node], sf_load: float = 1.0) -> list[str]:
    """Each SF on the currently least-loaded node with a free slot (ties: node order)."""
    _check(chain, nodes)
    load = {n.name: n.load for n in nodes}
    slots = {n.name: n.slots for n in nodes}
    out = []
    for _ in chain:
        best = min((n for n in nodes if slots[n.name] > 0), key=lambda n: load[n.name])
        out.append(best.name)
        load[best.name] += sf_load
        slots[best.name] -= 1
    return out


def lc(chain: Sequence[str], nodes: Sequence[Node], service_node: str, seed: int = 0) -> list[str]:
    """Fill the service application's node first, then other nodes one at a time."""
    _check(chain, nodes)
    by_name = {n.name: n for n in nodes}
    if service_node not in by_name:
        raise ValueError(f"service node {service_node!r} is not among the nodes")
    rng = random.Random(seed)
    others = [n.name for n in nodes if n.name != service_node]
    rng.shuffle(others)
    out: list[str] = []
    for name in [service_node, *others]:
        take = min(by_name[name].slots, len(chain) - len(out))
        out += [name] * take
        if len(out) == len(chain):
            break
    return out


def lblc(
    chain: Sequence[str],
    nodes: Sequence[Node],
    service_node: str | None = None,
    sf_load: float = 1.0,
) -> list[str]:
    """LB's nodes, remapped so the chain visits each node once."""
    placed = lb(chain, nodes, sf_load)
    counts: dict[str, int] = {}
    for name in placed:
        counts[name] = counts.get(name, 0) + 1
    order = sorted(counts, key=lambda n: (n != service_node, placed.index(n)))
    return [name for name in order for _ in range(counts[name])]


def inter_node_links(placement: Sequence[str]) -> int:
    return sum(1 for a, b in itertools.pairwise(placement) if a != b)


def node_loads(
    placement: Sequence[str], nodes: Sequence[Node], sf_load: float = 1.0
) -> Mapping[str, float]:
    load = {n.name: n.load for n in nodes}
    for name in placement:
        load[name] += sf_load
    return load


def plan_chain(
    chain: na.ServiceChain,
    nodes: Sequence[Node],
    heuristic: Literal["lb", "lc", "lblc"] = "lblc",
    service_node: str | None = None,
) -> list[tuple[str, str]]:
    """(function name, node) per function of an agent chain, in packet order; the chain must
    pass the catalogue's checks (catalogue.CatalogueError otherwise)."""
    catalogue.check_chain(chain)
    names = [catalogue.name_of(f) for f in chain.functions]
    if heuristic == "lb":
        placed = lb(names, nodes)
    elif heuristic == "lc":
        if service_node is None:
            raise ValueError("LC starts on the service node: name it")
        placed = lc(names, nodes, service_node)
    else:
        placed = lblc(names, nodes, service_node)
    return list(zip(names, placed, strict=True))
