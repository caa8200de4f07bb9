"""A member a round behind catches up in the next policy's epoch, and that agreement fails.

Soak fault 24. The chain n0 - n1 - n2 - n3 (root n1) runs round t while n4's join waits to
take effect at t + 1 (its policy puts n4 under n3, with n2 the root). The root commits round t
to n0, then stalls before it sends COMMIT to n2: n0 serves n4 the state of t, and n4 opens the
new policy's epoch, while n2 and n3 hold round t's result uncertain. Their round t times out;
they see a peer already in the next epoch and catch up in it, holding the result. That
agreement waits on the stalled root, and times out too.

The data plane runs no phase whose tag is not newer than the last one it ran, so once a member
has opened the newer epoch it cannot go back and rerun round t under the older policy: it did,
and the worker died of ``DataPlaneError: tag (v, 1, -1) is not newer than the last one
(v + 1, 0, -1)``. It must keep catching up in the newer epoch until the root returns, and
every member must then hold the same state at every step.

The workers train until the test has seen what it needs (STEPS is never reached), so how far
the others get before the join lands on a loaded box does not matter.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.training._fake import FakeCluster, FakeRun

pytestmark = pytest.mark.timeout(300)
STEPS = 1_000_000
AFTER = 30  # steps the new node trains after its join
#: The step timeout: a phase times out after a quarter of it (6 s), and a member with a new
#: tree neighbour waits up to 5 s for a command to serve it before its round (Source).
TIMEOUT = ("--timeout", "24")
STALL_S = 14.0  # the root's stall: past the round's phase timeout and the catch-up's


def test_a_catch_up_that_fails_keeps_catching_up_in_the_newer_epoch(tmp_path: Path) -> None:
    fake = FakeCluster(tmp_path)
    run = FakeRun(fake, STEPS)
    try:
        run.start("n0", *TIMEOUT)
        run.wait_steps("n0", 5)
        # The root stalls only while the policy that adds the fifth node waits.
        run.start("n1", *TIMEOUT, "--stall", f"commit:0:{STALL_S}:5")
        run.wait_steps("n1", 1)
        for node in ("n2", "n3"):
            run.start(node, *TIMEOUT)
            run.wait_steps(node, 1)
        run.start("n4", *TIMEOUT)
        run.wait_steps("n4", AFTER, timeout=240)
        assert {n: p.poll() for n, p in run.procs.items()} == dict.fromkeys(run.procs), \
            {n: run.log(n)[-2000:] for n, p in run.procs.items() if p.poll() is not None}
        caught = [n for n in ("n2", "n3") if "catching up in epoch" in run.log(n)]
        assert caught, {n: run.log(n)[-3000:] for n in ("n2", "n3")}
        by_step: dict[int, set[str]] = {}
        for node in run.procs:
            for rec in run.records(node):
                by_step.setdefault(int(str(rec["step"])), set()).add(str(rec["digest"]))
        assert all(len(d) == 1 for d in by_step.values()), \
            {s: d for s, d in by_step.items() if len(d) > 1}
    finally:
        run.close()
