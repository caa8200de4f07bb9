"""Links and flows in simulated time: what the testbed's veth links and tbf shapers do.

A link is two directed channels, each a SimPy resource of capacity one that sends one chunk
at a time at the link's rate. Waiting chunks go in order of how many chunks their flow has
sent before (first come, first served among equals), so the flows that have a chunk waiting
take turns and share the link equally, as TCP flows under tbf do, however many chunks each
keeps queued there. A flow moves its bytes
in chunks along a path, store-and-forward at every hop (a relay forwards a chunk once it holds
it), and the sender hands the next chunk to the first hop as soon as that hop has sent the
previous one, so a multi-hop flow is pipelined.

Links into one receiver may also share that receiver's host: on the testbed every namespace
runs on the same two cores, and three links into the new node carried together much less
than each carried alone. ``together`` gives such links a second rate, the one iperf3 measured
with all of them running; a chunk is sent at it while another of those links into the same
receiver is sending, and at the link's own rate while it is the only one.
"""

from __future__ import annotations

import math
from collections.abc import Generator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import simpy

MBIT = 1e6 / 8  # bytes per second in one Mbit/s
DEFAULT_CHUNK = 1 << 20


def key(a: str, b: str) -> tuple[str, str]:
    """An undirected link as a sorted pair of node ids."""
    return (a, b) if a < b else (b, a)


@dataclass
class Busy:
    """When a node first got a request and last sent or relayed a byte (the idle window)."""

    first: float = math.inf
    last: float = -math.inf

    @property
    def seconds(self) -> float:
        return max(0.0, self.last - self.first) if self.first < math.inf else 0.0


@dataclass
class Net:
    """A network of links in one SimPy environment.

    Args:
        env: The simulation's environment.
        rates: Goodput of each undirected link, bytes per second (both directions alike).
        latency_s: One-way propagation delay of every link.
        chunk: Bytes a link sends at once; flows interleave at this grain.
        window: Bytes a flow may have sent and not yet delivered (socket buffers and the
            relays' read-ahead): a sender upstream of a slow hop stalls once it is full.
        together: Goodput of some directed links ``(sender, receiver)``, bytes per second,
            while another link of this mapping into the same receiver is busy (the rates
            measured all at once). Links not in it always send at ``rates``.
    """

    env: simpy.Environment
    rates: Mapping[tuple[str, str], float]
    latency_s: float = 1e-4
    chunk: int = DEFAULT_CHUNK
    window: int = 8 * DEFAULT_CHUNK
    together: Mapping[tuple[str, str], float] = field(default_factory=dict)
    busy: dict[str, Busy] = field(default_factory=dict)
    _chan: dict[tuple[str, str], simpy.PriorityResource] = field(default_factory=dict)

    def rate(self, a: str, b: str) -> float:
        """The rate a chunk sent now from ``a`` to ``b`` gets (see ``together``)."""
        shared = self.together.get((a, b))
        if shared is not None and any(
                ch.count for (s, r), ch in self._chan.items()
                if r == b and s != a and (s, r) in self.together):
            return shared
        return self.rates[key(a, b)]

    def _channel(self, a: str, b: str) -> simpy.PriorityResource:
        ch = self._chan.get((a, b))
        if ch is None:
            ch = self._chan[(a, b)] = simpy.PriorityResource(self.env, capacity=1)
        return ch

    def requested(self, node: str) -> None:
        """``node`` got a request now: its busy window opens (if not open yet)."""
        b = self.busy.setdefault(node, Busy())
        b.first = min(b.first, self.env.now)

    def _sent(self, node: str) -> None:
        self.busy.setdefault(node, Busy()).last = self.env.now

    def _hop(self, a: str, b: str, nbytes: int, seq: int) -> Generator[Any, Any, None]:
        with self._channel(a, b).request(priority=seq) as req:
            yield req
            yield self.env.timeout(nbytes / self.rate(a, b))  # rate fixed per chunk
            self._sent(a)

    def _carry(self, path: Sequence[str], nbytes: int, seq: int, first_sent: simpy.Event,
               credit: simpy.Container) -> Generator[Any, Any, None]:
        """Chunk ``seq`` of a flow along ``path`` (sender first); ``first_sent`` fires after
        the first hop."""
        for i in range(len(path) - 1):
            yield from self._hop(path[i], path[i + 1], nbytes, seq)
            if i == 0:
                first_sent.succeed()
            yield self.env.timeout(self.latency_s)
        yield credit.put(nbytes)

    def flow(self, path: Sequence[str], nbytes: int) -> simpy.Process:
        """Move ``nbytes`` from ``path[0]`` to ``path[-1]``; the process ends at the last byte."""
        return self.env.process(self._flow(list(path), nbytes))

    def _flow(self, path: list[str], nbytes: int) -> Generator[Any, Any, None]:
        chunks: list[simpy.Process] = []
        left = nbytes
        window = max(self.window, self.chunk)
        credit = simpy.Container(self.env, capacity=window, init=window)
        while left > 0:
            size = min(self.chunk, left)
            yield credit.get(size)
            sent = self.env.event()
            chunks.append(self.env.process(self._carry(path, size, len(chunks), sent, credit)))
            left -= size
            yield sent  # the first hop is free for the next chunk
        if chunks:
            yield self.env.all_of(chunks)

    def request(self, path: Sequence[str]) -> simpy.Process:
        """A small request travelling ``path`` hop by hop; every node on it starts being busy."""
        return self.env.process(self._request(list(path)))

    def _request(self, path: list[str]) -> Generator[Any, Any, None]:
        for node in path[1:]:
            yield self.env.timeout(self.latency_s)
            self.requested(node)
