"""Polling with a deadline, and "do these nodes agree on one scheduler?".

One implementation for the local cluster, the testbed, the demo, the benches and the tests.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from daemon.contracts.kinds import LIVE_STATES

T = TypeVar("T")
Query = Callable[[str, str], Any]
"""``query(node, op)``: a control-socket read of one node, None when it does not answer."""


def wait_until(pred: Callable[[], T | None], timeout: float, what: str, every: float = 0.1,
               error: type[Exception] = TimeoutError) -> T:
    """Poll ``pred`` until it returns something truthy; raise ``error`` naming ``what``."""
    deadline = time.monotonic() + timeout
    while True:
        value = pred()
        if value:
            return value
        if time.monotonic() > deadline:
            raise error(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(every)


def agreed(query: Query, nodes: list[str], states: Mapping[str, int] | None = None,
           check_leader: bool = True) -> tuple[str, int] | None:
    """The ``(scheduler, term)`` that every node in ``nodes`` reports, if they all agree.

    Each node must also see the others: with ``states``, its count of nodes per state is
    exactly that; without, it counts at least ``len(nodes)`` live nodes. With
    ``check_leader``, exactly that scheduler says it leads (no stale second leader).
    """
    seen: set[tuple[str, int]] = set()
    for node in nodes:
        st = query(node, "status")
        sched = st.get("scheduler") if isinstance(st, dict) else None
        if not isinstance(sched, dict) or not isinstance(sched.get("term"), int):
            return None
        counts = st.get("nodes") or {}
        if states is not None and counts != dict(states):
            return None
        live = sum(v for k, v in counts.items() if k in LIVE_STATES and isinstance(v, int))
        if states is None and live < len(nodes):
            return None
        seen.add((str(sched.get("id")), int(sched["term"])))
    if len(seen) != 1:
        return None
    ((sched_id, term),) = seen
    if check_leader:
        leaders = [n for n in nodes if ((query(n, "ping") or {}).get("leader"))]
        if leaders != [sched_id]:
            return None
    return sched_id, term
