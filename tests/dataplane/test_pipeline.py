"""The pipelined data path: queued sends, any-thread reduction, many chunks, every tree shape.

These run real PeerLinks and AllReducers on loopback threads of one process. They check
results and ordering only, never timings.
"""

from __future__ import annotations

import functools
import socket
import threading
import time
from collections.abc import Callable

import numpy as np
import pytest

from chaos_edge.dataplane import AllReducer, PeerGone, PeerLinks, RoundAborted, SyncPolicy
from chaos_edge.dataplane.frames import FrameHeader, Kind, decode_header, recv_exact_into
from chaos_edge.dataplane.sockets import send_frame
from tests.dataplane._cluster import Cluster, expected_digest
from tests.dataplane.conftest import FOUR

pytestmark = pytest.mark.timeout(90)
TREES = {
    "star": ([("a", "b"), ("a", "c"), ("a", "d")], "a"),
    "centre": ([("a", "b"), ("b", "c"), ("c", "d")], "b"),
    "end": ([("a", "b"), ("b", "c"), ("c", "d")], "a"),
}


def _run_all(reducers: dict[str, AllReducer], grads: dict[str, np.ndarray],
             samples: dict[str, int], step: int, policy: SyncPolicy,
             outs: dict[str, np.ndarray] | None = None) -> dict[str, object]:
    results: dict[str, object] = {}

    def run(node: str) -> None:
        try:
            out = None if outs is None else outs[node]
            results[node] = reducers[node].allreduce(grads[node], samples[node], step=step,
                                                     policy=policy, out=out)
        except RoundAborted as exc:
            results[node] = exc

    threads = [threading.Thread(target=run, args=(n,)) for n in reducers]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return results


@pytest.mark.parametrize("tree", list(TREES))
@pytest.mark.parametrize("weights", ["ones", "mixed"])
def test_many_chunks_every_tree_exact_and_bit_identical(
    mesh: dict[str, PeerLinks], tree: str, weights: str,
) -> None:
    # 4 KiB chunks and a ring of 2: hundreds of chunks, so the readers, the writers and the
    # round threads all take turns at reducing, and back-pressure and the scratch ring both
    # fill up. One sample each is the fast path (x * 1 is x, a leaf sends its input as it is).
    reducers = {n: AllReducer(lk, chunk_bytes=4096, ring=2, timeout=30) for n, lk in mesh.items()}
    n = 150_001  # not a multiple of the chunk: the last chunk is short
    rng = np.random.default_rng(7)
    grads = {k: (rng.integers(-1000, 1000, n) * 2.0**-4).astype(np.float32) for k in FOUR}
    samples = dict.fromkeys(FOUR, 1) if weights == "ones" else {"a": 3, "b": 1, "c": 0, "d": 5}
    edges, root = TREES[tree]
    policy = SyncPolicy.build(1, FOUR, edges, root)
    outs = {k: np.empty(n, np.float32) for k in FOUR}
    total = sum(samples.values())
    acc = np.zeros(n, np.float64)
    for k in FOUR:
        acc += grads[k].astype(np.float64) * samples[k]
    want = (acc / total).astype(np.float32)
    kept = {k: g.copy() for k, g in grads.items()}
    for step in range(3):  # reused out buffers and pooled rings across rounds
        res = _run_all(reducers, grads, samples, step, policy, outs)
        for k in FOUR:
            r = res[k]
            assert not isinstance(r, RoundAborted), r
            np.testing.assert_array_equal(outs[k], want)  # exact: multiples of 1/16
        assert all(np.array_equal(grads[k], kept[k]) for k in FOUR)  # inputs untouched


def test_a_cut_link_mid_stream_aborts_and_the_rerun_is_exact(mesh: dict[str, PeerLinks]) -> None:
    # d (a leaf) loses its link while chunks are queued and in flight; everyone aborts, and
    # the rerun under a newer policy without d sees nothing of the dead round.
    reducers = {n: AllReducer(lk, chunk_bytes=4096, ring=2, timeout=20) for n, lk in mesh.items()}
    n = 400_000
    grads = {k: np.full(n, i + 1, np.float32) for i, k in enumerate(FOUR)}
    fired = threading.Event()

    def hook(event: str, index: int) -> None:
        if event == "reduce" and index == 20 and not fired.is_set():
            fired.set()
            mesh["d"].disconnect("c", "test cut")

    reducers["d"].fault_hook = hook
    edges, root = TREES["end"]
    res = _run_all(reducers, grads, dict.fromkeys(FOUR, 1), 0, SyncPolicy.build(1, FOUR, edges,
                                                                                  root))
    assert fired.is_set() and all(isinstance(r, RoundAborted) for r in res.values())
    three = FOUR[:3]
    policy = SyncPolicy.build(2, three, [("a", "b"), ("b", "c")], "b")
    res = _run_all({k: reducers[k] for k in three}, grads, dict.fromkeys(three, 1), 0, policy)
    for k in three:
        r = res[k]
        assert not isinstance(r, RoundAborted), r
        np.testing.assert_array_equal(r.values, np.full(n, 2.0, np.float32))  # type: ignore[attr-defined]


@pytest.mark.parametrize("tree", ["star", "centre"])
def test_processes_many_small_chunks_stay_in_order(
    cluster: Callable[..., Cluster], tree: str,
) -> None:
    # Separate processes reduce on truly parallel threads (no shared GIL): about a thousand
    # 4 KiB chunks per round, each reduced by whichever thread got to it first, must still
    # leave every node in chunk order (a parent aborts on any chunk out of order).
    ids = ["n0", "n1", "n2", "n3"]
    edges, root = TREES[tree]
    names = dict(zip(FOUR, ids, strict=True))
    edges = [(names[a], names[b]) for a, b in edges]
    c = cluster(ids, chunk_bytes=4096)
    c.connect(edges)
    policy = SyncPolicy.build(1, ids, edges, names[root])
    n = 1_000_003
    for step, samples in enumerate([[1, 1, 1, 1], [2, 1, 0, 5], [1, 1, 1, 1]]):
        plan = {node: (policy.to_json(), 10 * step + i, samples[i]) for i, node in enumerate(ids)}
        replies = c.run(plan, step, n, timeout=40.0)
        want = expected_digest([(seed, s) for _, seed, s in plan.values()], n)
        assert {r[0] for r in replies.values()} == {"ok"}, replies
        assert {r[1] for r in replies.values()} == {want}


def _record(into: list[tuple[int, bool]], i: int, ok: bool) -> None:
    into.append((i, ok))


class _Collect:
    """Frame handler that keeps every payload, in arrival order."""

    def __init__(self) -> None:
        self.frames: list[tuple[int, bytes]] = []
        self.cond = threading.Condition()

    def buffer_for(self, peer: str, header: FrameHeader, is_open: object) -> memoryview:
        return memoryview(bytearray(header.length))

    def on_frame(self, peer: str, header: FrameHeader, payload: memoryview) -> None:
        with self.cond:
            self.frames.append((header.chunk, bytes(payload)))
            self.cond.notify_all()


def test_posted_and_sent_frames_arrive_whole_and_in_order(mesh: dict[str, PeerLinks]) -> None:
    sink = _Collect()
    mesh["b"].register_handler([Kind.STATE_DATA], sink)
    done: list[tuple[int, bool]] = []
    big = np.arange(300_000, dtype=np.uint8)  # larger than the socket takes without blocking
    for i in range(40):
        payload = memoryview(big.data)[: 1000 + 7000 * i]
        header = FrameHeader(Kind.STATE_DATA, 0, 0, 0, i, len(payload))
        if i % 10 == 9:  # a synchronous send queues behind the posted frames
            mesh["a"].send("b", header, payload, time.monotonic() + 10)
        else:
            mesh["a"].post("b", header, payload, time.monotonic() + 10,
                           done=functools.partial(_record, done, i))
    with sink.cond:
        assert sink.cond.wait_for(lambda: len(sink.frames) == 40, 20)
    assert [c for c, _ in sink.frames] == list(range(40))
    assert all(p == bytes(big[: 1000 + 7000 * c]) for c, p in sink.frames)
    assert sorted(done) == [(i, True) for i in range(40) if i % 10 != 9]


def test_dropped_frames_say_so_and_a_closed_link_refuses(mesh: dict[str, PeerLinks]) -> None:
    results: list[bool] = []
    header = FrameHeader(Kind.STATE_DATA, 0, 0, 0, 0, 4)
    mesh["a"].post("b", header, b"abcd", None, live=lambda: False, done=results.append)
    deadline = time.monotonic() + 5
    while not results and time.monotonic() < deadline:
        time.sleep(0.01)
    assert results == [False]  # cancelled before it was written
    mesh["a"].disconnect("b")
    with pytest.raises(PeerGone):
        mesh["a"].post("b", header, b"abcd", None)
    with pytest.raises(PeerGone):
        mesh["a"].send("b", header, b"abcd", time.monotonic() + 1)


def test_send_frame_survives_partial_writes() -> None:
    # A tiny send buffer and a slow reader: sendmsg writes part of the header or payload.
    a, b = socket.socketpair()
    a.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    payload = bytes(range(256)) * 4000
    header = FrameHeader(Kind.STATE_DATA, 1, 2, 3, 4, len(payload))
    from chaos_edge.dataplane.frames import encode_header

    got: dict[str, object] = {}

    def read() -> None:
        head = memoryview(bytearray(40))
        time.sleep(0.2)
        recv_exact_into(b, head)
        got["header"] = decode_header(head)
        body = memoryview(bytearray(len(payload)))
        recv_exact_into(b, body)
        got["payload"] = bytes(body)

    t = threading.Thread(target=read)
    t.start()
    send_frame(a, encode_header(header), payload, time.monotonic() + 10, "b")
    t.join(10)
    a.close()
    b.close()
    assert got["header"] == header and got["payload"] == payload
