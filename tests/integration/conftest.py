"""Fixtures: a real broker (mosquitto or the embedded one) on a free port and real chaosd nodes."""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from chaosctl import polling
from chaosctl.cluster import LocalCluster

BROKERS = ["mosquitto", "embedded"]


def wait_until(pred: Callable[[], Any], timeout: float, what: str, every: float = 0.1) -> Any:
    """Poll ``pred`` until it returns something truthy; fail the test with ``what`` if not."""
    return polling.wait_until(pred, timeout, what, every, AssertionError)


def need_mosquitto(kind: str) -> None:
    found = shutil.which("mosquitto") or Path("/usr/sbin/mosquitto").exists()
    if kind == "mosquitto" and not found:
        pytest.skip("mosquitto is not installed (apt-get install mosquitto)")


@pytest.fixture
def make_cluster(tmp_path: Path) -> Iterator[Callable[..., LocalCluster]]:
    clusters: list[LocalCluster] = []

    def make(size: int = 3, broker: str = "mosquitto", config: str = "") -> LocalCluster:
        need_mosquitto(broker)
        cluster = LocalCluster(tmp_path / f"c{len(clusters)}", size, cluster="t",
                               broker_kind=broker, config=config)
        clusters.append(cluster)
        cluster.start()
        return cluster

    yield make
    for cluster in clusters:
        cluster.close(grace=3.0)
