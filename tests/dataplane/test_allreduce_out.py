"""Caller-provided result buffers (``out=``), and exact results around chunk edges."""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import pytest
import torch

from chaos_edge.dataplane import AllReducer, DataPlaneError, SyncPolicy
from tests.dataplane._cluster import make_grad
from tests.dataplane.conftest import IDS

pytestmark = pytest.mark.timeout(60)
CHAIN = SyncPolicy.build(1, IDS, [("a", "b"), ("b", "c")], "b")


def _run_all(trio: dict[str, AllReducer], step: int, **per_node: dict[str, Any]) -> dict[str, Any]:
    """One round on a, b, c at once; ``per_node[arg][node]`` are allreduce arguments."""
    results: dict[str, Any] = {}

    def run(node: str) -> None:
        kwargs = {arg: values[node] for arg, values in per_node.items()}
        results[node] = trio[node].allreduce(step=step, policy=CHAIN, **kwargs)

    threads = [threading.Thread(target=run, args=(n,)) for n in IDS]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert set(results) == set(IDS)
    return results


def _expected(grads: dict[str, np.ndarray], samples: dict[str, int]) -> np.ndarray:
    acc = sum(grads[n].astype(np.float64) * samples[n] for n in IDS)
    return np.asarray(acc).astype(np.float32) / np.float32(sum(samples.values()))


@pytest.mark.parametrize("n", [1, 255, 256, 257, 40_000])
def test_results_are_exact_for_sizes_around_chunk_edges(
    trio: dict[str, AllReducer], n: int
) -> None:
    grads = {node: make_grad(i, n) for i, node in enumerate(IDS)}
    samples = {"a": 3, "b": 1, "c": 12}
    res = _run_all(trio, 1, grad=grads, samples=samples)
    want = _expected(grads, samples)
    for node in IDS:
        assert np.array_equal(res[node].values, want), node


def test_out_buffers_receive_the_result_and_can_be_reused(trio: dict[str, AllReducer]) -> None:
    outs = {node: np.full(5000, np.nan, np.float32) for node in IDS}
    for step, seed in ((1, 0), (2, 10)):  # the second round overwrites the first one's result
        grads = {node: make_grad(seed + i, 5000) for i, node in enumerate(IDS)}
        samples = {"a": 1, "b": 2, "c": 5}
        res = _run_all(trio, step, grad=grads, samples=samples, out=outs)
        want = _expected(grads, samples)
        for node in IDS:
            assert np.shares_memory(res[node].values, outs[node])
            assert np.array_equal(outs[node], want)
            assert np.array_equal(grads[node], make_grad(seed + IDS.index(node), 5000))


def test_torch_out_buffer_is_filled_in_place(trio: dict[str, AllReducer]) -> None:
    grads = {node: torch.from_numpy(make_grad(i, 3000)) for i, node in enumerate(IDS)}
    outs = {node: torch.zeros(3000) for node in IDS}
    res = _run_all(trio, 1, grad=grads, samples={n: 1 for n in IDS}, out=outs)
    want = _expected({n: g.numpy() for n, g in grads.items()}, {n: 1 for n in IDS})
    for node in IDS:
        values = res[node].values
        assert isinstance(values, torch.Tensor) and values.data_ptr() == outs[node].data_ptr()
        assert np.array_equal(outs[node].numpy(), want)


def test_bad_out_buffers_are_refused(trio: dict[str, AllReducer]) -> None:
    solo = trio["solo"]
    policy = SyncPolicy.build(1, ["solo"], [], "solo")
    grad = np.ones(100, np.float32)
    bad: list[Any] = [
        np.zeros(99, np.float32),  # wrong size
        np.zeros(100, np.float64),  # wrong dtype
        np.zeros(200, np.float32)[::2],  # not contiguous: a copy would be filled instead
        grad,  # the input itself
        np.zeros(100, np.float32).reshape(10, 10).T,  # Fortran order
        torch.zeros(200)[::2],
    ]
    read_only = np.zeros(100, np.float32)
    read_only.flags.writeable = False
    bad.append(read_only)
    for step, out in enumerate(bad):
        with pytest.raises(DataPlaneError):
            solo.allreduce(grad, 1, step=step, policy=policy, out=out)
    res = solo.allreduce(grad, 2, step=99, policy=policy, out=np.zeros((10, 10), np.float32))
    assert np.array_equal(res.values, grad)
