"""A throttled box on real nodes (issue 24): set aside while it slows the cluster, let back in
once it recovers, and every member identical at every committed step throughout."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.training._run import PINNED_POLICY

pytestmark = pytest.mark.timeout(150)

# A trial after 20 s; the gain measured at 10 s (daemon.cluster.adapter.MEASURE_AFTER_S),
# while the box is still aside.
CONFIG = PINNED_POLICY + "straggler_retry_s = 20.0\n"


def test_a_throttled_box_is_set_aside_and_rejoins_once_it_recovers(run: Any, tmp_path: Path
                                                                   ) -> None:
    r = run(3, config=CONFIG)
    n1, n2, n3 = r.c.node_ids
    slow = tmp_path / "slow-n3"
    slow.write_text("400")  # 400 ms of extra compute a step: 8x or more the others' step
    r.join_all([n1, n2, n3], start=lambda node: r.join(
        node, extra=["--slow-file", str(slow)] if node == n3 else None))

    def straggler(action: str) -> list[dict[str, Any]]:
        return [e for e in r.events("straggler") if e.get("action") == action]

    r.c.wait(lambda: straggler("set-aside"), 90, "n3 set aside")
    [aside] = straggler("set-aside")
    assert aside["node"] == n3 and aside["cause"] == "compute" and aside["predicted_gain"] > 1
    [scale_in] = [e for e in r.events("scale-in") if e.get("reason") == "straggler"]
    assert scale_in["node"] == n3 and scale_in["effective_step"] > 0
    r.c.wait(lambda: r.states().get(n3) == "standby", 30, "n3 in standby")
    r.advance([n1, n2], 20)  # the two train on without it
    held = r.step(n3)
    r.c.wait(lambda: straggler("measured"), 30, "the gain measured")
    [measured] = straggler("measured")
    assert measured["node"] == n3 and measured["measured_gain"] is not None
    assert measured["measured_gain"] > 0  # 2 members at ~25 ms a step against 3 at ~400 ms
    assert r.step(n3) == held  # aside, its worker holds its state and waits
    slow.write_text("0")  # its owner's other work is done
    r.c.wait(lambda: straggler("rejoin"), 60, "n3 tried again")
    assert straggler("rejoin")[0]["cause"] == "trial"
    r.c.wait(lambda: r.active([n1, n2, n3]), 60, "n3 back as a member")
    r.advance([n1, n2, n3], 30)
    assert len(straggler("set-aside")) == 1  # recovered, it stays
    back = [e for e in r.events("scale-out") if e["node"] == n3 and not e.get("bootstrap")]
    assert back, "n3 rejoined through a scale-out"
    r.assert_consistent()
