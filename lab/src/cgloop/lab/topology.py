"""The lab's topology: nodes (network namespaces) joined by links (veth pairs), one declaration.

Each node becomes the namespace `<lab name>-<node name>`; node names have no hyphen, so the lab a
namespace belongs to is always `ns.rsplit("-", 1)[0]` and labs with overlapping names (tests run
as `cgl-lab-<pid>`) never claim each other's namespaces. Interfaces are named after the node at
the other end of their link and exist only inside namespaces, so nothing is created in the
host's namespace and two labs never collide there either.
"""

from __future__ import annotations

import ipaddress
from collections import deque
from enum import StrEnum
from itertools import pairwise
from pathlib import Path

from cgloop.lab.yamlfile import load_yaml_model
from pydantic import BaseModel, ConfigDict, Field, model_validator

DEFAULT_TOPOLOGY = "topology.yaml"  # lab v2: a core router, two edges, two homes
V1_TOPOLOGY = "topology-v1.yaml"  # the first lab: one edge, one home


class Role(StrEnum):
    router = "router"
    game_server = "game-server"
    client = "client"
    bulk_sender = "bulk-sender"
    app_server = "app-server"


class Node(BaseModel):
    model_config = ConfigDict(extra="forbid")

    # ≤ 12 characters so the interface named after it fits IFNAMSIZ with room to spare.
    name: str = Field(pattern=r"^[a-z][a-z0-9]{0,11}$")
    role: Role


class Tier(StrEnum):
    access = "access"  # a home's bottleneck (edge → cpe), managed by the edge's agent
    core = "core"  # a core router's link towards an edge, managed by the core's agent


class Bottleneck(BaseModel):
    """Shaping of a link: HTB on both ends' egress, one default leaf with a FIFO."""

    model_config = ConfigDict(extra="forbid")

    down_mbit: float = Field(gt=0, description="rate of a→b (egress of a)")
    up_mbit: float = Field(gt=0, description="rate of b→a (egress of b)")
    limit_packets: int = Field(default=1000, ge=1, le=100_000)
    tier: Tier = Tier.access


class Link(BaseModel):
    model_config = ConfigDict(extra="forbid")

    a: str
    b: str
    subnet: ipaddress.IPv4Network
    bottleneck: Bottleneck | None = None

    @model_validator(mode="after")
    def _room_for_two(self) -> Link:
        if self.subnet.num_addresses < 4:
            raise ValueError(f"subnet {self.subnet} of link {self.a}-{self.b} needs ≥ 2 hosts")
        return self

    @property
    def addr_a(self) -> ipaddress.IPv4Address:
        return self.subnet.network_address + 1

    @property
    def addr_b(self) -> ipaddress.IPv4Address:
        return self.subnet.network_address + 2


class Topology(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(default="cgl", pattern=r"^[a-z][a-z0-9-]{0,30}$")
    nodes: list[Node]
    links: list[Link]

    @model_validator(mode="after")
    def _consistent(self) -> Topology:
        names = [n.name for n in self.nodes]
        if len(set(names)) != len(names):
            raise ValueError("node names must be unique")
        pairs = set()
        for link in self.links:
            for end in (link.a, link.b):
                if end not in names:
                    raise ValueError(f"link {link.a}-{link.b}: unknown node {end!r}")
            if link.a == link.b:
                raise ValueError(f"link {link.a}-{link.b} joins a node to itself")
            pair = frozenset((link.a, link.b))
            if pair in pairs:
                raise ValueError(f"two links between {link.a} and {link.b}")
            pairs.add(pair)
        nets = [link.subnet for link in self.links]
        for i, x in enumerate(nets):
            for y in nets[i + 1 :]:
                if x.overlaps(y):
                    raise ValueError(f"subnets {x} and {y} overlap")
        for node in self.nodes:
            if node.role != Role.router and len(self.neighbours(node.name)) != 1:
                raise ValueError(f"host {node.name!r} must have exactly one link (to its router)")
        for link in self.bottlenecks():
            if self.node(link.a).role != Role.router:
                raise ValueError(
                    f"shaped link {link.a}-{link.b}: its `a` end (the downstream sender) must be "
                    "a router"
                )
        return self

    def with_name(self, name: str) -> Topology:
        return Topology.model_validate({**self.model_dump(mode="json"), "name": name})

    def node(self, name: str) -> Node:
        for node in self.nodes:
            if node.name == name:
                return node
        raise KeyError(f"no node {name!r} in topology {self.name!r}")

    def netns(self, node: str) -> str:
        self.node(node)
        return f"{self.name}-{node}"

    def neighbours(self, node: str) -> list[str]:
        return [
            link.b if link.a == node else link.a for link in self.links if node in (link.a, link.b)
        ]

    def link_between(self, x: str, y: str) -> Link:
        for link in self.links:
            if {link.a, link.b} == {x, y}:
                return link
        raise KeyError(f"no link between {x} and {y}")

    def address(self, node: str) -> ipaddress.IPv4Address:
        """A host's address (the one on its only link); routers: the first link's."""
        link = self.link_between(node, self.neighbours(node)[0])
        return link.addr_a if link.a == node else link.addr_b

    def address_on(self, node: str, peer: str) -> ipaddress.IPv4Address:
        """`node`'s address on its link to `peer` (a router's address facing that peer)."""
        link = self.link_between(node, peer)
        return link.addr_a if link.a == node else link.addr_b

    def bottlenecks(self) -> list[Link]:
        """Every shaped link, whatever its tier."""
        return [link for link in self.links if link.bottleneck]

    def access_links(self) -> list[Link]:
        """The homes' bottlenecks (edge → cpe), in declaration order."""
        return [
            link for link in self.links
            if link.bottleneck and link.bottleneck.tier == Tier.access
        ]

    def core_links(self) -> list[Link]:
        """The shaped links of the core (core → edge), in declaration order."""
        return [
            link for link in self.links if link.bottleneck and link.bottleneck.tier == Tier.core
        ]

    def bottleneck(self) -> Link:
        """The first access bottleneck (the only one in a one-edge lab)."""
        found = self.access_links()
        if not found:
            raise KeyError(f"topology {self.name!r} declares no bottleneck link")
        return found[0]

    def path(self, src: str, dst: str) -> list[str]:
        """The nodes a packet from `src` to `dst` visits, both ends included (breadth-first;
        hosts do not forward)."""
        self.node(src)
        self.node(dst)
        prev: dict[str, str | None] = {src: None}
        queue = deque([src])
        while queue:
            cur = queue.popleft()
            if cur == dst:
                break
            if cur != src and self.node(cur).role != Role.router:
                continue
            for nxt in self.neighbours(cur):
                if nxt not in prev:
                    prev[nxt] = cur
                    queue.append(nxt)
        if dst not in prev:
            raise KeyError(f"no path from {src} to {dst} in topology {self.name!r}")
        out: list[str] = [dst]
        while (hop := prev[out[-1]]) is not None:
            out.append(hop)
        return out[::-1]

    def shaped_hops(self, src: str, dst: str) -> list[tuple[str, str]]:
        """The shaped egresses (node, interface) a packet from `src` to `dst` queues at."""
        hops = self.path(src, dst)
        out = []
        for x, y in pairwise(hops):
            if self.link_between(x, y).bottleneck:
                out.append((x, y))
        return out

    def egress_mbit(self, node: str, peer: str) -> float | None:
        """The shaped rate of `node`'s egress towards `peer`, None if the link is not shaped."""
        link = self.link_between(node, peer)
        if link.bottleneck is None:
            return None
        return link.bottleneck.down_mbit if link.a == node else link.bottleneck.up_mbit

    def access_link_of(self, host: str) -> Link:
        """The access bottleneck a host sits behind (its home's edge → cpe link)."""
        for link in self.access_links():
            if link.b in self.path(link.a, host)[1:]:
                return link
        raise KeyError(f"{host!r} is behind no access bottleneck in topology {self.name!r}")

    def routes(self, node: str) -> list[tuple[ipaddress.IPv4Network, ipaddress.IPv4Address]]:
        """(destination, gateway) for every subnet `node` is not attached to.

        Hosts get a default route to their router; routers a route per remote subnet through
        the neighbour on the shortest path (breadth-first; labs are small trees).
        """
        if self.node(node).role != Role.router:
            (peer,) = self.neighbours(node)
            link = self.link_between(node, peer)
            gw = link.addr_b if link.a == node else link.addr_a
            return [(ipaddress.IPv4Network("0.0.0.0/0"), gw)]
        first_hop: dict[str, str] = {}
        queue = deque()
        for peer in self.neighbours(node):
            first_hop[peer] = peer
            queue.append(peer)
        seen = {node, *first_hop}
        while queue:
            cur = queue.popleft()
            if self.node(cur).role != Role.router:
                continue  # hosts do not forward
            for nxt in self.neighbours(cur):
                if nxt not in seen:
                    seen.add(nxt)
                    first_hop[nxt] = first_hop[cur]
                    queue.append(nxt)
        attached = {self.link_between(node, p).subnet for p in self.neighbours(node)}
        out = []
        for link in self.links:
            if link.subnet in attached:
                continue
            hop = first_hop.get(link.a) or first_hop.get(link.b)
            if hop is None:
                continue
            via = self.link_between(node, hop)
            out.append((link.subnet, via.addr_b if via.a == node else via.addr_a))
        return out


def load_topology(
    path: Path | None = None, name: str | None = None, shipped: str = DEFAULT_TOPOLOGY
) -> Topology:
    """The topology in `path` (YAML), or the shipped file `shipped` (the v2 default, or
    V1_TOPOLOGY); `name` overrides the lab name."""
    topo = load_yaml_model(Topology, path, shipped, "topology")
    return topo.with_name(name) if name else topo
