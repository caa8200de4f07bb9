"""Train a small character-level transformer on Python's own help texts (offline data).

The text ships with Python (``pydoc_data.topics``, what ``help("assert")`` prints): the
topics in name order, the first ``--chars`` characters, the last tenth held out. The script
shows the same things as ``cnn.py`` on a sequence model: AdamW, a one-cycle schedule in
``state=``, ``clip_grad_norm=``, a ``GradScaler`` for fp16 autocast (bf16 needs none), and
consistent mode: ``trainer.shard`` picks this member's windows of the step's global batch,
from a sample position kept in ``trainer.state``.

    chaosctl join -- python -m chaos_edge.examples.chartf --epochs 4 --global-batch 128

The help texts differ between Python versions; the script prints a digest of its slice.
"""

from __future__ import annotations

import argparse
import hashlib
import logging
import math
import os
import sys
from typing import NamedTuple

import torch
from torch import nn

from chaos_edge import ChaosError, Trainer, capture_exit_event
from chaos_edge.examples.cnn import order

VAL_FRACTION = 0.1
EVAL_STRIDE = 16  # validation windows start every this many characters


class Data(NamedTuple):
    """The text as token ids, split once; a sample is the window at a position."""

    train: torch.Tensor
    val: torch.Tensor
    vocab: str
    context: int
    sha256: str

    @property
    def n_train(self) -> int:
        """Windows of ``context + 1`` characters in the training text."""
        return len(self.train) - self.context


def text(chars: int) -> str:
    """The first ``chars`` characters of the help topics, in topic-name order."""
    from pydoc_data.topics import topics

    return "".join(topics[k] for k in sorted(topics))[:chars]


def load(chars: int = 48_000, context: int = 32) -> Data:
    """Tokenise (one id per distinct character) and split the text."""
    body = text(chars)
    vocab = "".join(sorted(set(body)))
    ids = torch.tensor([vocab.index(c) for c in body], dtype=torch.long)
    cut = int(len(ids) * (1 - VAL_FRACTION))
    return Data(ids[:cut], ids[cut:], vocab, context,
                hashlib.sha256(body.encode()).hexdigest())


def batch(data: Data, idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs and next-character targets of the windows starting at ``idx``."""
    span = idx[:, None] + torch.arange(data.context + 1)
    win = data.train[span]
    return win[:, :-1], win[:, 1:]


class CharTransformer(nn.Module):
    """Token and position embeddings, pre-norm causal transformer layers, a linear head."""

    def __init__(self, vocab: int, context: int = 32, d_model: int = 64, layers: int = 2,
                 heads: int = 4, dropout: float = 0.1) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, d_model)
        self.pos = nn.Embedding(context, d_model)
        layer = nn.TransformerEncoderLayer(d_model, heads, 4 * d_model, dropout,
                                           batch_first=True, norm_first=True)
        self.blocks = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = x.shape[1]
        # Built per call rather than kept as a buffer: a buffer is averaged over the
        # members like BatchNorm's, and -inf times a zero weight is NaN.
        mask = nn.Transformer.generate_square_subsequent_mask(t)
        h = self.tok(x) + self.pos(torch.arange(t))
        h = self.blocks(h, mask=mask, is_causal=True)
        return self.head(self.norm(h))


def loss_of(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    logits = model(x)
    return nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))


@torch.no_grad()
def evaluate(model: nn.Module, data: Data) -> tuple[float, float]:
    """(validation loss in nats per character, next-character accuracy) on fixed windows."""
    model.eval()
    try:
        starts = torch.arange(0, len(data.val) - data.context - 1, EVAL_STRIDE)
        win = data.val[starts[:, None] + torch.arange(data.context + 1)]
        logits = model(win[:, :-1])
        flat, y = logits.reshape(-1, logits.shape[-1]), win[:, 1:].reshape(-1)
        loss = nn.functional.cross_entropy(flat, y).item()
        return loss, (flat.argmax(1) == y).float().mean().item()
    finally:
        model.train()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m chaos_edge.examples.chartf",
                                 description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--epochs", type=int, default=4, help="passes over the training windows")
    ap.add_argument("--global-batch", type=int, default=128)
    ap.add_argument("--chars", type=int, default=48_000)
    ap.add_argument("--lr", type=float, default=3e-3, help="peak of the one-cycle schedule")
    ap.add_argument("--amp", choices=("off", "bf16", "fp16"), default="off",
                    help="CPU autocast; fp16 scales the loss with a GradScaler")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    logging.basicConfig(level=os.environ.get("CHAOS_WORKER_LOG", "WARNING").upper())
    torch.set_num_threads(1)  # several workers may share one small machine
    data = load(args.chars)
    torch.manual_seed(args.seed)  # every node builds the same model; the cluster's wins anyway
    model = CharTransformer(len(data.vocab), data.context)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    n = data.n_train
    steps = math.ceil(args.epochs * n / args.global_batch)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=args.lr, total_steps=steps)
    scaler = torch.amp.GradScaler("cpu") if args.amp == "fp16" else None
    dtype = torch.float16 if args.amp == "fp16" else torch.bfloat16
    try:
        trainer = Trainer(model, opt, state={"sched": sched, "counters": {"pos": 0}},
                          scaler=scaler, clip_grad_norm=1.0, global_batch=args.global_batch)
    except ChaosError as exc:  # chaosd unreachable, the join failed, or another model
        print(f"chartf: {exc}", file=sys.stderr)
        return 1
    print(f"{trainer.node_id}: text sha256 {data.sha256[:12]}, {len(data.vocab)} symbols, "
          f"joined at step {trainer.step}", flush=True)
    while trainer.state["counters"]["pos"] < args.epochs * n:
        sh = trainer.shard  # this member's windows of this step's global batch
        pos = trainer.state["counters"]["pos"]
        if sh.size:
            x, y = batch(data, torch.as_tensor(order(args.seed, n, pos + sh.start, sh.size)))
            with torch.autocast("cpu", dtype=dtype, enabled=args.amp != "off"):
                loss = loss_of(model, x, y)
            (scaler.scale(loss) if scaler is not None else loss).backward()
        trainer.update()  # all-reduce, unscale, clip, step: never opt.step() here
        if sched.last_epoch + 1 < steps:  # OneCycleLR refuses a step past its end
            sched.step()
        trainer.state["counters"]["pos"] = pos + sh.global_batch
        trainer.check_state_replication()
        if trainer.step % 50 == 0 or trainer.state["counters"]["pos"] >= args.epochs * n:
            val_loss, acc = evaluate(model, data)
            print(f"step {trainer.step} epoch {(pos + sh.global_batch) / n:.2f} members "
                  f"{len(sh.members)} val_loss {val_loss:.4f} acc {acc:.3f}", flush=True)
        if capture_exit_event():
            trainer.request_node_exit()
            print(f"{trainer.node_id}: left at step {trainer.step}", flush=True)
            return 0
    trainer.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
