"""A round whose input is still being written (:class:`InputFeed`, the overlap of a backward
pass with its all-reduce): every chunk waits for its values, and the result is bit-identical
to the round run on the whole input, in fp32 and int8, whatever order the pieces come in.

Real PeerLinks and AllReducers on loopback threads; results only, never timings.
"""

from __future__ import annotations

import random
import threading
import time

import numpy as np
import pytest

from chaos_edge.dataplane import InputFeed, PeerLinks, SyncPolicy
from tests.dataplane.conftest import FOUR
from tests.dataplane.test_allreduce_wire import TREES, _grads, _reducers, _run, two_meshes

__all__ = ["two_meshes"]  # the fixture: one mesh for the whole-input rounds, one for the fed

pytestmark = pytest.mark.timeout(90)
N, LIMIT = 20_001, 15_000  # the last 5,001 values (buffers, flags) are in from the start


def _fed_round(reducers: dict, grads: dict[str, np.ndarray], samples: dict[str, int],
               step: int, policy: SyncPolicy, seed: int) -> dict[str, np.ndarray]:
    """The same round, each node's input written into a zeroed buffer in random pieces
    while the round runs; pieces ahead of the front wait for it."""
    results: dict[str, np.ndarray] = {}
    errors: list[BaseException] = []

    def run(node: str) -> None:
        buf = np.zeros(N, np.float32)
        buf[LIMIT:] = grads[node][LIMIT:]
        feed = InputFeed(LIMIT)
        rng = random.Random(f"{seed}-{node}")
        cuts = sorted(rng.sample(range(1, LIMIT), 9))
        pieces = list(zip([0, *cuts], [*cuts, LIMIT], strict=True))
        rng.shuffle(pieces)  # out of order: the front advances only over what is in

        def write() -> None:
            have: list[tuple[int, int]] = []
            for lo, hi in pieces:
                time.sleep(rng.random() * 0.01)
                buf[lo:hi] = grads[node][lo:hi]
                have.append((lo, hi))
                front = 0
                for a, b in sorted(have):
                    if a > front:
                        break
                    front = max(front, b)
                feed.advance(front)

        writer = threading.Thread(target=write)
        writer.start()
        try:
            res = reducers[node].allreduce(buf, samples[node], step=step, policy=policy,
                                           lossy=LIMIT, feed=feed)
            results[node] = np.array(res.values, copy=True)
        except BaseException as exc:
            errors.append(exc)
        writer.join()

    threads = [threading.Thread(target=run, args=(n,)) for n in FOUR]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    return results


@pytest.mark.parametrize("tree", list(TREES))
@pytest.mark.parametrize("wire", ["fp32", "int8"])
def test_a_fed_round_is_bit_identical_to_the_whole_input_round(
        two_meshes: tuple[dict[str, PeerLinks], dict[str, PeerLinks]], tree: str,
        wire: str) -> None:
    whole_r, fed_r = _reducers(two_meshes[0]), _reducers(two_meshes[1])
    edges, root = TREES[tree]
    samples = {"a": 3, "b": 1, "c": 2, "d": 5}
    policy = SyncPolicy.build(1, FOUR, edges, root, wire=wire)
    for step in range(3):  # int8: later rounds carry error feedback, the same in both
        grads = _grads(step, N)
        whole = _run(whole_r, grads, samples, step, policy, lossy=LIMIT)
        fed = _fed_round(fed_r, grads, samples, step, policy, seed=step)
        for node in FOUR:
            assert isinstance(whole[node], np.ndarray), whole[node]
            assert np.array_equal(fed[node], whole[node]), (step, node)


def test_a_feed_gates_each_chunk_on_its_values() -> None:
    feed = InputFeed(100)
    assert feed.covers(0) and not feed.covers(1)
    feed.advance(40)
    assert feed.covers(40) and not feed.covers(41)
    assert feed.covers(40) and not feed.complete.is_set()
    feed.advance(30)  # it only grows
    assert feed.upto == 40
    feed.advance(100)
    assert feed.covers(150) and feed.complete.is_set()  # values past the limit: in at once


def test_a_policy_chunk_size_is_used_unless_the_reducer_sets_its_own() -> None:
    from chaos_edge.dataplane.chunkwire import Plans, auto_chunk_elems

    size = 200_000  # 0.8 MB: by size, one chunk of 1 MiB
    assert Plans(None).get("fp32", size, size).chunk_elems == auto_chunk_elems(size)
    assert Plans(None).get("fp32", size, size).nchunks == 1
    assert Plans(None).get("fp32", size, size, 64).nchunks == 13  # 64 KiB chunks
    assert Plans(1024).get("fp32", size, size, 64).chunk_elems == 1024  # the worker's own
