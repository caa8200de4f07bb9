"""The framework adapters: the Lightning example (:mod:`chaos_edge.lightning`) and the Hugging
Face example (:mod:`chaos_edge.hf`) train on real nodes through a join, a leave, a kill -9 and
a SIGSTOP, and every member holds the same state (model, buffers, optimizer, LR schedule) at
every common step. Each option that cannot be elastic is refused in one line.
"""

from __future__ import annotations

import sys
from typing import Any

import pytest
import torch

from chaosctl.client import call_once
from tests.training._run import PACE_S, Run

pytestmark = pytest.mark.timeout(240)

EXAMPLES = {
    "lightning": ["chaos_edge.examples.lightning_mlp", "--sleep", str(PACE_S)],
    "hf": ["chaos_edge.examples.hf_chartf", "--sleep", str(PACE_S), "--short"],
}


def start(r: Run, node: str, example: str) -> None:
    module, *extra = EXAMPLES[example]
    argv = [sys.executable, "-m", module, "--steps", "100000",
            "--record", str(r.out / f"{node}.jsonl"), *extra]
    if example == "hf":  # its Trainer's output_dir, in the test's folder, not /tmp
        argv += ["--out", str(r.out / f"hf-{node}")]
    call_once(r.c.socket_of(node), "join", {"neighbors": [], "command": argv}, timeout=5)


@pytest.mark.parametrize("example", sorted(EXAMPLES))
def test_an_adapted_script_trains_through_join_leave_kill_and_freeze(run: Any,
                                                                     example: str) -> None:
    pytest.importorskip({"lightning": "lightning", "hf": "transformers"}[example])
    r = run(3)
    n1, n2, n3 = r.c.node_ids
    r.through_faults(lambda n: start(r, n, example))
    leave = [e for e in r.events("scale-in") if e["node"] == n2][-1]
    assert leave["reason"] == "leave"
    # The leave stopped the framework's loop; the script returned normally.
    assert "worker exited with 0" in (r.c.workdir / f"{n2}.log").read_text()
    assert {n1, n2, n3} <= {e["node"] for e in r.events("scale-out")}
    assert r.records(n3)[0]["step"] > 20  # n3 started at the cluster's step
    assert r.assert_consistent() > 40
    r.assert_loss_falls(n1)
    if example == "hf":  # the Trainer made its output_dir there, and no other
        assert {p.name for p in r.out.glob("hf-*")} <= {f"hf-{n}" for n in (n1, n2, n3)}


def test_the_lightning_strategy_refuses_what_cannot_be_elastic() -> None:
    pl = pytest.importorskip("lightning.pytorch")
    from chaos_edge.lightning import ChaosStrategy, _refuse_what_cannot_be_elastic

    with pytest.raises(ValueError, match=r"^clip_grad_norm: Lightning clips"):
        ChaosStrategy(clip_grad_norm=1.0)
    opt = torch.optim.SGD(torch.nn.Linear(2, 2).parameters(), lr=0.1)
    cases = [({}, [opt, opt], "^configure_optimizers returned 2 optimizers"),
             ({"min_steps": 10}, [opt], "^min_steps/min_epochs: a node that leaves")]
    for options, opts, message in cases:
        trainer = pl.Trainer(strategy=ChaosStrategy(), logger=False, **options)
        with pytest.raises(ValueError, match=message) as info:
            _refuse_what_cannot_be_elastic(trainer, opts)
        assert "\n" not in str(info.value)


def test_the_hf_callback_refuses_what_cannot_be_elastic(tmp_path: Any) -> None:
    transformers = pytest.importorskip("transformers")
    from chaos_edge.hf import ChaosCallback, _refuse_what_cannot_be_elastic

    with pytest.raises(ValueError, match=r"^scaler: the Hugging Face Trainer"):
        ChaosCallback(scaler=object())
    args = transformers.TrainingArguments(str(tmp_path), report_to="none")
    resumed = transformers.TrainerState(global_step=7)
    with pytest.raises(ValueError, match=r"^resume_from_checkpoint: a node resumes"):
        _refuse_what_cannot_be_elastic(args, resumed)
    args.deepspeed = "ds.json"  # as a DeepSpeed config would set it
    with pytest.raises(ValueError, match=r"^deepspeed: Chaos replicates"):
        _refuse_what_cannot_be_elastic(args, transformers.TrainerState())


class Round:
    """A stand-in for the cluster's round: counts the backward passes behind each call and
    zeroes the gradient, so the optimizer step that follows changes nothing if and only if
    the round ran between the last backward and the step."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model, self.step, self.backwards, self.calls = model, 0, 0, []  # type: list[int]
        for p in model.parameters():
            p.register_post_accumulate_grad_hook(self._backward)

    def _backward(self, p: torch.Tensor) -> None:
        if p is next(iter(self.model.parameters())):
            self.backwards += 1

    def update(self) -> None:
        self.calls.append(self.backwards)
        for p in self.model.parameters():
            p.grad.zero_()  # type: ignore[union-attr]
        self.step += 1

    def check_state_replication(self) -> None:
        pass

    def close(self) -> None:
        self.model = torch.nn.Module()  # closed: no further update() could work


def test_lightning_averages_once_per_step_after_the_accumulated_backwards() -> None:
    pl = pytest.importorskip("lightning.pytorch")
    from chaos_edge.examples.lightning_mlp import Regression
    from chaos_edge.lightning import ChaosStrategy

    torch.manual_seed(0)
    module = Regression(8, 0.1)
    before = [p.detach().clone() for p in module.parameters()]
    strategy = ChaosStrategy("cpu")
    strategy.chaos = stub = Round(module)  # type: ignore[assignment]
    x = torch.randn(24, 8)
    data = torch.utils.data.DataLoader(list(zip(x, x[:, :2], strict=True)), batch_size=4)
    pl.Trainer(strategy=strategy, max_steps=3, accumulate_grad_batches=2, logger=False,
               enable_checkpointing=False, enable_progress_bar=False,
               enable_model_summary=False, gradient_clip_val=1.0).fit(module, data)
    assert stub.calls == [2, 4, 6]  # once per step, after both micro-batches
    assert all(torch.equal(a, b) for a, b in zip(before, module.parameters(), strict=True))


def test_hf_averages_once_per_step_after_the_accumulated_backwards(tmp_path: Any) -> None:
    transformers = pytest.importorskip("transformers")
    from chaos_edge.hf import ChaosCallback

    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = torch.nn.Linear(8, 2)

        def forward(self, x: torch.Tensor, labels: torch.Tensor) -> dict[str, torch.Tensor]:
            return {"loss": torch.nn.functional.mse_loss(self.lin(x), labels)}

    class Stub(ChaosCallback):
        def _join(self, model: Any, optimizer: Any, objects: Any, overlap: bool) -> Any:
            assert not overlap  # accumulation: the round cannot start during backward
            return Round(model)

    torch.manual_seed(0)
    net = Net()
    before = [p.detach().clone() for p in net.parameters()]
    x = torch.randn(24, 8)
    rows = [{"x": a, "labels": a[:2]} for a in x]
    callback = Stub()
    args = transformers.TrainingArguments(str(tmp_path), max_steps=3,
                                          per_device_train_batch_size=4,
                                          gradient_accumulation_steps=2, report_to="none",
                                          save_strategy="no", disable_tqdm=True, use_cpu=True)
    transformers.Trainer(model=net, args=args, train_dataset=rows,
                         callbacks=[callback]).train()
    assert callback.chaos.calls == [2, 4, 6]  # type: ignore[union-attr]
    assert all(torch.equal(a, b) for a, b in zip(before, net.parameters(), strict=True))
