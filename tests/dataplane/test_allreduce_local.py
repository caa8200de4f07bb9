"""All-reduce in one process (threads): torch buffers, tags, timeouts, argument checks."""

from __future__ import annotations

import socket
import threading
import time

import numpy as np
import pytest
import torch

from chaos_edge.dataplane import AllReducer, DataPlaneError, RoundAborted, SyncPolicy
from chaos_edge.dataplane.frames import FrameHeader, Kind
from chaos_edge.dataplane.tensors import digest, flatten_grads, unflatten_into
from tests.dataplane.conftest import IDS

pytestmark = pytest.mark.timeout(60)


def _model(seed: int) -> torch.nn.Module:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(7, 5), torch.nn.ReLU(), torch.nn.Linear(5, 3))
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(16, 7, generator=gen)
    model(x).pow(2).mean().backward()
    return model


def test_torch_gradients_are_averaged_by_samples_and_bit_identical(
    trio: dict[str, AllReducer],
) -> None:
    policy = SyncPolicy.build(1, IDS, [("a", "b"), ("b", "c")], "b")
    models = {n: _model(i) for i, n in enumerate(IDS)}
    samples = {"a": 1, "b": 4, "c": 11}
    flats = {n: flatten_grads(m.parameters()) for n, m in models.items()}
    results = {}

    def run(node: str) -> None:
        results[node] = trio[node].allreduce(flats[node], samples[node], step=5, policy=policy)

    threads = [threading.Thread(target=run, args=(n,)) for n in IDS]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    want = sum(flats[n].double() * samples[n] for n in IDS) / 16
    assert {digest(r.values) for r in results.values()} == {digest(results["b"].values)}
    for node in IDS:
        values = results[node].values
        assert isinstance(values, torch.Tensor) and results[node].total_samples == 16
        torch.testing.assert_close(values.double(), want, rtol=1e-6, atol=1e-7)
        params = list(models[node].parameters())
        unflatten_into(values, params)
        assert torch.equal(flatten_grads(params), values)


def test_single_node_policy_tags_and_input_untouched(trio: dict[str, AllReducer]) -> None:
    solo = trio["solo"]
    policy = SyncPolicy.build(1, ["solo"], [], "solo")
    grad = np.arange(10_000, dtype=np.float32)
    before = grad.copy()
    res = solo.allreduce(grad, 3, step=0, policy=policy)
    assert np.array_equal(grad, before)
    assert np.array_equal(res.values, (grad * np.float32(3)) / np.float32(3))
    with pytest.raises(DataPlaneError, match="not newer"):
        solo.allreduce(grad, 3, step=0, policy=policy)  # same tag: a rerun needs a new version
    assert (
        solo.allreduce(grad, 3, step=0, policy=SyncPolicy.build(2, ["solo"], [], "solo")).step == 0
    )
    with pytest.raises(DataPlaneError, match="float32"):
        solo.allreduce(grad.astype(np.float64), 3, step=9, policy=policy)
    with pytest.raises(DataPlaneError):
        solo.allreduce(grad, -1, step=9, policy=policy)


def test_unflatten_rejects_a_wrong_size() -> None:
    params = list(_model(0).parameters())
    with pytest.raises(ValueError, match="elements"):
        unflatten_into(torch.zeros(3), params)


def test_a_stalled_neighbour_times_out_instead_of_hanging(
    trio: dict[str, AllReducer], mute: socket.socket
) -> None:
    """A peer that authenticates and then never sends (like a SIGSTOPped process)."""
    policy = SyncPolicy.build(5, ["solo", "mute"], [("mute", "solo")], "solo")
    with pytest.raises(RoundAborted, match="timed out") as info:
        trio["solo"].allreduce(np.ones(100_000, np.float32), 1, step=1, policy=policy,
                               timeout=1.0)
    assert info.value.step == 1 and info.value.policy_version == 5


def test_a_late_joiner_of_an_abandoned_epoch_is_told_at_once(
        trio: dict[str, AllReducer]) -> None:
    """b and c are in attempt 1 when a opens attempt 0 (b's abort of attempt 0 never reached
    it): b answers a's stale frame with an ABORT, so a moves on instead of timing out."""
    policy = SyncPolicy.build(7, IDS, [("a", "b"), ("b", "c")], "b")
    decisions: dict[str, object] = {}

    def agree(node: str) -> None:
        decisions[node] = trio[node].agree(policy=policy, committed=3, holds=False, attempt=1,
                                           timeout=20.0)

    threads = [threading.Thread(target=agree, args=(n,)) for n in ("b", "c")]
    for t in threads:
        t.start()
    while trio["b"].newest_epoch() != (7, 1):
        time.sleep(0.01)
    with pytest.raises(RoundAborted) as info:
        trio["a"].agree(policy=policy, committed=3, holds=False, attempt=0, timeout=15.0)
    assert "b has left phase (7, 0, -1)" in info.value.reason
    agree("a")  # now a joins the attempt the others are in, and all three decide
    for t in threads:
        t.join(20)
    assert decisions["a"] == decisions["b"] == decisions["c"]


def test_a_child_commits_even_if_the_root_closes_right_after_commit(
        trio: dict[str, AllReducer]) -> None:
    """A root that finished training closes its links as soon as it has committed; the
    COMMIT is in the child's socket ahead of the close, so the child must commit too."""
    policy = SyncPolicy.build(3, ["a", "b"], [("a", "b")], "a")
    grad = np.arange(50_000, dtype=np.float32)
    for step in range(1, 21):
        child: dict[str, object] = {}

        def run_child(step: int = step, child: dict[str, object] = child) -> None:
            try:
                child["res"] = trio["b"].allreduce(grad, 1, step=step, policy=policy)
            except RoundAborted as exc:
                child["res"] = exc

        t = threading.Thread(target=run_child)
        t.start()
        trio["a"].allreduce(grad, 1, step=step, policy=policy)
        trio["a"].links.disconnect("b", reason="finished training")
        t.join(20)
        assert not isinstance(child["res"], RoundAborted), child["res"]
        # Reconnect only once b has seen the close, so the next round has one clean link.
        while trio["b"].links.state("a") == "up":
            time.sleep(0.01)
        trio["b"].links.allow("a")
        trio["a"].links.connect_to("b", *trio["b"].links.address)
        assert trio["b"].links.wait_connected(["a"], 5)


class _Inbox:
    """A FrameHandler that keeps the STATE_MANIFEST payloads it is given."""

    def __init__(self) -> None:
        self.got = threading.Event()

    def buffer_for(self, peer: str, h: FrameHeader, is_open: object) -> memoryview:
        return memoryview(bytearray(h.length))

    def on_frame(self, peer: str, h: FrameHeader, payload: memoryview) -> None:
        if bytes(payload) == b"offer":
            self.got.set()


def test_a_control_frame_of_an_unopened_phase_does_not_block_the_link(
        trio: dict[str, AllReducer]) -> None:
    """A source opens the agreement with a new node (its AGREE_UP goes out first) and then
    sends the state offer on the same link. The new node can only open the agreement once
    it has the state, so the offer must get past the early AGREE_UP (it used to wait behind
    it for ever)."""
    policy = SyncPolicy.build(9, ["a", "b"], [("a", "b")], "b")
    inbox = _Inbox()
    trio["b"].links.register_handler([Kind.STATE_MANIFEST], inbox)
    decisions: dict[str, object] = {}

    def agree(node: str) -> None:
        decisions[node] = trio[node].agree(policy=policy, committed=4, holds=False, attempt=0,
                                           timeout=20.0)

    source = threading.Thread(target=agree, args=("a",))
    source.start()
    while trio["b"].newest_epoch() != (9, 0):
        time.sleep(0.01)  # b's reader has a's AGREE_UP of the phase b has not opened
    trio["a"].links.send("b", FrameHeader(Kind.STATE_MANIFEST, 0, 0, 0, 0, 5), b"offer")
    assert inbox.got.wait(5.0), "the offer waited behind the early AGREE_UP"
    agree("b")  # the held AGREE_UP is replayed: both decide at once
    source.join(20)
    assert decisions["a"] == decisions["b"]
