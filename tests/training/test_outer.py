"""DiLoCo's outer step and outer state, on real models without a cluster (issue 13).

The outer step must be torch's SGD (Nesterov or heavy-ball) on the synced parameters, and
members that apply the same averaged pseudo-gradient must end bit-identical whatever their
inner steps did. The sync mode is validated in the policy and in chaosd.toml.
"""

from __future__ import annotations

import copy
import itertools
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
    outers = [Outer(list(m.parameters()), mode) for m in models]
    start = outers[0].synced.clone()
    for round_ in range(3):
        flats = []
        for i, (m, o, out) in enumerate(zip(models, opts, outers, strict=True)):
            _inner_steps(m, o, seed=10 * round_ + i, n=3)
            flat = torch.empty_like(out.synced)
            out.pseudo_gradient(3 * (round_ + 1), flat)
            from_params = torch.cat([p.detach().reshape(-1) for p in m.parameters()])
            assert torch.equal(flat, out.synced - from_params)
            flats.append(flat)
        avg = (flats[0] * 48 + flats[1] * 16) / 64  # sample-weighted, as the tree does
        for out in outers:
            out.step(3 * (round_ + 1), avg, mode)
        for a, b in zip(models[0].parameters(), models[1].parameters(), strict=True):
            assert torch.equal(a, b)
        assert torch.equal(outers[0].momentum, outers[1].momentum)
        assert [o.count for o in outers] == [round_ + 1] * 2
        assert all(o.windows == [0] for o in outers)
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
    out = Outer(stepper.params, SyncMode("diloco", 4))
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
    back = Outer.restore(list(joiner.parameters()), SyncMode("diloco", 4), loaded.extra)
    assert torch.equal(back.synced, out.synced) and torch.equal(back.momentum, out.momentum)
    assert back.count == out.count and not jopt.state


def test_non_float32_parameters_carry_their_synced_copy() -> None:
    model = copy.deepcopy(_net()).to(torch.bfloat16)
    out = Outer(list(model.parameters()), SyncMode("diloco", 2))
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


@pytest.mark.parametrize("merge", [0.0, 0.5])
def test_streaming_syncs_one_fragment_a_round_and_merges_it(merge: float) -> None:
    """Streaming DiLoCo: round k (every H / fragments steps) applies the outer step to
    fragment k % fragments alone, with that fragment's own sample window; the members'
    synced values and momentum end bit-identical, each member's copy of the fragment becomes
    ``merge * local + (1 - merge) * synced``, and every other value is left alone."""
    h, parts = 6, 3
    mode = SyncMode("streaming", h, "nesterov", 0.7, 0.9, parts, merge)
    mode.validate()
    assert mode.period == 2
    models = [_net(), _net()]
    opts = [torch.optim.AdamW(m.parameters(), lr=0.01) for m in models]
    outers = [Outer(list(m.parameters()), mode) for m in models]
    n = outers[0].synced.numel()
    bounds = outers[0].bounds
    assert bounds[0][0] == 0 and bounds[-1][1] == n
    assert all(a[1] == b[0] for a, b in itertools.pairwise(bounds))
    ref_synced = outers[0].synced.clone()
    ref_mom = torch.zeros(n)
    seen = []
    for step in range(1, 2 * h + 1):
        for i, (m, o, out) in enumerate(zip(models, opts, outers, strict=True)):
            _inner_steps(m, o, seed=100 * step + i, n=1)
            out.add_samples(16 * (i + 1))
        if not outers[0].outer_round(step):
            continue
        lo, hi = outers[0].fragment(step)
        seen.append((lo, hi))
        # A fragment's window counts every inner step since its own last round.
        first = step <= h
        assert outers[0].samples(step) == 16 * (step if first else h)
        pgs = []
        for out in outers:
            pg = torch.empty(hi - lo)
            out.pseudo_gradient(step, pg)
            pgs.append(pg)
        avg = (pgs[0] + pgs[1]) / 2
        before = [torch.cat([p.detach().reshape(-1) for p in m.parameters()]) for m in models]
        for out in outers:
            out.step(step, avg, mode)
        outer_step(ref_synced[lo:hi], ref_mom[lo:hi], avg, mode)
        for out, m, was in zip(outers, models, before, strict=True):
            assert torch.equal(out.synced, ref_synced) and torch.equal(out.momentum, ref_mom)
            now = torch.cat([p.detach().reshape(-1) for p in m.parameters()])
            want = was.clone()
            want[lo:hi] = was[lo:hi] * merge + ref_synced[lo:hi] * (1 - merge) if merge \
                else ref_synced[lo:hi]
            assert torch.allclose(now, want, rtol=0, atol=1e-7)
            assert out.samples(step) == 0
    assert seen[:parts] == [bounds[1], bounds[2], bounds[0]] and seen[parts:] == seen[:parts]
    assert [o.count for o in outers] == [2 * parts] * 2


def test_streaming_validation_names_the_keys(tmp_path: Path) -> None:
    for bad, why in [(SyncMode("streaming", 8, fragments=3), "divide inner_steps"),
                     (SyncMode("streaming", 8, fragments=1), "fragments must be"),
                     (SyncMode("streaming", 8, fragments=2, merge=1.0), "merge"),
                     (SyncMode("diloco", 8, fragments=2), "streaming's"),
                     (SyncMode("diloco", 8, overlap=True), "streaming's"),
                     (SyncMode("streaming", 8, fragments=8, overlap=True), "2 or more")]:
        with pytest.raises(PolicyError, match=why):
            bad.validate()
    path = tmp_path / "c.toml"
    for text, msg in [("fragments = 3", "training.fragments = 3 does not divide "
                                        "training.inner_steps = 8"),
                      ("fragments = 1", "training.fragments must be 2..64"),
                      ("fragments = 4\nmerge = -0.1", "training.merge must be in"),
                      ("fragments = 8\noverlap = true", "training.overlap needs "
                                                         "training.inner_steps / "
                                                         "training.fragments of 2 or more")]:
        path.write_text(f'[training]\nsync = "streaming"\ninner_steps = 8\n{text}\n')
        with pytest.raises(ConfigError, match=msg):
            load_config(path)
    path.write_text('[training]\nsync = "diloco"\noverlap = true\n')
    with pytest.raises(ConfigError, match=r'training\.overlap is for sync = "streaming"'):
        load_config(path)
    path.write_text('[training]\nsync = "streaming"\ninner_steps = 8\nfragments = 4\n'
                    'overlap = true\n')
    mode = load_config(path).training.sync_mode()
    assert (mode.mode, mode.period, mode.merge, mode.overlap) == ("streaming", 2, 0.0, True)
    pub = SyncPolicy.build(3, ["a", "b"], [("a", "b")], "a", 5, sync=mode)
    assert SyncPolicy.from_json(pub.to_json()).sync == mode


def test_a_streaming_round_carries_its_fragment_and_the_agreed_buffers() -> None:
    """The round's vector is the fragment's pseudo-gradient (the lossy lead, in the wire
    format) followed by the buffers and the live flag as in every round; its committed result
    lands in the fragment and the buffers, and a snapshot names the mode for a joiner."""
    from chaos_edge.trainer.objects import Registry
    from chaos_edge.trainer.replica import Replica

    mode = SyncMode("streaming", 4, fragments=2)
    pub = SyncPolicy.build(3, ["a"], [], "a", 0, sync=mode)
    model = _net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    stepper = Stepper(model, opt)
    rep = Replica(model, opt, Registry(None, None), stepper)
    model(torch.randn(8, 4)).pow(2).mean().backward()
    assert rep.inner_step(pub, 8)  # step 1: no round
    model(torch.randn(8, 4)).pow(2).mean().backward()
    assert not rep.inner_step(pub, 8)  # step 2 ends with the round of fragment 1
    assert rep.outer is not None and rep.lane() == 1
    lo, hi = rep.outer.fragment(2)
    assert (lo, hi) == rep.outer.bounds[1] and rep.lead() == hi - lo < stepper.n_grad
    flat = stepper.gather(samples=rep.round_samples(8))
    vec, lossy = rep.round_input(flat, rep.round_samples(8))
    assert lossy == hi - lo and vec.numel() == hi - lo + stepper.size - stepper.n_grad
    pg = torch.empty(hi - lo)
    rep.outer.pseudo_gradient(2, pg)
    assert torch.equal(vec[:lossy], pg) and torch.equal(vec[lossy:], flat[stepper.n_grad:])
    result = vec.clone()
    result[lossy : lossy + stepper.n_buf] = 0.25  # the agreed buffers
    untouched = rep.outer.synced[:lo].clone()
    rep.commit(result, mode)
    assert rep.step == 2 and rep.outer.count == 1
    assert torch.equal(rep.outer.synced[:lo], untouched)
    assert all(torch.all(b == 0.25) for k, b in stepper.buffers.items() if "running" in k)
    snap = rep.snapshot()
    joiner = _net()
    jopt = torch.optim.SGD(joiner.parameters(), lr=0.1)
    rep2 = Replica(joiner, jopt, Registry(None, None), Stepper(joiner, jopt))
    rep2.restore(StateSpace.load(snap.manifest, snap.buffer))
    assert rep2.outer is not None and rep2.rhythm.mode == mode and rep2.step == 2
    assert torch.equal(rep2.outer.synced, rep.outer.synced)
