"""Link measurements of ``chaosctl bench scaleout``: iperf3 from each neighbour to the new node.

Two measurements of the same links, both inside the namespaces, neighbour to new node
(``iperf3 -R`` run by the new node):

- one at a time (:func:`measure_links`): each link alone, the rate its shaper allows;
- all at once (:func:`measure_concurrent`): every neighbour at the same time, as a joining
  trainer measures its sources through chaosd (``worker.probe``). The streams share the new
  node's CPU and memory bandwidth, so on a small box their sum is below the sum of the
  one-at-a-time rates; water-filling over these rates is the bound a transfer can reach.
"""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import time
from collections.abc import Coroutine, Iterator
from typing import Any

from chaos_bench.workers import reap
from chaosctl.testbed.core import Testbed
from netprobe import iperf, netns
from netprobe.results import BandwidthResult

IPERF_PORT = 5298


@contextlib.contextmanager
def _servers(tb: Testbed, nodes: list[str]) -> Iterator[None]:
    """One-shot iperf3 servers on ``nodes``, listening when the block starts, reaped after."""
    from chaosctl.testbed.procs import listening

    procs = []
    try:
        for nb in nodes:
            procs.append(tb.exec(nb, ["iperf3", "-s", "-1", "-p", str(IPERF_PORT)],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                 start_new_session=True))  # fmt: skip
        for proc in procs:
            for _ in range(100):  # until it listens
                if listening(proc.pid, IPERF_PORT):
                    break
                time.sleep(0.05)
        yield
    finally:
        for proc in procs:
            reap(proc)


def _run(coro: Coroutine[Any, Any, Any]) -> Any:
    # Not asyncio.run: its SIGINT handler turns a Ctrl-C into a cancellation that the
    # measurement may absorb. Here Ctrl-C raises KeyboardInterrupt, and we tear down.
    loop = asyncio.new_event_loop()
    task = loop.create_task(coro)
    try:
        return loop.run_until_complete(task)
    except BaseException:
        task.cancel()  # kills the iperf3 clients before the loop goes
        with contextlib.suppress(BaseException):
            loop.run_until_complete(task)
        raise
    finally:
        loop.close()


def _test(tb: Testbed, new: str, nb: str, seconds: float) -> Coroutine[Any, Any, BandwidthResult]:
    return iperf.measure(tb.addr_of(nb), IPERF_PORT, duration_s=seconds, reverse=True,
                         timeout_s=seconds + 20,
                         exec_prefix=netns.exec_prefix(tb.ns_of(new)))  # fmt: skip


def measure_links(tb: Testbed, new: str, nbrs: list[str], seconds: float) -> dict[str, float]:
    """iperf3, neighbour -> new node, one link at a time; Mbit/s per neighbour."""
    out = {}
    for nb in nbrs:
        with _servers(tb, [nb]):
            out[nb] = _run(_test(tb, new, nb, seconds)).bits_per_second / 1e6
    return out


def measure_concurrent(tb: Testbed, new: str, nbrs: list[str], seconds: float
                       ) -> dict[str, float]:  # fmt: skip
    """iperf3, every neighbour -> new node at the same time; Mbit/s per neighbour."""

    async def together() -> list[BandwidthResult]:
        return list(await asyncio.gather(*(_test(tb, new, nb, seconds) for nb in nbrs)))

    with _servers(tb, nbrs):
        results = _run(together())
    return {nb: r.bits_per_second / 1e6 for nb, r in zip(nbrs, results, strict=True)}
