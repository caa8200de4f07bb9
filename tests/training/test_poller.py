"""The worker's background poll (chaos_edge.trainer.poller) against the fake daemon."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from chaos_edge.trainer.poller import Poller
from daemon.contracts.control import ControlClient
from daemon.contracts.errors import ControlFailure
from daemon.contracts.policy import SyncPolicy
from tests.training._fake import FakeCluster

pytestmark = pytest.mark.timeout(30)


def _until(pred: Callable[[], object], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_policies_reach_on_policy_at_once_and_the_inbox_once(tmp_path: Path) -> None:
    fake = FakeCluster(tmp_path)
    client = ControlClient(fake.socket_for("n0"), 5.0)
    reports: list[int] = []
    poller = Poller(client, lambda: reports.append(1))
    seen: list[tuple[int, str]] = []
    poller.on_policy = lambda pub: seen.append((pub.version, threading.current_thread().name))
    try:
        client.call("worker.attach", {"pid": 1, "host": "127.0.0.1", "port": 1})  # v1
        poller.position = (7, "active")
        poller.start()
        _until(lambda: seen)
        assert seen == [(1, "chaos-poller")]  # on the poller's thread, not the trainer's
        assert poller.wait(5.0)
        policies, commands, leave = poller.take()
        assert [p.version for p in policies] == [1] and all(
            isinstance(p, SyncPolicy) for p in policies)
        assert [c["op"] for c in commands] == ["bootstrap"] and not leave
        _until(lambda: fake.steps["n0"] == 7)  # the published position reaches the daemon
        fake.op("n1", "worker.attach", {"port": 2})  # v2, and commands for n0
        _until(lambda: len(seen) == 2)
        time.sleep(0.1)  # later polls repeat v2: it is handed over once
        policies, commands, _ = poller.take()
        assert [p.version for p in policies] == [2]
        assert [c["op"] for c in commands] == ["connect", "replicate"]
        assert poller.take()[:2] == ([], []) and seen[-1][0] == 2
        assert reports, "queued reports are flushed before each poll"
    finally:
        fake.close()
        client.close()
    _until(lambda: poller.wait(0.01))  # the daemon is gone: the error wakes the trainer
    with pytest.raises(ControlFailure):
        poller.take()
    poller.stop(2.0)
    assert poller._thread is not None and not poller._thread.is_alive()
