"""Fixtures of the data-plane tests: a multi-process cluster that is always torn down."""

from __future__ import annotations

import multiprocessing as mp
import socket
from collections.abc import Callable, Iterator

import pytest

from chaos_edge.dataplane import AllReducer, LinkConfig, PeerLinks
from chaos_edge.dataplane.auth import Identity, initiate
from tests.dataplane._cluster import Cluster

SECRET = b"k"
IDS = ["a", "b", "c"]
FOUR = ["a", "b", "c", "d"]


@pytest.fixture
def cluster() -> Iterator[Callable[..., Cluster]]:
    """Factory of clusters; every cluster it made is closed, even when the test fails."""
    made: list[Cluster] = []

    def make(ids: list[str], chunk_bytes: int = 1 << 16) -> Cluster:
        c = Cluster(ids, chunk_bytes)
        made.append(c)
        return c.start()

    yield make
    for c in made:
        c.close()


def make_mesh() -> dict[str, PeerLinks]:
    """Four nodes, every pair linked, so any tree over them runs (close every one)."""
    links = {n: PeerLinks(n, "t", SECRET, is_member=lambda p: True,
                          config=LinkConfig(io_poll=0.2)) for n in FOUR}
    try:
        for lk in links.values():
            lk.allow(*FOUR)
            lk.start()
        for i, a in enumerate(FOUR):
            for b in FOUR[i + 1:]:
                links[a].connect_to(b, *links[b].address)
        for n, lk in links.items():
            assert lk.wait_connected([p for p in FOUR if p != n], 5)
    except BaseException:
        for lk in links.values():
            lk.close()
        raise
    return links


@pytest.fixture
def mesh() -> Iterator[dict[str, PeerLinks]]:
    """Four nodes, every pair linked, closed after the test."""
    links = make_mesh()
    yield links
    for lk in links.values():
        lk.close()


@pytest.fixture(autouse=True, scope="session")
def _kill_leftover_children() -> Iterator[None]:
    yield
    for child in mp.active_children():
        child.kill()
        child.join(2.0)


@pytest.fixture
def trio() -> Iterator[dict[str, AllReducer]]:
    """Three nodes a-b-c (a chain) in this process, plus an unconnected "solo"."""
    links = {
        n: PeerLinks(n, "t", SECRET, is_member=lambda p: True, config=LinkConfig(io_poll=0.2))
        for n in [*IDS, "solo"]
    }
    for lk in links.values():
        lk.start()
    links["b"].allow("a", "c")
    links["a"].connect_to("b", *links["b"].address)
    links["c"].connect_to("b", *links["b"].address)
    # Both ends up before a test sends: on a loaded box b had not yet taken a's link when a
    # test's first frame went out ("link to peer 'a' is gone: not connected").
    assert links["b"].wait_connected(["a", "c"], 10)
    assert links["a"].wait_connected(["b"], 10) and links["c"].wait_connected(["b"], 10)
    yield {n: AllReducer(lk, chunk_bytes=1024, timeout=10.0) for n, lk in links.items()}
    for lk in links.values():
        lk.close()


@pytest.fixture
def mute(trio: dict[str, AllReducer]) -> Iterator[socket.socket]:
    """A silent peer "mute" linked to "solo": it authenticated and then never reads or sends,
    which is what a SIGSTOPped box looks like (no reset, no data)."""
    solo = trio["solo"]
    solo.links.allow("mute")
    raw = socket.create_connection(solo.links.address)
    try:
        initiate(raw, Identity("mute", "t", SECRET, "0" * 16), "solo")
        assert solo.links.wait_connected(["mute"], 5)
        yield raw
    finally:
        raw.close()
