"""Compressed all-reduce rounds (``policy.wire``): every member decodes the same bytes, the
results stay within the format's error of the exact average, an exact tail stays exact, and
int8 error feedback is applied once per applied result, however the round aborts.

Real PeerLinks and AllReducers on loopback threads (and one run of real processes); results
only, never timings.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator

import numpy as np
import pytest

from chaos_edge.dataplane import AllReducer, PeerLinks, RoundAborted, SyncPolicy
from chaos_edge.dataplane.chunkwire import auto_chunk_elems
from chaos_edge.dataplane.codec import INT8_BLOCK
from tests.dataplane._cluster import Cluster
from tests.dataplane.conftest import FOUR, make_mesh

pytestmark = pytest.mark.timeout(90)
TREES = {
    "star": ([("a", "b"), ("a", "c"), ("a", "d")], "a"),
    "end": ([("a", "b"), ("b", "c"), ("c", "d")], "a"),
}
CHUNK = 4 * INT8_BLOCK  # one int8 block per chunk: blocks line up with the whole vector's
N = 20_001  # the last chunk is short, and so is its last int8 block
#: Relative error of one encoding (half an ulp), and how many encodings a value meets at most
#: on four nodes: one per hop up a chain of four, one at the root.
EPS = {"fp16": 2.0**-11, "bf16": 2.0**-8}
HOPS = 4


def _grads(seed: int, n: int = N) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {k: rng.standard_normal(n).astype(np.float32) * (i + 1) for i, k in enumerate(FOUR)}


def _reducers(links: dict[str, PeerLinks]) -> dict[str, AllReducer]:
    return {n: AllReducer(lk, chunk_bytes=CHUNK, ring=2, timeout=20) for n, lk in links.items()}


def _run(reducers: dict[str, AllReducer], grads: dict[str, np.ndarray], samples: dict[str, int],
         step: int, policy: SyncPolicy, attempt: int = 0, lossy: int | None = None,
         hook: Callable[[], None] | None = None) -> dict[str, object]:
    """One round on every node at once: its values (a copy), or its RoundAborted."""
    results: dict[str, object] = {}

    def run(node: str) -> None:
        try:
            res = reducers[node].allreduce(grads[node], samples[node], step=step, policy=policy,
                                           attempt=attempt, lossy=lossy)
            results[node] = np.array(res.values, copy=True)
        except RoundAborted as exc:
            results[node] = exc

    threads = [threading.Thread(target=run, args=(n,)) for n in reducers]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return results


def _exact(grads: dict[str, np.ndarray], samples: dict[str, int]) -> tuple[np.ndarray, ...]:
    """The float64 average, and ``sum |s x| / total``: a bound on every partial sum."""
    total = sum(samples.values())
    acc = sum(grads[k].astype(np.float64) * samples[k] for k in FOUR)
    mag = sum(np.abs(grads[k].astype(np.float64)) * samples[k] for k in FOUR)
    return np.asarray(acc) / total, np.asarray(mag) / total


def _bound(wire: str, mag: np.ndarray) -> np.ndarray:
    """The format's error after ``HOPS + 1`` encodings (int8: a step is a block's max-abs
    over 127, and error feedback may carry half a step of the last round on top)."""
    if wire == "int8":
        pad = -mag.size % INT8_BLOCK
        peak = np.pad(mag, (0, pad)).reshape(-1, INT8_BLOCK).max(1)
        step = np.repeat(peak, INT8_BLOCK)[: mag.size] / 127
        return (HOPS + 1) * step + 1e-6 * mag
    return (HOPS + 1) * EPS[wire] * mag + 1e-6 * mag


@pytest.fixture
def two_meshes() -> Iterator[tuple[dict[str, PeerLinks], dict[str, PeerLinks]]]:
    """A mesh for the faulty run and one for the undisturbed reference."""
    made = [make_mesh()]
    try:
        made.append(make_mesh())
        yield made[0], made[1]
    finally:
        for links in made:
            for lk in links.values():
                lk.close()


@pytest.mark.parametrize("tree", list(TREES))
@pytest.mark.parametrize("wire", ["fp16", "bf16", "int8"])
def test_compressed_rounds_are_bit_identical_and_within_the_format_bound(
    mesh: dict[str, PeerLinks], tree: str, wire: str,
) -> None:
    reducers = _reducers(mesh)
    edges, root = TREES[tree]
    policy = SyncPolicy.build(1, FOUR, edges, root, wire=wire)
    samples = {"a": 3, "b": 1, "c": 0, "d": 5}
    for step in range(3):  # int8: later rounds carry error feedback
        grads = _grads(step)
        kept = {k: g.copy() for k, g in grads.items()}
        res = _run(reducers, grads, samples, step, policy)
        values = [res[k] for k in FOUR]
        assert all(isinstance(v, np.ndarray) for v in values), res
        first = values[0]
        assert isinstance(first, np.ndarray)
        for v in values[1:]:
            np.testing.assert_array_equal(v, first)  # bit-identical on every member
        want, mag = _exact(grads, samples)
        err = np.abs(first.astype(np.float64) - want)
        assert np.all(err <= _bound(wire, mag)), float(np.max(err / (_bound(wire, mag))))
        assert np.any(first != want.astype(np.float32))  # it was compressed
        assert all(np.array_equal(grads[k], kept[k]) for k in FOUR)  # inputs untouched


@pytest.mark.parametrize("wire", ["bf16", "int8"])
def test_the_exact_tail_matches_an_fp32_round_bit_for_bit(
    mesh: dict[str, PeerLinks], wire: str,
) -> None:
    reducers = _reducers(mesh)
    edges, root = TREES["end"]
    samples = {"a": 2, "b": 1, "c": 1, "d": 3}
    grads = _grads(11)
    lossy = N - 5_003  # the boundary falls inside a chunk
    plain = _run(reducers, grads, samples, 0, SyncPolicy.build(1, FOUR, edges, root))
    packed = _run(reducers, grads, samples, 1, SyncPolicy.build(1, FOUR, edges, root, wire=wire),
                  lossy=lossy)
    for k in FOUR:
        p, q = plain[k], packed[k]
        assert isinstance(p, np.ndarray) and isinstance(q, np.ndarray)
        np.testing.assert_array_equal(q[lossy:], p[lossy:])
        assert not np.array_equal(q[:lossy], p[:lossy])


def _residuals(reducers: dict[str, AllReducer]) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    out = {}
    for n, r in reducers.items():
        fb = r._feedback  # the seam: what each node will add back next round
        assert fb.up is not None and fb.root is not None
        out[n] = (fb.up.residual.copy(), fb.root.residual.copy())
    return out


def _same_residuals(x: dict[str, tuple[np.ndarray, ...]], y: dict[str, tuple[np.ndarray, ...]]
                    ) -> None:
    for n in FOUR:
        for a, b in zip(x[n], y[n], strict=True):
            np.testing.assert_array_equal(a, b)


def test_an_aborted_and_rerun_int8_round_applies_error_feedback_once(
    two_meshes: tuple[dict[str, PeerLinks], dict[str, PeerLinks]],
) -> None:
    # The reference runs steps 0..2 undisturbed. The faulty cluster's step 1 is superseded
    # while chunks are in flight (every node has staged part of its residual), then agreed and
    # rerun under v2: it must send exactly what the reference sent, so every later result and
    # residual is bit-identical to the reference's.
    faulty, ref = _reducers(two_meshes[0]), _reducers(two_meshes[1])
    edges, root = TREES["end"]
    v1 = SyncPolicy.build(1, FOUR, edges, root, wire="int8")
    v2 = SyncPolicy.build(2, FOUR, edges, root, wire="int8")
    samples = dict.fromkeys(FOUR, 2)
    grads = [_grads(20 + s) for s in range(3)]
    want = [_run(ref, grads[s], samples, s, v1) for s in range(3)]
    fired = threading.Event()

    def hook(event: str, index: int) -> None:
        if event == "reduce" and index == 2 and not fired.is_set():
            fired.set()
            faulty["b"].supersede(2, 1)

    assert not any(isinstance(v, RoundAborted) for v in _run(faulty, grads[0], samples, 0, v1)
                   .values())
    faulty["d"].fault_hook = hook
    aborted = _run(faulty, grads[1], samples, 1, v1)
    assert fired.is_set() and all(isinstance(v, RoundAborted) for v in aborted.values())
    assert all(v.result is None for v in aborted.values() if isinstance(v, RoundAborted))
    assert any(r._feedback.staged is None for r in faulty.values())  # discarded on abort
    decisions = _agree(faulty, v2, {n: (0, False) for n in FOUR})
    assert {d.step for d in decisions.values()} == {0}
    for s in (1, 2):
        got = _run(faulty, grads[s], samples, s, v2)
        for n in FOUR:
            np.testing.assert_array_equal(got[n], want[s][n])
    _same_residuals(_residuals(faulty), _residuals(ref))


def _agree(reducers: dict[str, AllReducer], policy: SyncPolicy,
           state: dict[str, tuple[int, bool]]) -> dict[str, object]:
    """Every node opens ``policy``'s epoch: ``state`` is (committed step, holds a result)."""
    out: dict[str, object] = {}

    def run(n: str) -> None:
        committed, holds = state[n]
        out[n] = reducers[n].agree(policy=policy, committed=committed, holds=holds)

    threads = [threading.Thread(target=run, args=(n,)) for n in reducers]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert set(out) == set(reducers), "an agreement did not finish"
    return out


def test_uncertain_nodes_commit_their_staged_feedback_when_the_agreement_applies_the_result(
    two_meshes: tuple[dict[str, PeerLinks], dict[str, PeerLinks]],
) -> None:
    # The root b commits step 1, sends COMMIT to its first child and cuts its link to the
    # other: that subtree (c, d) holds the result without the COMMIT. The agreement makes them
    # apply it, and with it the residuals they staged; step 2 is then bit-identical to the
    # undisturbed reference.
    links = two_meshes[0]
    faulty, ref = _reducers(links), _reducers(two_meshes[1])
    edges = [("a", "b"), ("b", "c"), ("c", "d")]
    v1 = SyncPolicy.build(1, FOUR, edges, "b", wire="int8")
    v2 = SyncPolicy.build(2, FOUR, edges, "b", wire="int8")
    first, cut = v1.children("b")
    assert (first, cut) == ("a", "c")
    samples = {"a": 1, "b": 2, "c": 3, "d": 4}
    grads = [_grads(40 + s) for s in range(3)]
    want = [_run(ref, grads[s], samples, s, v1) for s in range(3)]
    _run(faulty, grads[0], samples, 0, v1)

    def hook(event: str, index: int) -> None:
        if event == "commit" and index == 0:
            links["b"].disconnect(cut, "test cut after the first COMMIT")

    faulty["b"].fault_hook = hook
    got = _run(faulty, grads[1], samples, 1, v1)
    faulty["b"].fault_hook = None
    assert isinstance(got["a"], np.ndarray) and isinstance(got["b"], np.ndarray), got
    for n in ("c", "d"):
        held = got[n]
        assert isinstance(held, RoundAborted) and held.result is not None, held
        np.testing.assert_array_equal(held.result, want[1][n])
        assert faulty[n]._feedback.staged == (1, 0, 1)
    links["b"].connect_to(cut, *links[cut].address)
    assert links[cut].wait_connected(["b"], 5)
    state = {n: (1, False) if isinstance(got[n], np.ndarray) else (0, True) for n in FOUR}
    decisions = _agree(faulty, v2, state)
    assert {d.step for d in decisions.values()} == {1}  # the uncertain apply what they hold
    assert all(r._feedback.staged is None for r in faulty.values())
    got = _run(faulty, grads[2], samples, 2, v2)
    for n in FOUR:
        np.testing.assert_array_equal(got[n], want[2][n])
    _same_residuals(_residuals(faulty), _residuals(ref))


# Four spawned processes, each importing torch for bf16: slow on a loaded 2-core box.
@pytest.mark.timeout(240)
def test_real_processes_hold_bit_identical_int8_and_bf16_results(
    cluster: Callable[..., Cluster],
) -> None:
    ids = ["n0", "n1", "n2", "n3"]
    c = cluster(ids)
    chain = [("n0", "n1"), ("n1", "n2"), ("n2", "n3")]
    c.connect(chain)
    for step, wire in enumerate(["int8", "bf16", "int8"]):
        policy = SyncPolicy.build(1, ids, chain, "n1", wire=wire)
        plan = {n: (policy.to_json(), 7 * step + i, i + 1) for i, n in enumerate(ids)}
        replies = c.run(plan, step, 300_007, timeout=60.0)
        assert {r[0] for r in replies.values()} == {"ok"}, replies
        assert len({r[1] for r in replies.values()}) == 1  # one digest: bit-identical


def test_automatic_chunks_are_sized_by_the_vector() -> None:
    mib = 1 << 20
    assert auto_chunk_elems(1000) * 4 == mib  # small vectors: the 1 MiB floor
    assert auto_chunk_elems(25_000_000) * 4 == 8 * mib  # 100 MB: about 12 chunks
    assert auto_chunk_elems(10**9) * 4 == 16 * mib  # the ceiling
    for size in (5_000_001, 25_000_000, 40_000_000):
        assert (auto_chunk_elems(size) * 4) % (64 << 10) == 0


@pytest.mark.parametrize("wire", ["fp32", "int8"])
def test_automatically_chunked_rounds_are_exact_and_bit_identical(
    mesh: dict[str, PeerLinks], wire: str,
) -> None:
    reducers = {n: AllReducer(lk, chunk_bytes=None, timeout=30) for n, lk in mesh.items()}
    n = 5_000_001  # 20 MB: 12 chunks of 1.625 MiB, the last one short
    rng = np.random.default_rng(3)
    grads = {k: (rng.integers(-1000, 1000, n) * 2.0**-4).astype(np.float32) for k in FOUR}
    samples = {"a": 1, "b": 2, "c": 1, "d": 4}
    edges, root = TREES["end"]
    res = _run(reducers, grads, samples, 0, SyncPolicy.build(1, FOUR, edges, root, wire=wire))
    first = res["a"]
    assert isinstance(first, np.ndarray), res
    for k in FOUR[1:]:
        np.testing.assert_array_equal(res[k], first)
    want, _ = _exact(grads, samples)
    if wire == "fp32":  # multiples of 1/16 over 8 samples: exact in float32
        np.testing.assert_array_equal(first, want.astype(np.float32))
    assert reducers["a"]._plans.get(wire, n, n).nchunks == 12
