"""Fixtures of the data-plane tests: a multi-process cluster that is always torn down."""

from __future__ import annotations

import multiprocessing as mp
from collections.abc import Callable, Iterator

import pytest

from tests.dataplane._cluster import Cluster


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


@pytest.fixture(autouse=True, scope="session")
def _kill_leftover_children() -> Iterator[None]:
    yield
    for child in mp.active_children():
        child.kill()
        child.join(2.0)
