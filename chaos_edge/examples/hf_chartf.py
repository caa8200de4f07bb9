"""A plain Hugging Face ``Trainer`` script made elastic: one callback added.

The line marked ``# chaos`` is the change (the README shows it). Everything else is what a
``transformers`` user has: a small GPT-2 built from its config (no download), a character
dataset of Python's own help texts (``pydoc_data``, as ``chartf.py`` uses), ``TrainingArguments``
with AdamW, a cosine schedule with warm-up, ``max_grad_norm`` (it clips the members' average)
and ``trainer.train()``. Each box reads the text in its own order (``data_seed`` from the
node's id). Needs the ``hf`` extra.

    chaosctl join -- python -m chaos_edge.examples.hf_chartf --steps 500

``--record FILE`` appends one JSON line per step: the cluster's step, the loss and the digest
of the whole replicated state (what the tests compare across members). ``--short`` trains a
smaller model on less text (the tests use it).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import tempfile
import time
from typing import Any

import torch
import transformers

from chaos_edge import ChaosError, capture_exit_event
from chaos_edge.examples.chartf import load
from chaos_edge.hf import ChaosCallback  # chaos


class Windows(torch.utils.data.Dataset[dict[str, torch.Tensor]]):
    """Every window of ``context`` characters; GPT-2 shifts the labels itself."""

    def __init__(self, ids: torch.Tensor, context: int) -> None:
        self.ids, self.context = ids, context

    def __len__(self) -> int:
        return len(self.ids) - self.context

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        win = self.ids[i:i + self.context]
        return {"input_ids": win, "labels": win}


class Record(transformers.TrainerCallback):
    """One JSON line per step, from the step's log (``logging_steps=1``)."""

    def __init__(self, path: str, chaos: ChaosCallback, sleep: float) -> None:
        self.path, self.chaos, self.sleep = path, chaos, sleep

    def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, float] | None = None,
               **kwargs: Any) -> None:
        # After a leave the node is no member: its state is not the cluster's any more.
        if (self.path and logs and "loss" in logs and self.chaos.chaos is not None
                and not capture_exit_event()):
            with open(self.path, "a") as out:
                out.write(json.dumps({"step": self.chaos.chaos.step, "loss": logs["loss"],
                                      "digest": self.chaos.chaos.state_digest()}) + "\n")
        if self.sleep:
            time.sleep(self.sleep)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m chaos_edge.examples.hf_chartf",
                                 description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--steps", type=int, default=500)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--short", action="store_true", help="a smaller model on less text")
    ap.add_argument("--sleep", type=float, default=0.0, help="seconds to rest after a step")
    ap.add_argument("--record", default="", help="append a JSON line per step to this file")
    ap.add_argument("--out", default="", help="the Trainer's output_dir (default: one per node "
                    "under the temporary directory, reused by every start)")
    args = ap.parse_args(argv)
    logging.basicConfig(level=os.environ.get("CHAOS_WORKER_LOG", "WARNING").upper(),
                        format="%(asctime)s %(name)s %(message)s")
    transformers.logging.set_verbosity_error()
    data = load(chars=8_000 if args.short else 48_000, context=32)
    width, layers = (32, 1) if args.short else (128, 4)
    torch.manual_seed(0)  # every member builds the same model
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(
        vocab_size=len(data.vocab), n_positions=data.context, n_embd=width, n_layer=layers,
        n_head=4, bos_token_id=0, eos_token_id=0))
    chaos = ChaosCallback(samples_per_step=args.batch)  # chaos
    # A fixed directory, not a fresh temporary one per start: a worker killed -9 (as chaosd
    # does to a hung one) cannot remove its own, and restarts would pile them up.
    out = args.out or os.path.join(tempfile.gettempdir(),
                                   f"hf_chartf-{os.environ.get('CHAOS_NODE_ID', 'solo')}")
    targs = transformers.TrainingArguments(
        out, max_steps=args.steps, per_device_train_batch_size=args.batch,
        learning_rate=args.lr, lr_scheduler_type="cosine", warmup_steps=20,
        max_grad_norm=1.0, logging_steps=1 if args.record else 50, save_strategy="no",
        report_to="none", disable_tqdm=True, seed=0,
        data_seed=sum(map(ord, os.environ.get("CHAOS_NODE_ID", "solo"))))
    trainer = transformers.Trainer(
        model=model, args=targs, train_dataset=Windows(data.train, data.context),
        callbacks=[chaos, Record(args.record, chaos, args.sleep)])  # chaos: chaos added
    try:
        trainer.train()
    except ChaosError as exc:
        print(f"hf_chartf: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
