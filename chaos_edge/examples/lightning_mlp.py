"""A plain Lightning script made elastic: one argument differs from the DDP original.

The line marked ``# chaos`` is the change (the README shows it): ``strategy=ChaosStrategy()``
instead of ``strategy="ddp"``. Everything else is what a Lightning user has: a
``LightningModule`` with BatchNorm, SGD with momentum and a step LR schedule from
``configure_optimizers``, ``gradient_clip_val`` (it clips the members' average), and a
``DataLoader``. Each node trains on its own data (a regression stream seeded by its node id,
as an edge box holds its own), so nothing is downloaded. Needs the ``lightning`` extra.

    chaosctl join -- python -m chaos_edge.examples.lightning_mlp --steps 500

``--record FILE`` appends one JSON line per step: the cluster's step, the loss and the digest
of the whole replicated state (what the tests compare across members).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from collections.abc import Iterator
from typing import Any

import lightning.pytorch as pl
import torch

from chaos_edge import ChaosError, capture_exit_event
from chaos_edge.examples.ddp_mlp import build
from chaos_edge.lightning import ChaosStrategy  # chaos


class Regression(pl.LightningModule):
    def __init__(self, width: int, lr: float) -> None:
        super().__init__()
        self.net, self.lr = build(width), lr

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], _idx: int) -> torch.Tensor:
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self) -> Any:
        opt = torch.optim.SGD(self.parameters(), lr=self.lr, momentum=0.9)
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=200, gamma=0.5)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


class Stream(torch.utils.data.IterableDataset[tuple[torch.Tensor, torch.Tensor]]):
    """This box's own samples: y = x @ w, x drawn from a stream seeded by the node's id."""

    def __init__(self, batch: int) -> None:
        self.batch = batch

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        w_true = torch.randn(8, 2, generator=torch.Generator().manual_seed(1))
        seed = sum(map(ord, os.environ.get("CHAOS_NODE_ID", "solo")))
        data = torch.Generator().manual_seed(seed)
        while True:
            x = torch.randn(self.batch, 8, generator=data)
            yield x, x @ w_true


class Record(pl.Callback):
    """One JSON line per step (after the optimizer and LR scheduler stepped)."""

    def __init__(self, path: str, sleep: float) -> None:
        self.out = open(path, "a") if path else None  # noqa: SIM115 (closed at the end)
        self.sleep = sleep

    def on_train_batch_end(self, trainer: pl.Trainer, module: pl.LightningModule,
                           outputs: Any, batch: Any, batch_idx: int) -> None:
        chaos = trainer.strategy.chaos
        # After a leave the node is no member: its state is not the cluster's any more.
        if self.out is not None and not capture_exit_event():
            self.out.write(json.dumps({"step": chaos.step, "loss": float(outputs["loss"]),
                                       "digest": chaos.state_digest()}) + "\n")
            self.out.flush()
        if self.sleep:
            time.sleep(self.sleep)

    def on_fit_end(self, trainer: pl.Trainer, module: pl.LightningModule) -> None:
        if self.out is not None:
            self.out.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m chaos_edge.examples.lightning_mlp",
                                 description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--steps", type=int, default=500)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--width", type=int, default=32)
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--sleep", type=float, default=0.0, help="seconds to rest after a step")
    ap.add_argument("--record", default="", help="append a JSON line per step to this file")
    args = ap.parse_args(argv)
    logging.basicConfig(level=os.environ.get("CHAOS_WORKER_LOG", "WARNING").upper(),
                        format="%(asctime)s %(name)s %(message)s")
    torch.manual_seed(0)  # every member builds the same model
    trainer = pl.Trainer(strategy=ChaosStrategy(samples_per_step=args.batch),  # chaos
                         max_steps=args.steps, gradient_clip_val=1.0,
                         callbacks=[Record(args.record, args.sleep)], logger=False,
                         enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False)
    loader = torch.utils.data.DataLoader(Stream(args.batch), batch_size=None)
    try:
        trainer.fit(Regression(args.width, args.lr), loader)
    except ChaosError as exc:
        print(f"lightning_mlp: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
