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
from daemon.contracts.protocol import Connect, WorkerCommand
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
        assert [c.OP for c in commands] == ["bootstrap"] and not leave
        _until(lambda: fake.steps["n0"] == 7)  # the published position reaches the daemon
        fake.op("n1", "worker.attach", {"port": 2})  # v2, and commands for n0
        _until(lambda: len(seen) == 2)
        time.sleep(0.1)  # later polls repeat v2: it is handed over once
        policies, commands, _ = poller.take()
        assert [p.version for p in policies] == [2]
        assert [c.OP for c in commands] == ["connect", "replicate"]
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


def test_a_malformed_command_is_counted_by_the_poller_and_reaches_no_one(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Commands are parsed once, on the poller's thread: the Trainer's hook and the training
    thread's inbox get typed records, and a malformed command reaches neither."""
    fake = FakeCluster(tmp_path)
    client = ControlClient(fake.socket_for("n0"), 5.0)
    poller = Poller(client, lambda: None)
    hooked: list[WorkerCommand] = []
    poller.on_command = hooked.append
    good = Connect(peer="n1", addr="127.0.0.1:7001")
    with fake.lock:
        fake.commands["n0"] = [
            {"op": "connect", "args": {"peer": "n1", "addr": "127.0.0.1:"}},  # the soak's
            {"op": "launch", "args": {}},  # no such command
            "connect",  # not an object
            {"op": good.OP, "args": good.to_args()},
        ]
    try:
        poller.poll_once()
        _, commands, _ = poller.take()
    finally:
        fake.close()
        client.close()
    assert commands == [good] and hooked == [good]
    assert poller.rejects.total == 3
    # Rate-limited: the first at once, the other two are counted toward the next line.
    lines = [r.getMessage() for r in caplog.records if "malformed worker command" in r.getMessage()]
    assert len(lines) == 1 and "is not host:port" in lines[0], lines


def test_a_queued_report_wakes_the_poller_instead_of_waiting_for_the_next_tick(
        tmp_path: Path) -> None:
    """A failed link's report reaches chaosd at once: with an hour between timed polls, the
    report queued after the first poll is still flushed, by a poll the wake-up started."""
    fake = FakeCluster(tmp_path)
    client = ControlClient(fake.socket_for("n0"), 5.0)
    flushed: list[int] = []
    queued: list[int] = []

    def flush() -> None:
        flushed.extend(queued)
        queued.clear()

    poller = Poller(client, flush, every=3600.0)
    try:
        client.call("worker.attach", {"pid": 1, "host": "127.0.0.1", "port": 1})
        poller.start()
        assert poller.wait(5.0)  # the first poll, at once
        queued.append(7)
        poller.wake()
        _until(lambda: flushed == [7])
    finally:
        poller.stop()
        fake.close()
        client.close()


def test_polls_carry_the_compute_average_and_vector_size_once_both_are_known() -> None:
    """The policy controller's inputs (issue 24), averaged over about ten steps."""
    calls: list[dict[str, object]] = []

    class Recorder:
        def call(self, op: str, args: dict[str, object]) -> dict[str, object]:
            calls.append(dict(args))
            return {}

    poller = Poller(Recorder(), lambda: None)  # type: ignore[arg-type]
    poller.record_compute(10.0)
    poller.poll_once()
    assert "compute_ms" not in calls[-1]  # no round yet: its size is not known
    poller.elements = 4096
    poller.record_compute(20.0)
    poller.poll_once()
    assert calls[-1]["compute_ms"] == 11.0 and calls[-1]["elements"] == 4096
