"""The four scale-out strategies on one loopback cluster, the relay, the wire and the throttle."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from chaos_edge.dataplane import auth
from chaos_edge.replication import Neighbor
from chaos_edge.replication.errors import PlanError
from chaos_edge.replication.manifest import RAW_DTYPE, Entry, Manifest, block_digests
from chaos_edge.replication.transfer import (
    STRATEGIES,
    ScaleOutJob,
    Snapshot,
    StateServer,
    TokenBucket,
    run_strategy,
    serve,
)
from chaos_edge.replication.transfer.wire import HEADER_SIZE, Kind, ProtocolError, decode, encode

pytestmark = pytest.mark.timeout(120)

SECRET = b"strategy-test-secret"
BLOCK = 1 << 16
NODES = ["n0", "n1", "n2", "n3"]
# The new node's neighbours are n0 and n1; n2 and n3 are reached through them.
ROUTES = {"n0": ["n0"], "n1": ["n1"], "n2": ["n0", "n2"], "n3": ["n1", "n2", "n3"]}


def ident(node: str) -> auth.Identity:
    """Credentials of ``node`` in the test cluster."""
    return auth.Identity(node, "test", SECRET, auth.new_incarnation())


def synthetic(sizes: list[int], version: int = 3) -> Snapshot:
    """Random bytes laid out as raw segments of ``sizes``, with their manifest."""
    data = np.random.default_rng(5).integers(0, 256, sum(sizes), dtype=np.uint8).tobytes()
    entries, off = [], 0
    for i, n in enumerate(sizes):
        entries.append(Entry(f"t{i}", RAW_DTYPE, (n,), off, n))
        off += n
    manifest = Manifest(version, off, BLOCK, block_digests(data, BLOCK), tuple(entries))
    manifest.validate()
    return Snapshot.create(manifest, data)


@pytest.fixture
def cluster() -> Iterator[tuple[Snapshot, dict[str, StateServer]]]:
    """Four servers of one snapshot; each may relay from the others. Closed at the end."""
    snap = synthetic([3 * BLOCK + 17, 700, 5 * BLOCK, 2 * BLOCK + 5, 123_456])
    servers: dict[str, StateServer] = {}
    try:
        for n in NODES:
            servers[n] = serve(snap, ident(n), rate=lambda _p: 4e6)
        for s in servers.values():
            s.peers.update({n: x.address for n, x in servers.items()})
        yield snap, servers
    finally:
        for s in servers.values():
            s.close()


def job_for(
    snap: Snapshot, servers: dict[str, StateServer], tmp: Path, planner: str
) -> ScaleOutJob:
    """A scale-out of node ``new`` into the test cluster."""
    est = [Neighbor(n, 0.001, 1 / 4e6) for n in NODES]
    return ScaleOutJob(
        manifest=snap.manifest,
        me=ident("new"),
        neighbors=tuple(est[:2]),
        addresses={n: s.address for n, s in servers.items()},
        sources=tuple(est),
        routes=ROUTES,
        checkpoints={n: snap.data for n in NODES},
        workdir=tmp,
        planner=planner,
        restart_cmd=(sys.executable, "-c", "pass"),
    )


@pytest.mark.parametrize("name", sorted(STRATEGIES))
def test_every_strategy_produces_identical_bytes(cluster, tmp_path, name) -> None:
    snap, servers = cluster
    result = run_strategy(name, job_for(snap, servers, tmp_path, "chaos"))
    assert result.buffer == snap.data
    assert result.delay_s > 0 and result.strategy == name
    assert list(tmp_path.iterdir()) == []  # checkpoints are removed
    if name == "multi-source":
        # n2's and n3's shares came through the relays.
        assert servers["n0"].stats().bytes_relayed > 0 and servers["n2"].stats().bytes_relayed > 0
        assert result.fetch is not None and set(result.fetch.sources) == set(NODES)
    if name == "single":
        assert result.plan is not None and len([r for r in result.plan.ranges.values() if r]) == 1


@pytest.mark.parametrize("planner", ["chaos", "paper", "waterfill", "greedy"])
def test_chaos_strategy_takes_any_planner(cluster, tmp_path, planner) -> None:
    snap, servers = cluster
    result = run_strategy("chaos", job_for(snap, servers, tmp_path, planner))
    assert result.buffer == snap.data and result.plan is not None
    assert result.plan.planner == planner


def test_default_plan_cuts_through_tensors_and_blocks(
    cluster: tuple[Snapshot, dict[str, StateServer]], tmp_path: Path
) -> None:
    # Water-filling to the byte ignores tensor and block boundaries: the servers send any range
    # of the byte space and the fetch verifies a block split between two sources.
    snap, servers = cluster
    job = job_for(snap, servers, tmp_path, "chaos")
    assert job.planner == ScaleOutJob.__dataclass_fields__["planner"].default
    result = run_strategy("chaos", job)
    assert result.buffer == snap.data and result.plan is not None
    assert result.plan.planner == "chaos"
    starts = {e.offset for e in snap.manifest.entries}
    (first,) = result.plan.ranges["n0"]
    cut = first[0] + first[1]
    assert any(first[0] < o < cut for o in starts)  # crosses tensor boundaries
    assert cut % BLOCK and cut < snap.manifest.total_bytes  # splits a checksum block
    assert result.fetch is not None and result.fetch.refetched_blocks == []
    assert all(t.bytes > 0 for t in result.fetch.sources.values())


def test_unknown_strategy_is_a_plan_error(cluster, tmp_path) -> None:
    snap, servers = cluster
    with pytest.raises(PlanError, match="unknown strategy"):
        run_strategy("teleport", job_for(snap, servers, tmp_path, "chaos"))


def test_wire_refuses_bad_frames() -> None:
    head = encode(Kind.GET, 1, 10, 20)
    assert len(head) == HEADER_SIZE and decode(head).length == 20
    with pytest.raises(ProtocolError, match="over the limit"):
        encode(Kind.DATA, 1, 0, 1, 5 << 20)
    forged = bytearray(encode(Kind.GET, 1))
    forged[-4:] = (1 << 20).to_bytes(4, "big")  # a GET may carry no payload at all
    with pytest.raises(ProtocolError, match="over the limit"):
        decode(forged)
    with pytest.raises(ProtocolError, match="not a state-replication frame"):
        decode(b"X" * HEADER_SIZE)


def test_token_bucket_paces_to_its_rate() -> None:
    now = [0.0]
    slept: list[float] = []
    bucket = TokenBucket(1000.0, burst=100.0, clock=lambda: now[0], sleep=slept.append)
    assert bucket.reserve(100) == 0.0  # one burst goes at once
    assert bucket.reserve(100) == pytest.approx(0.1)  # then 100 bytes per 0.1 s
    now[0] = 10.0  # a long idle spell earns no more than one burst of credit
    assert bucket.reserve(100) == 0.0
    bucket.consume(200)
    assert slept == [pytest.approx(0.2)]
    with pytest.raises(ValueError):
        TokenBucket(0.0)
