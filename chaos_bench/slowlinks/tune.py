"""DiLoCo's outer learning rate and momentum, chosen on the validation split.

The testbed runs report the test split; the outer hyper-parameters they run with are chosen
here, before them, on the validation split and on seeds of their own (``TUNE_SEEDS``, never
a reported seed). The sweep runs the same task in one process: ``nodes`` members, each with
its own model copy, Adam and batch order (:mod:`.task`), take H inner steps, then average
their pseudo-gradients and step with the package's own outer optimizer
(:class:`chaos_edge.trainer.outer.Outer`, the code every member runs). The only thing left
out is the network: on the testbed the average is an all-reduce, and the data order is the
same at every link rate, so the rate cannot change which point wins.

The criterion is the final validation loss, averaged over the tuning seeds (accuracy on 360
digits moves in steps of 0.28 points, so it ties often; the loss does not). Each task
(:mod:`.task`) is tuned on its own validation split.
"""

from __future__ import annotations

import itertools
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

TUNE_SEEDS = (100, 101, 102)


@dataclass(frozen=True)
class Point:
    """One grid point's validation result, over the tuning seeds."""

    inner_steps: int
    outer_lr: float
    outer_momentum: float
    val_loss: list[float]
    val_acc: list[float]

    @property
    def mean_loss(self) -> float:
        return statistics.fmean(self.val_loss)


def simulate(h: int, outer_lr: float, outer_momentum: float, seed: int, *, steps: int,
             nodes: int, batch: int, lr: float, data: Any) -> tuple[float, float]:
    """Final (validation loss, accuracy) of one DiLoCo run in one process."""
    import torch

    from chaos_bench.slowlinks.task import batch_generator
    from chaos_edge.trainer.outer import Outer
    from daemon.contracts.policy import SyncMode

    mode = SyncMode("diloco", h, "nesterov", outer_lr, outer_momentum)
    models = [data.model(seed) for _ in range(nodes)]
    opts = [torch.optim.Adam(m.parameters(), lr=lr) for m in models]
    gens = [batch_generator(seed, i + 1) for i in range(nodes)]  # the testbed's n1..nN
    outers = [Outer(list(m.parameters()), mode) for m in models]
    pseudo = torch.empty_like(outers[0].synced)
    for step in range(1, steps + 1):
        for m, opt, gen in zip(models, opts, gens, strict=True):
            xb, yb = data.batch(gen, batch)
            opt.zero_grad(set_to_none=True)
            data.loss(m, xb, yb).backward()
            opt.step()
        if step % h:
            continue
        avg = torch.zeros_like(pseudo)
        for o in outers:
            o.pseudo_gradient(step, pseudo)
            avg.add_(pseudo)
        avg.div_(nodes)
        for o in outers:
            o.step(step, avg, mode)
    return data.evaluate(models[0], "val")


def sweep(hs: tuple[int, ...], lrs: tuple[float, ...], momenta: tuple[float, ...], *,
          steps: int, nodes: int, batch: int, lr: float, say: Callable[[str], None],
          task: str = "digits") -> dict[int, list[Point]]:
    """Every grid point for every H, on the tuning seeds."""
    import torch

    from chaos_bench.slowlinks.task import load

    torch.set_num_threads(1)
    data = load(task)
    out: dict[int, list[Point]] = {}
    for h in hs:
        out[h] = []
        for olr, mu in itertools.product(lrs, momenta):
            res = [simulate(h, olr, mu, s, steps=steps, nodes=nodes, batch=batch, lr=lr,
                            data=data) for s in TUNE_SEEDS]
            out[h].append(Point(h, olr, mu, [r[0] for r in res], [r[1] for r in res]))
        best = choose(out[h])
        say(f"  tuned H={h} on the validation split: outer lr {best.outer_lr:g}, momentum "
            f"{best.outer_momentum:g} (mean validation loss {best.mean_loss:.4f})")
    return out


def choose(points: list[Point]) -> Point:
    """The point with the least mean validation loss (ties: the first in grid order)."""
    return min(points, key=lambda p: p.mean_loss)
