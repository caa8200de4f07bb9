"""DiLoCo's outer step and outer state, on real models without a cluster (issue 13).

The outer step must be torch's SGD (Nesterov or heavy-ball) on the synced parameters, and
members that apply the same averaged pseudo-gradient must end bit-identical whatever their
inner steps did. The sync mode is validated in the policy and in chaosd.toml.
"""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch

from chaos_edge.replication.state import StateSpace
from chaos_edge.trainer.outer import COUNT, MOMENTUM, SYNCED, Outer, inner_state_hidden, outer_step
from chaos_edge.trainer.stepper import Stepper
from daemon.contracts.config import load_config
from daemon.contracts.errors import ConfigError, PolicyError
from daemon.contracts.policy import SyncMode, SyncPolicy
from daemon.contracts.protocol import Replicated


def _net() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8), torch.nn.ReLU(),
                               torch.nn.Linear(8, 2))


@pytest.mark.parametrize("outer,momentum", [("nesterov", 0.9), ("sgd", 0.9), ("sgd", 0.0)])
def test_outer_step_is_torch_sgd(outer: str, momentum: float) -> None:
    torch.manual_seed(1)
    mode = SyncMode("diloco", 4, outer, 0.7, momentum)
    synced, mom = torch.randn(100), torch.zeros(100)
    ref = torch.nn.Parameter(synced.clone())
    opt = torch.optim.SGD([ref], lr=0.7, momentum=momentum, nesterov=outer == "nesterov",
                          foreach=False)
    for _ in range(5):
        g = torch.randn(100)
        outer_step(synced, mom, g, mode)
        ref.grad = g.clone()
        opt.step()
        assert torch.equal(synced, ref.detach()), "the outer step is not torch's SGD"


def _inner_steps(model: torch.nn.Module, opt: torch.optim.Optimizer, seed: int, n: int) -> None:
    torch.manual_seed(seed)
    for _ in range(n):
        opt.zero_grad()
        model(torch.randn(16, 4)).pow(2).mean().backward()
        opt.step()


def test_members_end_bit_identical_after_an_outer_step() -> None:
    """Two members drift apart in their inner steps; the averaged pseudo-gradient brings them
    to the same synced parameters, loaded into both models, with the same momentum."""
    mode = SyncMode("diloco", 3)
    models = [_net(), _net()]
    opts = [torch.optim.AdamW(m.parameters(), lr=0.01) for m in models]
    outers = [Outer(list(m.parameters()), 3) for m in models]
    start = outers[0].synced.clone()
    for round_ in range(3):
        flats = []
        for i, (m, o, out) in enumerate(zip(models, opts, outers, strict=True)):
            _inner_steps(m, o, seed=10 * round_ + i, n=3)
            flat = torch.empty_like(out.synced)
            out.pseudo_gradient(flat)
            from_params = torch.cat([p.detach().reshape(-1) for p in m.parameters()])
            assert torch.equal(flat, out.synced - from_params)
            flats.append(flat)
        avg = (flats[0] * 48 + flats[1] * 16) / 64  # sample-weighted, as the tree does
        for out in outers:
            out.step(avg, mode)
        for a, b in zip(models[0].parameters(), models[1].parameters(), strict=True):
            assert torch.equal(a, b)
        assert torch.equal(outers[0].momentum, outers[1].momentum)
        assert [o.count for o in outers] == [round_ + 1] * 2
        assert all(o.samples == 0 for o in outers)
    assert not torch.equal(outers[0].synced, start), "the outer steps moved nothing"
    # The inner optimizers' states stay each member's own (DiLoCo keeps them per worker).
    s0, s1 = (o.state_dict()["state"][0]["exp_avg"] for o in opts)
    assert not torch.equal(s0, s1)


def test_shared_state_replaces_parameters_and_hides_inner_state() -> None:
    """What a snapshot and the guard see mid-window: the synced parameters (not the live
    ones), the agreed buffers, the momentum and count, and no inner optimizer state. A
    joiner restores the same outer state from it."""
    model = _net()
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    stepper = Stepper(model, opt)
    out = Outer(stepper.params, 4)
    out.momentum.add_(0.5)
    _inner_steps(model, opt, seed=3, n=2)
    assert opt.state, "Adam holds state after its steps"
    state = out.model_state(model, stepper.model_state())
    names = [n for n, _ in model.named_parameters()]
    flat = torch.cat([state[n].reshape(-1) for n in names])
    assert torch.equal(flat, out.synced)
    assert torch.equal(state["1.running_mean"], stepper.synced["1.running_mean"])
    assert out.exact and [n for n, _ in out.tensors()] == [MOMENTUM, COUNT]
    with inner_state_hidden(opt) as hidden:
        snap = StateSpace.capture(model, hidden, {"step": 6}, model_state=state,
                                  extra=out.tensors(), rng=False)
        assert not hidden.state_dict()["state"]
    assert opt.state, "the inner state is back after the capture"
    loaded = StateSpace.load(snap.manifest, snap.buffer)
    joiner = _net()
    jopt = torch.optim.AdamW(joiner.parameters(), lr=0.01)
    assert loaded.fit_error(joiner, jopt) is None
    loaded.apply(joiner, jopt)
    back = Outer.restore(list(joiner.parameters()), 4, loaded.extra)
    assert torch.equal(back.synced, out.synced) and torch.equal(back.momentum, out.momentum)
    assert back.count == out.count and not jopt.state


def test_non_float32_parameters_carry_their_synced_copy() -> None:
    model = copy.deepcopy(_net()).to(torch.bfloat16)
    out = Outer(list(model.parameters()), 2)
    assert not out.exact and SYNCED in dict(out.tensors())


def test_sync_mode_validation_and_wire_form() -> None:
    mode = SyncMode("diloco", 8, "sgd", 0.5, 0.0)
    pub = SyncPolicy.build(3, ["a", "b"], [("a", "b")], "a", 5, sync=mode)
    assert SyncPolicy.from_json(pub.to_json()) == pub
    legacy = pub.to_dict()
    del legacy["sync"]
    assert not SyncPolicy.from_dict(legacy).sync.diloco  # an older scheduler's policy
    for bad, why in [(SyncMode("local"), "sync mode"), (SyncMode("diloco", 0), "inner_steps"),
                     (SyncMode("diloco", 4, "adam"), "outer optimizer"),
                     (SyncMode("diloco", 4, outer_lr=0.0), "outer_lr"),
                     (SyncMode("diloco", 4, outer_momentum=1.0), "outer_momentum")]:
        with pytest.raises(PolicyError, match=why):
            bad.validate()


def test_config_training_sync_keys(tmp_path: Path) -> None:
    def load(text: str) -> SyncMode:
        path = tmp_path / "c.toml"
        path.write_text(text)
        return load_config(path).training.sync_mode()

    assert not load("").diloco
    mode = load('[training]\nsync = "diloco"\ninner_steps = 20\nouter_lr = 0.5\n')
    assert (mode.diloco, mode.inner_steps, mode.outer, mode.outer_lr) == (True, 20, "nesterov", 0.5)
    for text, key in [('[training]\nsync = "gossip"\n', "training.sync must be one of"),
                      ("[training]\ninner_steps = 0\n", "training.inner_steps must be"),
                      ('[training]\nouter_optimizer = "adam"\n', "training.outer_optimizer"),
                      ("[training]\nouter_momentum = 1.5\n", "training.outer_momentum"),
                      ("[training]\nouter_lr = -1\n", "training.outer_lr"),
                      ('[training]\ninner_steps = "4"\n', "training.inner_steps")]:
        with pytest.raises(ConfigError, match=key):
            load(text)


def test_the_scheduler_puts_the_sync_mode_in_every_policy() -> None:
    """Every policy the scheduler publishes (bootstrap, scale-out, failure) carries the
    cluster's mode, and survives the retained snapshot's JSON."""
    from daemon.cluster.primitives import Negotiator
    from daemon.cluster.scheduler import Scheduler
    from daemon.contracts.clock import FakeClock

    clock = FakeClock()
    mode = SyncMode("diloco", 16, "nesterov", 0.7, 0.9)
    neg = Negotiator(Scheduler("s", 1, None, clock), clock, lambda _n: 0, sync=mode)
    for node in ("a", "b"):
        neg.join(node, f"127.0.0.1:{1000 + len(neg.sched.nodes)}", [])
        neg.replicated(node, Replicated(version=0))
    neg.gone("b", "node-failed")
    policies = list(neg.sched.policies)
    assert len(policies) >= 3 and all(p.sync == mode for p in policies)
    assert all(SyncPolicy.from_json(p.to_json()).sync == mode for p in policies)
