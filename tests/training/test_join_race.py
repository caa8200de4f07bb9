"""A new node's first frames reach a member that has not yet committed the round before it.

Three Trainer processes train on a chain n0-n1-n2 (root n1); n3 joins with n0 as its source,
and the new chain puts it under n2. The root is slow to send n2 its COMMIT while the join waits
to take effect (a slow link just then). n0 commits, serves, and n3 restores and opens the
next round's agreement with its parent n2, so n2 hears the newer epoch before its COMMIT
lands. Ending n2's round on that frame left it a round behind, in an epoch every peer had
left, until its step timed out (the demo's stall after a scale-out). The round must commit and
all four must train on in step.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.training._fake import FakeCluster, FakeRun

pytestmark = pytest.mark.timeout(150)
STEPS = 400  # at 0.05 s a step, n3 (a fresh torch process) starts well within them


def test_a_new_nodes_agreement_does_not_end_its_parents_last_round(tmp_path: Path) -> None:
    fake = FakeCluster(tmp_path)
    run = FakeRun(fake, STEPS)  # paced steps: the first three still train when n3 joins
    try:
        run.start("n0", "--wait-members", "3")
        time.sleep(0.3)
        # The root sends n0 its COMMIT, then waits before n2's, while the join is pending.
        run.start("n1", "--wait-members", "3", "--stall", "commit:0:2.0")
        time.sleep(0.3)
        run.start("n2", "--wait-members", "3")
        run.wait_steps("n0", 5)
        run.start("n3")
        run.finish()
        # n2 never ended a round on n3's frames: no rerun, no mismatch.
        mismatches = [(n, r) for n, r in fake.reports if r.get("kind") == "round-aborted"
                      and "mismatch" in str(r.get("reason"))]  # fmt: skip
        assert mismatches == []
        run.assert_in_step("n3")
    finally:
        run.close()
