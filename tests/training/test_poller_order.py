"""The worker's background control channel against a real chaosd and mosquitto: every command
the scheduler sends reaches the training thread once, and in the order it was sent.

The worker's ``Poller`` thread polls chaosd every 20 ms while this test, acting as the
scheduler (same term and id, so the node admits the commands), publishes a burst of commands
on the node's command topic with QoS 1, the way ``SchedulerRole`` does. The training side
drains the inbox at its own pace, as ``update()`` does at step boundaries.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Mapping
from typing import Any

import aiomqtt
import pytest

from chaos_edge.trainer.poller import Poller
from chaosctl.client import call_once
from daemon.contracts.control import ControlClient
from daemon.contracts.messages import Command, Topics, encode
from daemon.contracts.protocol import Connect, WorkerCommand
from daemon.contracts.signing import ControlAuth, control_key

pytestmark = pytest.mark.timeout(90)
BURSTS, PER_BURST = 5, 60  # 300 commands; the daemon's queue holds 1000 between two polls


async def _publish(port: int, topic: str, term: int, leader: str, start: int, n: int,
                   secret: str) -> None:
    auth = ControlAuth(control_key(secret, "train"))  # signed as the scheduler signs
    async with aiomqtt.Client("127.0.0.1", port, identifier=f"fake-sched-{os.getpid()}") as cli:
        for i in range(start, start + n):
            cmd = Command(term=term, leader=leader, seq=10_000 + i, op="connect",
                          args={"peer": f"p{i}", "addr": f"127.0.0.1:{1000 + i}"})
            await cli.publish(topic, auth.seal(topic, encode(cmd), time.time()), qos=1)


def _marker(cmd: WorkerCommand) -> int | None:
    """The burst index of one of our commands (its peer ``p<i>``), else None."""
    return int(cmd.peer[1:]) if isinstance(cmd, Connect) and cmd.peer[:1] == "p" else None


class _Recording:
    """The poller's control client, keeping the sequence numbers of the commands chaosd
    answered with (the poller hands on only the parsed commands)."""

    def __init__(self, client: ControlClient) -> None:
        self.client, self.timeout, self.seqs = client, client.timeout, list[int]()

    def call(self, op: str, args: Mapping[str, Any]) -> Any:
        data = self.client.call(op, args)
        if op == "worker.poll":
            self.seqs.extend(c["seq"] for c in (data or {}).get("commands") or [])
        return data


def test_background_poll_loses_no_command_and_reorders_none(run: Any) -> None:
    r = run(1)
    node = r.c.node_ids[0]
    client = ControlClient(r.c.socket_of(node), 5.0)
    recording = _Recording(client)
    poller = Poller(recording, lambda: None)  # type: ignore[arg-type]
    got: list[WorkerCommand] = []
    try:
        client.call("worker.attach", {"pid": os.getpid(), "host": "127.0.0.1", "port": 9})
        poller.start()
        sched = (call_once(r.c.socket_of(node), "status", {}, timeout=5) or {})["scheduler"]
        assert sched and sched["id"] == node, sched
        topic = Topics("train").cmd(node)
        for b in range(BURSTS):  # bursts, with the training side draining between them
            asyncio.run(_publish(r.c.port, topic, sched["term"], node, b * PER_BURST,
                                 PER_BURST, r.c.secret))
            deadline = time.monotonic() + 20
            while len([c for c in got if _marker(c) is not None]) < (b + 1) * PER_BURST:
                assert time.monotonic() < deadline, f"burst {b}: {len(got)} commands so far"
                poller.wait(0.05)
                got.extend(poller.take()[1])
        time.sleep(0.2)  # several more polls: nothing may come twice
        got.extend(poller.take()[1])
    finally:
        poller.stop(2.0)
        client.close()
    ours = [m for c in got if (m := _marker(c)) is not None]
    assert ours == list(range(BURSTS * PER_BURST))
    seqs = recording.seqs
    assert seqs == sorted(set(seqs)), "the daemon's sequence numbers repeat or go back"
    assert len(got) == len(seqs), "the poller dropped a well-formed command"
