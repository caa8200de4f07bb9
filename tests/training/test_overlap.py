"""``Trainer(overlap=True)``: each round starts during backward, fed parameter by parameter.
Real nodes train through a join, a leave, a kill -9 and a SIGSTOP (whose thawed node rejoins
inside a round that runs beside backward), and every member holds the same state at every
common step; a second backward before ``update()``, a script's own ``optimizer.step()`` under
the Trainer and a second one after a DDP backward are each refused in one line.
"""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from chaosctl.client import call_once

pytestmark = pytest.mark.timeout(180)
OVERLAP = ["--overlap", "--width", "64"]  # about 60 chunks of 256 bytes: a real pipeline


def test_overlapped_rounds_keep_every_member_identical_through_faults(run: Any) -> None:
    r = run(3)
    r.through_faults(lambda n: r.join(n, extra=OVERLAP))
    assert r.assert_consistent() > 40
    r.assert_loss_falls(r.c.node_ids[0])


TWICE = {
    # DDP: a second optimizer.step() after one backward
    "ddp": """
        import torch
        from chaos_edge import ddp
        model = ddp.DistributedDataParallel(torch.nn.Linear(4, 2))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        trainer = ddp.elastic(model, opt)
        model(torch.randn(3, 4)).sum().backward()
        opt.step()
        opt.step()
    """,
    # the Trainer: a script that steps the optimizer itself
    "own-step": """
        import torch
        from chaos_edge import Trainer
        model = torch.nn.Linear(4, 2)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        trainer = Trainer(model, opt)
        model(torch.randn(3, 4)).sum().backward()
        opt.step()
    """,
    # Trainer(overlap=True): a second backward before update()
    "overlap": """
        import torch
        from chaos_edge import Trainer
        model = torch.nn.Linear(4, 2)
        trainer = Trainer(model, torch.optim.SGD(model.parameters(), lr=0.1), overlap=True)
        model(torch.randn(3, 4)).sum().backward()
        model(torch.randn(3, 4)).sum().backward()
    """,
    # Trainer(overlap=True): the round began in backward, so update() cannot count samples
    "overlap-samples": """
        import torch
        from chaos_edge import Trainer
        model = torch.nn.Linear(4, 2)
        trainer = Trainer(model, torch.optim.SGD(model.parameters(), lr=0.1), overlap=True)
        model(torch.randn(3, 4)).sum().backward()
        trainer.update(samples=3)
    """,
}
LAST_LINE = {
    "ddp": "optimizer.step() ran twice after one backward: call it once per backward "
           "(accumulate with model.no_sync())",
    "own-step": "the Trainer steps the optimizer in update(): remove the script's "
                "optimizer.step() (and scaler.step()), or use chaos_edge.ddp to keep them",
    "overlap": "overlap=True needs update() after every backward(): a second backward before "
               "it would change gradients already sent (accumulate without overlap)",
    "overlap-samples": "with overlap=True the round begins in backward(), before update() is "
                       "called: set trainer.samples_per_step (or use global_batch) instead of "
                       "update(samples=...)",
}


def test_what_would_break_an_overlapped_or_ddp_step_is_refused_in_one_line(
        run: Any, tmp_path: Path) -> None:
    r = run(1)
    (n1,) = r.c.node_ids
    for name, body in TWICE.items():
        script, log = tmp_path / f"{name}.py", tmp_path / f"{name}.log"
        script.write_text(textwrap.dedent(body))
        call_once(r.c.socket_of(n1), "join", {"neighbors": [], "command": [
            "sh", "-c", f"exec {sys.executable} {script} 2>{log}"]}, timeout=5)
        r.c.wait(lambda log=log: "TrainerError" in (log.read_text() if log.exists() else ""),
                 60, f"the {name} script to stop")
        last = log.read_text().strip().splitlines()[-1]
        assert last.endswith(LAST_LINE[name]), last
        call_once(r.c.socket_of(n1), "leave", timeout=5)  # no restart of a script that failed
        r.c.wait(lambda: not r.worker_pid(n1), 30, "the job to be forgotten")
