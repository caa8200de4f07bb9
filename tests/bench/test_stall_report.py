"""The stall bench's arithmetic, on step records written as its workers write them.

The cluster run itself is the bench's (``chaosctl bench stall``); here the records are made up
so every figure of the report can be checked by hand: which steps count as unchanged, that an
event is charged the largest stall over the nodes at the steps it touched (the joiner's own
first step left out), and that the framework's share is the stall less the optimizer step.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from chaos_bench.stall.run import baseline, report
from chaosctl.client import CtlUsageError

pytestmark = pytest.mark.timeout(60)


def _row(step: int, version: int, stall: float, opt: float, update: float = 5.0
         ) -> dict[str, Any]:
    return {"step": step, "policy_version": version, "stall_ms": stall, "optimizer_ms": opt,
            "update_ms": update, "reruns": 0}


def _rows() -> dict[str, list[dict[str, Any]]]:
    """node-a and node-b train steps 1-6; policy 2 governs from step 4 (a link change);
    node-c joins under policy 3 at step 6 (its sources snapshot at step 5)."""
    a = [_row(1, 1, 1.0, 0.4), _row(2, 1, 1.0, 0.4), _row(3, 1, 2.0, 0.5),
         _row(4, 2, 3.0, 0.5, 9.0), _row(5, 2, 4.0, 1.0, 8.0), _row(6, 3, 6.0, 1.0, 12.0)]
    b = [_row(1, 1, 0.5, 0.2), _row(2, 1, 1.5, 0.2), _row(3, 1, 1.0, 0.2),
         _row(4, 2, 5.0, 0.2, 7.0), _row(5, 2, 1.0, 0.2), _row(6, 3, 2.0, 0.2)]
    c = [_row(6, 3, 50.0, 0.1, 60.0)]  # the joiner's warm-up: no stall of the others
    return {"node-a": a, "node-b": b, "node-c": c}


def test_the_baseline_is_the_unchanged_steps_largest_over_the_nodes() -> None:
    base = baseline(_rows())
    # Steps 2, 3 and 5 ran under the policy of the step before on every node; 4 and 6 did not.
    assert base.stalls == [1.5, 2.0, 4.0]
    assert base.framework == [1.3, 1.5, 3.0]  # per step: max over nodes of stall - optimizer
    assert sorted(base.optimizer) == [0.2, 0.2, 0.2, 0.4, 0.5, 1.0]
    assert base.typical["node-a"] == 5.0  # median update_ms of a's unchanged steps


def test_events_are_charged_at_the_steps_they_touched(tmp_path: Path) -> None:
    events = [{"kind": "connect-link", "policy_version": 2, "seq": 1},
              {"kind": "scale-out", "policy_version": 3, "version": 5, "node": "node-c",
               "seq": 2},
              {"kind": "scale-in", "policy_version": 9, "seq": 3}]  # no node ran it
    said: list[str] = []
    result, table = report(events, _rows(), tmp_path, said.append,
                           {"name": "toy", "parameters": 4})
    link = result["kinds"]["connect-link"]
    # step 4: a stalled 3.0 (2.5 its own), b 5.0 (4.8); step excess: a 9-5, b 7-5
    assert link["stall"]["p50_ms"] == 5.0 and link["framework"]["p50_ms"] == 4.8
    assert link["step_excess"]["p50_ms"] == 4.0
    out = result["kinds"]["scale-out"]
    # steps 6 (the first under policy 3) and 5 (the snapshot) of a and b, not c's 50 ms
    assert out["stall"]["max_ms"] == 6.0 and out["framework"]["max_ms"] == 5.0
    assert "scale-in" not in result["kinds"]
    assert result["model"] == {"name": "toy", "parameters": 4}
    assert "| connect-link | 1 | 1 | 5.0 | 4.8 |" in table
    assert (tmp_path / "stall.json").exists() and (tmp_path / "stall.md").exists()


def test_records_with_no_unchanged_step_are_refused() -> None:
    rows = {"node-a": [_row(1, 1, 1.0, 0.1), _row(2, 2, 1.0, 0.1)]}
    with pytest.raises(CtlUsageError, match="no step ran under an unchanged policy"):
        report([], rows, None, print)
