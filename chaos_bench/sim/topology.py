"""Cluster instances: who links to whom, at which rates, and the routes to the new node.

The random topology is the testbed's (:func:`chaosctl.testbed.topo.topology`, ``random``): node
``i`` links to ``degree`` random earlier nodes, drawn the same way, so a seed gives the same
graph; the testbed caps it at 200 namespaces, the simulation does not. The new node is the last
one, ``n{N+1}``: it links to ``degree`` random existing nodes, its replication neighbours.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from chaos_bench.scaleout.run import routes_from as testbed_routes
from chaos_bench.sim.network import MBIT, key


@dataclass(frozen=True)
class Instance:
    """One scale-out ``N -> N+1`` to simulate.

    Attributes:
        size: N, the existing nodes ``n1..nN``.
        new: The new node.
        neighbours: Its replication neighbours (its links).
        rates: Goodput per undirected link, bytes/s (what flows get).
        probed: The neighbour links' rates as the new node's probes measured them, bytes/s
            (what the planners see).
        routes: Shortest-hop path from the new node to every existing node (first hop a
            neighbour, last the node itself).
        together: Per neighbour, its link's goodput to the new node while other neighbour
            links carry too, bytes/s (measured all at once); empty: each link keeps its rate.
    """

    size: int
    new: str
    neighbours: tuple[str, ...]
    rates: Mapping[tuple[str, str], float]
    probed: Mapping[str, float]
    routes: Mapping[str, tuple[str, ...]]
    together: Mapping[str, float] = field(default_factory=dict)


def _index(node: str) -> int:
    return int(node[1:])


def random_links(count: int, rng: random.Random, degree: int) -> list[tuple[str, str]]:
    """The testbed's ``random`` topology over ``n1..n{count}``, sorted."""
    links: set[tuple[str, str]] = set()
    for i in range(1, count):
        for j in rng.sample(range(i), min(degree, i)):
            links.add((f"n{j + 1}", f"n{i + 1}"))
    return sorted(links, key=lambda ln: (_index(ln[0]), _index(ln[1])))


def routes_from(links: Iterable[tuple[str, str]], new: str) -> dict[str, tuple[str, ...]]:
    """Shortest-hop paths from ``new``: the testbed bench's own routing, so the simulation
    relays exactly as the testbed does."""
    return {node: tuple(path) for node, path in testbed_routes(list(links), new).items()}


def generate(size: int, rng: random.Random, *, degree: int = 3,
             bw_mbps: tuple[float, float] = (100.0, 1000.0), efficiency: float = 0.956
             ) -> Instance:
    """A fresh testbed-like instance: the topology, one tbf rate per link, the routes.

    ``efficiency`` turns a configured tbf rate into TCP goodput (the testbed's iperf3 saw
    0.956 of it, the median over its instances); the probes see the goodput.
    """
    links = random_links(size + 1, rng, degree)
    new = f"n{size + 1}"
    rates = {key(a, b): round(rng.uniform(*bw_mbps)) * MBIT * efficiency for a, b in links}
    nbrs = tuple(sorted((b if a == new else a for a, b in links if new in (a, b)), key=_index))
    return Instance(size, new, nbrs, rates, {n: rates[key(n, new)] for n in nbrs},
                    routes_from(links, new))
