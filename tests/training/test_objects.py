"""Registered objects: what a script hands ``Trainer(state=...)`` travels whole, or fails early.

A source captures its registered state into the byte space; a joiner that built the same
objects restores it and must then hold the cluster's scheduler position, LR, scaler scale,
EMA weights and counters. No cluster is needed: the byte space is the same one scale-out
moves.
"""

from __future__ import annotations

import pytest
import torch

from chaos_edge.replication.state import StateSpace
from chaos_edge.trainer.control import StateMismatch, UnserialisableState
from chaos_edge.trainer.objects import Registry


def _run(steps: int, sched_cls: str = "onecycle") -> tuple[torch.nn.Module, torch.optim.Optimizer,
                                                          Registry]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4))
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    sched: torch.optim.lr_scheduler.LRScheduler
    if sched_cls == "onecycle":
        sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.1, total_steps=100)
    else:
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=10)
    ema = torch.optim.swa_utils.AveragedModel(
        model, multi_avg_fn=torch.optim.swa_utils.get_ema_multi_avg_fn(0.9))
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10)
    reg = Registry({"sched": sched, "ema": ema, "counters": {"pos": 0, "epoch": 0}},
                   scaler=scaler)
    for _ in range(steps):
        scaler.scale(model(torch.randn(8, 4)).pow(2).mean()).backward()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad()
        sched.step()
        ema.update_parameters(model)
        reg.values["counters"]["pos"] += 8
    return model, opt, reg


def _ship(model: torch.nn.Module, opt: torch.optim.Optimizer, reg: Registry) -> StateSpace:
    tensors, doc = reg.capture()
    return StateSpace.capture(model, opt, {"step": 7, "objects": doc}, extra=tensors)


def test_a_joiner_gets_the_clusters_scheduler_lr_scaler_ema_and_counters() -> None:
    src_model, src_opt, src = _run(7)
    space = _ship(src_model, src_opt, src)
    model, opt, reg = _run(0)
    loaded = StateSpace.load(space.manifest, space.buffer)
    objects = loaded.runtime["objects"]
    assert loaded.fit_error(model, opt) is None
    assert reg.mismatch(objects, loaded.extra) is None
    loaded.apply(model, opt)
    reg.restore(objects, loaded.extra)
    assert reg.values["sched"].state_dict() == src.values["sched"].state_dict()
    assert opt.param_groups[0]["lr"] == src_opt.param_groups[0]["lr"]
    assert reg.values["grad_scaler"].state_dict() == src.values["grad_scaler"].state_dict()
    assert reg.values["counters"] == {"pos": 56, "epoch": 0}
    for a, b in zip(reg.values["ema"].state_dict().values(),
                    src.values["ema"].state_dict().values(), strict=True):
        assert torch.equal(a, b)
    # The next step is the same on both.
    assert reg.values["sched"].get_last_lr() == src.values["sched"].get_last_lr()


def test_an_unserialisable_object_is_named_at_construction() -> None:
    class Sampler:
        def state_dict(self) -> dict[str, object]:
            return {"gen": torch.Generator(), "pos": 3}

        def load_state_dict(self, sd: dict[str, object]) -> None:
            pass

    with pytest.raises(UnserialisableState, match=r"'sampler'.*\['gen'\].*Generator"):
        Registry({"sampler": Sampler()})
    with pytest.raises(UnserialisableState, match="'when'"):
        Registry({"when": object()})
    with pytest.raises(UnserialisableState, match="without '/'"):
        Registry({"a/b": 1})


def test_another_scheduler_type_is_refused_in_one_line() -> None:
    src_model, src_opt, src = _run(2, "onecycle")
    space = _ship(src_model, src_opt, src)
    _, _, reg = _run(0, "step")
    loaded = StateSpace.load(space.manifest, space.buffer)
    why = reg.mismatch(loaded.runtime["objects"], loaded.extra)
    assert why is not None and "'sched'" in why and "OneCycleLR" in why and "StepLR" in why
    assert "\n" not in why


def test_another_model_shape_is_refused_before_anything_loads() -> None:
    src_model, src_opt, src = _run(2)
    space = _ship(src_model, src_opt, src)
    torch.manual_seed(1)
    model = torch.nn.Sequential(torch.nn.Linear(4, 5), torch.nn.BatchNorm1d(5))
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    loaded = StateSpace.load(space.manifest, space.buffer)
    why = loaded.fit_error(model, opt)
    assert why is not None and "0.weight" in why and "[4, 4]" in why and "[5, 4]" in why
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_a_load_state_dict_that_refuses_is_a_mismatch() -> None:
    class Strict:
        def __init__(self, keys: tuple[str, ...]) -> None:
            self.keys = keys

        def state_dict(self) -> dict[str, int]:
            return dict.fromkeys(self.keys, 1)

        def load_state_dict(self, sd: dict[str, int]) -> None:
            if tuple(sd) != self.keys:
                raise KeyError(f"unexpected keys {sorted(sd)}")

    src = Registry({"x": Strict(("a",))})
    tensors, doc = src.capture()
    with pytest.raises(StateMismatch, match="'x'"):
        Registry({"x": Strict(("b",))}).restore(doc, dict(tensors))


def test_plain_values_keep_ints_tuples_and_int_keys() -> None:
    value = {"pos": 3, "shape": (2, 3), "by_id": {1: "a", 2: "b"}, "inf": float("inf")}
    src = Registry({"v": value})
    tensors, doc = src.capture()
    dst = Registry({"v": {}})
    dst.restore(doc, dict(tensors))
    assert dst.values["v"] == value
