"""The step between the all-reduce and the optimizer, run on real models without a cluster.

Two "members" build the same model; each gathers its round input, and the test averages the
inputs the way the tree does (weighted by samples, divided by the total) and applies the one
result on both. Whatever the members did locally, they must end bit-identical.
"""

from __future__ import annotations

import copy

import pytest
import torch

from chaos_edge.trainer.shares import SLOTS, Shares, shard_of, split
from chaos_edge.trainer.stepper import Stepper
from daemon.contracts.clock import FakeClock
from daemon.contracts.policy import SyncPolicy


def _net() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8), torch.nn.ReLU(),
                               torch.nn.Linear(8, 2))


def _reduce(inputs: list[torch.Tensor], samples: list[int]) -> torch.Tensor:
    """What the tree computes: sum of n_i * x_i, divided by the total at the root."""
    acc = torch.zeros_like(inputs[0])
    for x, n in zip(inputs, samples, strict=True):
        acc += x * float(n)
    return acc / float(max(sum(samples), 1))


def _members(k: int, **kw: object) -> list[tuple[torch.nn.Module, torch.optim.Optimizer,
                                                 Stepper]]:
    out = []
    for _ in range(k):
        m = _net()
        opt = torch.optim.AdamW(m.parameters(), lr=0.01)
        out.append((m, opt, Stepper(m, opt, **kw)))  # type: ignore[arg-type]
    return out


def _step(members: list[tuple[torch.nn.Module, torch.optim.Optimizer, Stepper]],
          samples: list[int], seed: int, scale: float = 1.0) -> torch.Tensor:
    inputs = []
    for i, (m, _, st) in enumerate(members):
        g = torch.Generator().manual_seed(seed * 10 + i)
        x = torch.randn(samples[i] or 2, 4, generator=g)
        (m(x).pow(2).mean() * scale).backward()
        inputs.append(st.gather(samples=samples[i]).clone())
    res = _reduce(inputs, samples)
    for _, _, st in members:
        st.apply(res.clone())
    return res


def _same(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a.state_dict().values(),
                                                  b.state_dict().values(), strict=True))


def test_buffers_are_averaged_and_members_stay_identical() -> None:
    members = _members(2)
    for s in range(5):
        _step(members, [16, 48], s)
        assert _same(members[0][0], members[1][0])
    bn = members[0][0][1]
    assert int(bn.num_batches_tracked) == 5  # the integer counter stays exact
    assert bn.running_mean.abs().sum() > 0


def test_averaged_running_mean_is_the_global_batch_mean() -> None:
    """With momentum 1 the running mean is the batch mean: the weighted average of the
    members' means is exactly the mean of the global batch."""
    members = _members(2)
    for m, _, _ in members:
        m[1].momentum = 1.0
    xs = [torch.randn(3, 4), torch.randn(9, 4)]
    inputs = []
    for (m, _, st), x in zip(members, xs, strict=True):
        m(x).sum().backward()
        inputs.append(st.gather(samples=len(x)).clone())
    for _, _, st in members:
        st.apply(_reduce(inputs, [3, 9]))
    whole = _net()
    whole[1].momentum = 1.0
    whole(torch.cat(xs))
    assert torch.allclose(members[0][0][1].running_mean, whole[1].running_mean, atol=1e-6)


def test_local_buffers_stay_local() -> None:
    members = _members(2, buffers="local")
    _step(members, [8, 8], 0)
    a, b = members[0][0][1], members[1][0][1]
    assert not torch.equal(a.running_mean, b.running_mean)
    assert all(torch.equal(p, q) for p, q in zip(members[0][0].parameters(),
                                                  members[1][0].parameters(), strict=True))
    assert set(members[0][2].digest_state()) == {k for k, _ in members[0][0].named_parameters()}


def test_a_round_without_samples_keeps_the_agreed_buffers() -> None:
    members = _members(2)
    _step(members, [8, 8], 0)
    agreed = members[0][0][1].running_mean.clone()
    _step(members, [0, 0], 1)  # e.g. every member draining: the average is all zeros
    assert torch.equal(members[0][0][1].running_mean, agreed)


def test_clipping_acts_on_the_averaged_gradient() -> None:
    members = _members(2, clip_grad_norm=0.5)
    seen: list[float] = []
    members[0][2].transform = lambda ps: seen.append(
        float(torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in ps]))))
    _step(members, [4, 4], 0, scale=100.0)
    assert seen and seen[0] > 0.5  # the transform saw the averaged, unclipped gradient
    assert _same(members[0][0], members[1][0])


def test_grad_scaler_skips_an_inf_step_on_every_member() -> None:
    members = []
    for _ in range(2):
        m = _net()
        opt = torch.optim.SGD(m.parameters(), lr=0.1)
        scaler = torch.amp.GradScaler("cpu", init_scale=2.0**8)
        members.append((m, opt, Stepper(m, opt, scaler=scaler)))
    before = copy.deepcopy(members[0][0].state_dict())
    inputs = []
    for i, (m, _, st) in enumerate(members):
        loss = m(torch.randn(4, 4)).sum()
        st.scaler.scale(loss).backward()
        if i == 1:
            next(m.parameters()).grad[0, 0] = float("inf")  # one member overflows
        inputs.append(st.gather(samples=4).clone())
    res = _reduce(inputs, [4, 4])
    for _, _, st in members:
        st.apply(res.clone())
    params = [k for k, _ in members[0][0].named_parameters()]
    assert all(torch.equal(members[0][0].state_dict()[k], before[k]) for k in params)
    assert all(st.scaler.get_scale() == 2.0**7 for _, _, st in members)  # backed off alike


def test_the_step_reads_the_result_in_place_and_matches_a_copy_bit_for_bit() -> None:
    """float32 CPU gradients become views of the result (no copy of the model's size); the
    parameters after the step are those of the copying path, bit for bit."""
    viewed, copied = _members(1), _members(1)
    copied[0][2]._grads_view = False
    seen: list[bool] = []
    st = viewed[0][2]
    # a view of the result: its storage is the whole round vector
    st.transform = lambda ps: seen.extend(p.grad.untyped_storage().nbytes() == st.size * 4
                                          for p in ps)
    for s in range(3):
        _step(viewed, [8], s)
        _step(copied, [8], s)
        assert _same(viewed[0][0], copied[0][0])
        assert all(p.grad is None for p in viewed[0][0].parameters())  # views dropped
    assert seen and all(seen)


def test_low_precision_gradients_keep_their_dtype() -> None:
    """bf16 gradients go to the wire as float32 (exact) and come back bf16, bit for bit."""
    torch.manual_seed(0)
    m = torch.nn.Linear(4, 2).to(torch.bfloat16)
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    seen: list[torch.Tensor] = []
    st = Stepper(m, opt, grad_transform=lambda ps: seen.extend(p.grad.clone() for p in ps))
    m(torch.randn(3, 4, dtype=torch.bfloat16)).sum().backward()
    grads = [p.grad.clone() for p in m.parameters()]
    flat = st.gather(samples=1)
    assert flat.dtype == torch.float32
    st.apply(flat.clone())  # the average of one member is its own gradient
    assert [g.dtype for g in seen] == [torch.bfloat16] * 2
    assert all(torch.equal(a, b) for a, b in zip(seen, grads, strict=True))
    assert all(p.dtype == torch.bfloat16 for p in m.parameters())


def test_speeds_ride_in_their_slots() -> None:
    members = _members(2, speeds=True)
    inputs = []
    for i, (m, _, st) in enumerate(members):
        m(torch.randn(4, 4)).sum().backward()
        inputs.append(st.gather(slot=i, speed=[100.0, 300.0][i], samples=[8, 24][i]).clone())
    sp = members[0][2].speeds(_reduce(inputs, [8, 24]))
    assert sp is not None and sp.numel() == SLOTS
    assert float(sp[1] / sp[0]) == pytest.approx(3.0)


@pytest.mark.parametrize(("total", "weights"), [(64, [1.0, 3.0]), (10, [1.0, 1.0, 1.0]),
                                                (7, [0.0, 2.0]), (2, [1.0, 5.0, 9.0]),
                                                (100, [0.3, 0.7, 1.9, 4.2])])
def test_split_covers_the_batch_exactly(total: int, weights: list[float]) -> None:
    parts = split(total, weights)
    assert sum(parts) == total and len(parts) == len(weights)
    if total >= len(weights):
        assert min(parts) >= 1
    for i, wi in enumerate(weights):  # a faster member never gets fewer samples
        for j, wj in enumerate(weights):
            if all(w > 0 for w in weights) and total >= len(weights) and wi > wj:
                assert parts[i] >= parts[j]
            if wi == wj:
                assert abs(parts[i] - parts[j]) <= 1


def test_shards_tile_the_global_batch_on_every_member() -> None:
    ms = ("c", "a", "b")
    for gb, speeds in ((30, None), (31, [1.0, 2.0, 3.0])):
        shards = [shard_of(5, ms, me, per_member=8, global_batch=gb, speeds=speeds)
                  for me in ("a", "b", "c")]
        assert [s.index for s in shards] == [0, 1, 2]
        assert sum(s.size for s in shards) == gb
        assert [s.start for s in shards] == [0, shards[0].size, shards[0].size + shards[1].size]
    plain = shard_of(5, ms, "b", per_member=8, global_batch=None, speeds=None)
    assert (plain.global_batch, plain.size, plain.start) == (24, 8, 8)


def test_shares_follow_the_speeds_of_the_members_they_were_measured_for() -> None:
    ms = ["a", "b"]
    v3 = SyncPolicy.build(3, ms, [("a", "b")], "a", 0, {m: "127.0.0.1:1" for m in ms})
    v4 = SyncPolicy.build(4, ms, [("a", "b")], "a", 0, {m: "127.0.0.1:1" for m in ms})
    v5 = SyncPolicy.build(5, [*ms, "c"], [("a", "b"), ("b", "c")], "a", 0,
                          {m: "127.0.0.1:1" for m in [*ms, "c"]})
    shares = Shares("b", per_member=8, global_batch=30)
    assert shares.shard(5, v3).size == 15  # no speeds yet: an even split
    assert shares.samples(5, lambda: None) == 15  # the shard the script read, not a new one
    shares.committed(v3.members, torch.tensor([1.0, 2.0]))
    # A newer policy of the same members (a re-chunk, a new tree) keeps the speeds' layout;
    # one of other members does not: its step is split evenly.
    assert shares.shard(6, v3).size == 20 and shares.shard(6, v4).size == 20
    assert shares.shard(6, v5).size == 10
    shares.committed(None, torch.tensor([1.0, 2.0]))  # a round of members we do not know
    assert shares.shard(6, v3).size == 15
    shares.committed(v3.members, torch.tensor([1.0, 2.0]))
    shares.forget()  # a restored state: speeds from before it count for nothing
    assert shares.shard(6, v3).size == 15
    assert shares.slot(v3) == 1 and Shares("b", 8, None).slot(v3) is None
    shares.began(10.0, 4)  # the first update: nothing to time yet
    shares.ended(11.0)
    shares.began(13.0, 4)  # 4 samples in 2 s
    assert shares.speed == 2.0


def test_members_that_heard_a_new_policy_and_one_that_did_not_yet_split_the_step_alike(
        ) -> None:
    """A policy of the same members published a lead ahead reaches the members' pollers at
    different moments: one reads its shard of that step under the newer policy, another under
    the older. Both committed the last round together, so their shards must still tile the
    global batch (they overlapped when the speeds were keyed by the policy version)."""
    ms = ["a", "b", "c"]
    addrs = {m: "127.0.0.1:1" for m in ms}
    old = SyncPolicy.build(7, ms, [("a", "b"), ("b", "c")], "b", 0, addrs)
    new = SyncPolicy.build(8, ms, [("a", "b"), ("a", "c")], "a", 40, addrs)
    speeds = torch.tensor([3.0, 1.0, 2.0])
    heard = {"a": new, "b": old, "c": new}  # b's poller has not fetched v8 yet
    shards = []
    for me, pub in heard.items():
        shares = Shares(me, per_member=8, global_batch=48)
        shares.committed(old.members, speeds)
        shards.append(shares.shard(40, pub))
    assert [s.start for s in shards] == [0, shards[0].size, shards[0].size + shards[1].size]
    assert sum(s.size for s in shards) == 48 and shards[0].size > shards[2].size > shards[1].size


def test_the_optimizer_step_is_timed_apart_for_the_stall_account() -> None:
    """``take_step_s`` returns the time spent in ``step()`` since it was last read, so one
    ``update()`` can report the framework's cost apart from the optimizer's."""
    clock = FakeClock()
    m = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    st = Stepper(m, opt, clock=clock, grad_transform=lambda ps: clock.advance(0.25))
    assert st.take_step_s() == 0.0
    for _ in range(2):
        m(torch.randn(3, 4)).sum().backward()
        st.apply(st.gather(samples=1).clone())
    clock.advance(5.0)  # time outside step() is not the optimizer's
    assert st.take_step_s() == pytest.approx(0.5) and st.take_step_s() == 0.0
