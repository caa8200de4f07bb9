"""A source whose replicate command comes after the round with the new node began.

The command and the policy travel apart. A source waits a few seconds before its first round
with a new neighbour (Source.before_round), then runs it; that round waits on the new node,
and the new node waits on the source's offer, which is made only between rounds. When the
command came later still (a broker restart lost the first copy and the scheduler sent it
again), the round sat until its phase timed out (a quarter of the step timeout: 30 s by
default) before the source served. Now the command ends the round at once, the source serves
at the rerun's boundary, and training goes on with the new node in step.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from chaos_edge.trainer.source import SERVE_WAIT_S
from tests.training._fake import FakeCluster, FakeRun

pytestmark = pytest.mark.timeout(180)
STEPS = 300


def test_a_late_command_to_serve_ends_the_round_that_waits_for_the_new_node(
        tmp_path: Path) -> None:
    fake = FakeCluster(tmp_path)
    fake.source_late_s = SERVE_WAIT_S + 3.0  # after the source gave up waiting for it
    run = FakeRun(fake, STEPS)
    try:
        run.start("n0")
        run.wait_steps("n0", 5)
        run.start("n1")
        run.finish(timeout=150)
        # The source ran its first round with n1 before the command came, and that round
        # ended on the command, not on its timeout.
        aborts = [str(r.get("reason")) for n, r in fake.reports
                  if n == "n0" and r.get("kind") == "round-aborted"]
        assert any(a.startswith("serving n1") for a in aborts), (aborts, run.log("n0")[-3000:])
        assert not any("timed out" in a for a in aborts), aborts
        run.assert_in_step("n1")
    finally:
        run.close()
