"""The testbed's plan as pure functions: topologies, link bandwidths and the address plan.

Nothing here touches the system, so the plan is unit-tested without root and is the same for
the same seed on every machine. :mod:`chaosctl.testbed.net` turns a plan into namespaces.

Address plan (every address lives inside a testbed namespace, so two testbeds never clash):

- node ``n<i>``: data address ``10.10.<i // 256>.<i % 256>/32`` on its loopback. It is reachable
  only over the node's data links, through one /32 route per neighbour, so the same address
  works from every neighbour and a non-neighbour has no route to it.
- management: ``10.254.0.<i>/24`` on the node's ``mgmt`` veth, bridged in the hub namespace,
  which holds the broker at :data:`HUB_ADDR`. The bridge ports are isolated, so a node reaches
  the broker and nothing else over it.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from typing import Literal, get_args

TopologyKind = Literal["line", "ring", "star", "full", "random"]
TOPOLOGIES: tuple[str, ...] = get_args(TopologyKind)
MAX_NODES = 200  # the management /24 holds .1-.253; the hub is .254
HUB_ADDR = "10.254.0.254"
MGMT_PREFIXLEN = 24
DEFAULT_DEGREE = 2  # "each new node gets k random earlier neighbours"
_BW_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(?:-\s*(\d+(?:\.\d+)?))?\s*$")

Link = tuple[str, str]


class TopologyError(ValueError):
    """A testbed parameter is out of range (the CLI turns it into a usage error)."""


def node_names(count: int) -> list[str]:
    """``n1..nN``."""
    return [f"n{i}" for i in range(1, count + 1)]


def node_index(node: str) -> int:
    """The number of node ``n<i>``.

    Raises:
        TopologyError: ``node`` is not of the form ``n<i>``.
    """
    if not re.fullmatch(r"n[1-9]\d*", node):
        raise TopologyError(f"node names are n1, n2, ...; got {node!r}")
    return int(node[1:])


def data_addr(node: str) -> str:
    """The node's stable data-plane address (no prefix length)."""
    i = node_index(node)
    return f"10.10.{i // 256}.{i % 256}"


def mgmt_addr(node: str) -> str:
    """The node's management address (no prefix length), used only to reach the broker."""
    return f"10.254.0.{node_index(node)}"


def link_dev(peer: str) -> str:
    """Interface name, inside a node's namespace, of its link to ``peer`` (``n3`` -> ``e3``)."""
    return f"e{node_index(peer)}"


def norm(a: str, b: str) -> Link:
    """A link as a sorted pair, so ``(n2, n1)`` and ``(n1, n2)`` are one link."""
    return (a, b) if node_index(a) < node_index(b) else (b, a)


def topology(kind: str, count: int, rng: random.Random, degree: int = DEFAULT_DEGREE) -> list[Link]:
    """The data links of a ``count``-node testbed, sorted.

    Args:
        kind: ``line`` (n1-n2-...-nN), ``ring`` (a line closed by nN-n1), ``star`` (n1 is the
            centre), ``full`` (every pair), or ``random``: node i connects to ``degree`` random
            earlier nodes (all of them while there are fewer), as in the paper's testbed, so
            the graph is connected by construction.
        count: Number of nodes.
        rng: The seeded source of randomness (used by ``random`` only).
        degree: Neighbours each new node gets in ``random``.

    Raises:
        TopologyError: An unknown kind or a count/degree out of range.
    """
    if not 1 <= count <= MAX_NODES:
        raise TopologyError(f"--nodes must be between 1 and {MAX_NODES}, not {count}")
    if degree < 1:
        raise TopologyError(f"--degree must be at least 1, not {degree}")
    names = node_names(count)
    links: set[Link] = set()
    if kind == "line":
        links = {(names[i], names[i + 1]) for i in range(count - 1)}
    elif kind == "ring":
        links = {(names[i], names[i + 1]) for i in range(count - 1)}
        if count > 2:
            links.add(norm(names[-1], names[0]))
    elif kind == "star":
        links = {(names[0], n) for n in names[1:]}
    elif kind == "full":
        links = {(a, b) for i, a in enumerate(names) for b in names[i + 1:]}
    elif kind == "random":
        for i in range(1, count):
            for j in rng.sample(range(i), min(degree, i)):
                links.add(norm(names[j], names[i]))
    else:
        raise TopologyError(f"--topology must be one of {', '.join(TOPOLOGIES)}, not {kind!r}")
    return sorted(links, key=lambda ln: (node_index(ln[0]), node_index(ln[1])))


def parse_bw(text: str) -> tuple[float, float]:
    """Parse ``--bw``: ``LOW-HIGH`` or a single ``RATE``, in Mbit/s.

    Raises:
        TopologyError: Not a number or range, non-positive, or LOW above HIGH.
    """
    match = _BW_RE.match(text)
    if not match:
        raise TopologyError(
            f"--bw must be MBIT or LOW-HIGH in Mbit/s (e.g. 100-1000), not {text!r}")
    low = float(match.group(1))
    high = float(match.group(2) or low)
    if low <= 0 or high < low:
        raise TopologyError(f"--bw needs 0 < LOW <= HIGH, got {text!r}")
    return low, high


def draw_rates(links: list[Link], bw: tuple[float, float], rng: random.Random) -> dict[Link, float]:
    """One bandwidth per link, uniform in ``bw`` (Mbit/s), rounded to 1 Mbit/s."""
    low, high = bw
    return {link: float(round(rng.uniform(low, high))) or low for link in links}


def neighbours(links: list[Link], node: str) -> list[str]:
    """The node's neighbours in ``links``, in node order."""
    out = [b if a == node else a for a, b in links if node in (a, b)]
    return sorted(out, key=node_index)


@dataclass(frozen=True)
class Plan:
    """Everything that decides the testbed's shape, drawn once from the seed.

    Attributes:
        nodes: ``n1..nN``.
        links: The data links, sorted.
        rates: The first bandwidth of each link, Mbit/s.
        bw: The range redraws use, Mbit/s.
        seed: The seed everything was drawn from.
        kind: The topology's name.
    """

    nodes: list[str]
    links: list[Link]
    rates: dict[Link, float]
    bw: tuple[float, float]
    seed: int
    kind: str

    @classmethod
    def make(cls, count: int, kind: str = "random", bw: tuple[float, float] = (100.0, 1000.0),
             seed: int = 0, degree: int = DEFAULT_DEGREE) -> Plan:
        """Draw a plan; the same arguments always give the same plan."""
        rng = random.Random(seed)
        links = topology(kind, count, rng, degree)
        return cls(node_names(count), links, draw_rates(links, bw, rng), bw, seed, kind)
