"""Fixtures of the training tests: worker processes that are always killed at the end."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from chaosctl.cluster import LocalCluster
from tests.training._run import Run


@pytest.fixture
def procs() -> Iterator[list[subprocess.Popen[bytes]]]:
    """A list to register child processes in; each is killed with its group on teardown."""
    made: list[subprocess.Popen[bytes]] = []
    yield made
    for p in made:
        if p.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            p.wait(5)


@pytest.fixture
def run(tmp_path: Path) -> Iterator[Any]:
    made: list[Run] = []

    def make(size: int, config: str = "", node_config: dict[str, str] | None = None) -> Run:
        c = LocalCluster(tmp_path / "c", size, cluster="train", broker_kind="mosquitto",
                         config=config, node_config=node_config or {})
        r = Run(c, tmp_path)
        made.append(r)
        c.start()
        c.wait(lambda: c.agreed(states={"standby": size}), 30, "a scheduler")
        return r

    yield make
    for r in made:
        # Workers first: a daemon stopping with its worker still up waits out the worker's
        # graceful leave, which costs every test seconds and tests nothing. A worker whose
        # daemon died is no longer supervised, so it is killed here either way.
        for pid in [r.worker_pid(n) for n in r.c.node_ids]:
            if pid:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pid, signal.SIGKILL)
        r.c.close(grace=5.0)
