"""The DDP path (:mod:`chaos_edge.ddp`): a plain DDP script, changed in the documented lines,
trains on real nodes through a join, a leave, a kill -9 and a SIGSTOP, and every member holds
the same state (model, BatchNorm buffers, momentum, LR schedule) at every common step.
"""

from __future__ import annotations

import sys
from typing import Any

import pytest
import torch

from chaos_edge import ddp
from chaosctl.client import call_once
from tests.training._run import PACE_S, Run

pytestmark = pytest.mark.timeout(180)


def start(r: Run, node: str, *extra: str) -> None:
    argv = [sys.executable, "-m", "chaos_edge.examples.ddp_mlp", "--steps", "100000",
            "--sleep", str(PACE_S), "--record", str(r.out / f"{node}.jsonl"), *extra]
    call_once(r.c.socket_of(node), "join", {"neighbors": [], "command": argv}, timeout=5)


def test_a_ddp_script_trains_through_join_leave_kill_and_freeze(run: Any) -> None:
    r = run(3)
    n1, n2, n3 = r.c.node_ids
    r.through_faults(lambda n: start(r, n))
    leave = [e for e in r.events("scale-in") if e["node"] == n2][-1]
    assert leave["reason"] == "leave"
    # The leave ended the script at its next forward pass, with exit status 0.
    assert "worker exited with 0" in (r.c.workdir / f"{n2}.log").read_text()
    outs = {e["node"] for e in r.events("scale-out")}
    assert {n1, n2, n3} <= outs
    # n3 joined at the cluster's step, not at 0: its first record is well past 20.
    assert r.records(n3)[0]["step"] > 20
    assert r.assert_consistent() > 40
    r.assert_loss_falls(n1)


@pytest.mark.parametrize(("build", "message"), [
    (lambda: ddp.DistributedDataParallel(torch.nn.Linear(2, 2), process_group=None),
     "process_group: Chaos forms the group of members itself"),
    (lambda: ddp.DistributedDataParallel(ddp.DistributedDataParallel(torch.nn.Linear(2, 2))),
     "the module is already wrapped in DistributedDataParallel"),
    (lambda: ddp.DistributedDataParallel(torch.nn.DataParallel(torch.nn.Linear(2, 2))),
     "the module is already wrapped in DataParallel"),
])
def test_a_wrong_wrapping_is_refused_in_one_line(build: Any, message: str) -> None:
    with pytest.raises(ValueError, match="^" + message.replace("(", r"\(")) as info:
        build()
    assert "\n" not in str(info.value)


def test_elastic_refuses_what_cannot_be_elastic_before_it_joins() -> None:
    plain = torch.nn.Linear(2, 2)
    opt = torch.optim.SGD(plain.parameters(), lr=0.1)
    with pytest.raises(ValueError, match=r"^wrap the model in chaos_edge\.ddp"):
        ddp.elastic(plain, opt)  # type: ignore[arg-type]
    model = ddp.DistributedDataParallel(torch.nn.Linear(2, 2))
    with pytest.raises(ValueError, match=r"^the optimizer steps parameters that are not"):
        ddp.elastic(model, opt)
    own = torch.optim.SGD(model.parameters(), lr=0.1)
    for key in ("scaler", "clip_grad_norm", "grad_transform"):
        with pytest.raises(ValueError, match=f"^{key}: on the DDP path the script"):
            ddp.elastic(model, own, **{key: 1.0})


def test_the_hook_hands_ddp_the_average_and_leaves_grad_as_ddp_does() -> None:
    """Without a cluster: the bucket protocol itself. A stand-in for the round doubles every
    gradient; after backward every bucket (and so ``.grad``) holds the doubled values, across
    several buckets, as DDP copies the hook's results back."""
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Linear(64, 64),
                              torch.nn.Linear(64, 2))
    ref = [torch.nn.Linear(64, 64), torch.nn.Linear(64, 64), torch.nn.Linear(64, 2)]
    seq = torch.nn.Sequential(*ref)
    seq.load_state_dict(net.state_dict())
    model = ddp.DistributedDataParallel(net, bucket_cap_mb=0.01)  # several buckets

    class Double:
        step = 0

        def update(self) -> None:
            for p in net.parameters():
                p.grad.mul_(2)  # type: ignore[union-attr]

    hook = ddp._Hook.__new__(ddp._Hook)
    hook.trainer, hook.model, hook.pending, hook.stepped_at = Double(), model, [], -1  # type: ignore[assignment]
    hook.overlap, hook.round = False, None  # the round itself is the stand-in's
    model.register_comm_hook(hook, ddp._reduce)
    x = torch.randn(5, 64)
    for _ in range(2):  # DDP rebuilds its buckets after the first iteration
        for p in (*net.parameters(), *seq.parameters()):
            p.grad = None
        model(x).sum().backward()
        seq(x).sum().backward()
        for a, b in zip(net.parameters(), seq.parameters(), strict=True):
            assert torch.equal(a.grad, 2 * b.grad)  # type: ignore[operator]
    assert not hook.pending
