"""A source whose memory guard refuses a snapshot: the join completes from the others, and the
new node's daemon, the scheduler and the events all say who declined and why (issue 8)."""

from __future__ import annotations

from typing import Any

import pytest

pytestmark = pytest.mark.timeout(180)
# node-2 needs a free terabyte after its snapshot, which no test box has: it must decline.
GREEDY = "[replication]\nsnapshot_reserve_mib = 1048576\n"


def test_a_declining_source_is_reported_and_the_join_completes(run: Any) -> None:
    r = run(3, node_config={"node-2": GREEDY})
    n1, n2, n3 = r.c.node_ids
    r.join(n1)
    r.c.wait(lambda: r.active([n1]), 90, f"{n1} active")
    r.join(n2, neighbors=[n1])
    r.c.wait(lambda: r.active([n1, n2]), 90, f"{n2} active")
    r.advance([n1, n2], 3)
    r.join(n3, neighbors=[n1, n2])
    r.c.wait(lambda: r.active([n1, n2, n3]), 90, f"{n3} active")
    ev = [e for e in r.events("scale-out") if e["node"] == n3][-1]
    # The scheduler heard node-2's serve-declined report and put it on the event...
    assert set(ev["declined"]) == {n2}
    assert "snapshot_reserve_mib" in ev["declined"][n2] or "free" in ev["declined"][n2]
    # ... and the new node planned without it, naming why.
    assert n2 in ev.get("left_out", {})
    assert ev["per_source"][n1]["bytes"] > 0
    r.advance([n1, n2, n3], 5)
    r.assert_consistent()
