"""A real local cluster for the training tests: broker, chaosd nodes and their workers.

Every worker writes one line per committed step: its state digest and loss. ``Run`` reads
them back and checks the strongest invariant there is: any two nodes that committed the
same step hold bit-identical parameters and optimizer state at that step.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from chaosctl.client import call_once
from chaosctl.cluster import LocalCluster
from tests._jsonl import JsonLines

WORKER = Path(__file__).with_name("_worker.py")
# Seconds a test worker sleeps each step. The suite is CPU-bound on 2 cores, and a worker
# steps all through the waits for a detector, a join or a restart: at 0.02 s three of them
# took 0.50 CPU-s a second (37 steps/s), at 0.05 s 0.25 (17 steps/s); a test that waits for
# some steps waits a little longer instead (stop 63).
PACE_S = 0.05
# chaosd.toml for the straggler tests: the policy pinned (they are about the members), each
# link tested every 2 s, the judge acting on two measurements in a row.
PINNED_POLICY = """
[probe]
bandwidth_period_s = 2.0
[adaptive]
enabled = true
pin = ["sync", "wire", "inner_steps"]
dwell = 2
min_interval_s = 0.0
"""


class Run:
    """A LocalCluster plus the workers' step records."""

    def __init__(self, c: LocalCluster, out: Path) -> None:
        self.c = c
        self.out = out
        self.pids: dict[str, int] = {}  # the last worker pid each daemon reported
        self._lines = JsonLines()

    def join(self, node: str, steps: int = 100000, neighbors: list[str] | None = None,
             extra: list[str] | None = None) -> None:
        argv = [sys.executable, str(WORKER), "--out", str(self.out / f"{node}.jsonl"),
                "--steps", str(steps), "--sleep", str(PACE_S), *(extra or [])]
        call_once(self.c.socket_of(node), "join",
                  {"neighbors": neighbors or [], "command": argv}, timeout=5)

    def join_all(self, nodes: list[str], timeout: float = 90,
                 start: Callable[[str], None] | None = None, **join: Any) -> None:
        """Join ``nodes`` (with ``start(node)``, else :meth:`join`): the first alone, so it
        bootstraps the model, then the rest at once.

        Their workers import torch side by side rather than one after another (about 2.5 s
        each, most of a sequential join); the scheduler still admits them one at a time."""
        start = start or (lambda node: self.join(node, **join))
        start(nodes[0])
        self.c.wait(lambda: self.active(nodes[:1]), 60, f"{nodes[0]} active")
        for node in nodes[1:]:
            start(node)
        self.c.wait(lambda: self.active(nodes), timeout, f"{nodes} active")

    def through_faults(self, start: Callable[[str], None]) -> None:
        """On three nodes: two train, the third scales out, then freezes (SIGSTOP, daemon and
        worker: no TCP reset) until it has failed, thaws and rejoins; the second leaves (its
        worker exits); the third is killed (kill -9) and the first trains on alone. Every
        change lands under training. ``start(node)`` starts a node's worker."""
        n1, n2, n3 = self.c.node_ids
        self.join_all([n1, n2], start=start)
        self.advance([n1, n2], 20)
        start(n3)  # scale-out while the others train
        self.c.wait(lambda: self.active([n1, n2, n3]), 60, "n3 active")
        self.advance([n1, n2, n3], 20)
        self.signal_node(n3, signal.SIGSTOP)
        try:
            self.c.wait(lambda: any(e["node"] == n3 for e in self.events("node-failed")), 20,
                        "n3 failed")
            self.advance([n1, n2], 20)
        finally:
            self.signal_node(n3, signal.SIGCONT)
        self.c.wait(lambda: self.active([n1, n2, n3]), 90, "n3 back as a member")
        self.advance([n1, n2, n3], 20)
        assert call_once(self.c.socket_of(n2), "leave", timeout=5)["state"] == "leaving"
        self.c.wait(lambda: any(e["node"] == n2 for e in self.events("scale-in")), 30,
                    "n2 left")
        self.c.wait(lambda: self.states().get(n2) == "standby", 30, "n2 in standby")
        # Standby is the scheduler's word; the script ends at its next forward pass after
        # its last rounds, which can take longer than the next fault (seen on a loaded box).
        log = self.c.workdir / f"{n2}.log"
        self.c.wait(lambda: "worker exited with" in log.read_text(), 60, "n2's worker to exit")
        self.advance([n1, n3], 20)
        failed = len([e for e in self.events("node-failed") if e["node"] == n3])
        self.signal_node(n3, signal.SIGKILL)
        self.c.wait(lambda: len([e for e in self.events("node-failed") if e["node"] == n3])
                    > failed, 20, "n3 failed again")
        self.advance([n1], 20)

    def records(self, node: str) -> list[dict[str, Any]]:
        return self._lines.rows(self.out / f"{node}.jsonl")

    def step(self, node: str) -> int:
        rows = self.records(node)
        return rows[-1]["step"] if rows else 0

    def advance(self, nodes: list[str], by: int, timeout: float = 60) -> None:
        """Wait until every node in ``nodes`` committed ``by`` more steps."""
        start = {n: self.step(n) for n in nodes}
        self.c.wait(lambda: all(self.step(n) >= start[n] + by for n in nodes), timeout,
                    f"{nodes} to train {by} more steps")

    def states(self) -> dict[str, str]:
        return {n: s.get("state") for n in self.c.node_ids
                for s in (self.c.query(self.c.node_ids[0], "nodes") or []) if s["id"] == n}

    def active(self, nodes: list[str]) -> bool:
        rows = {r["id"]: r["state"] for r in self.c.query(nodes[0], "nodes") or []}
        return all(rows.get(n) == "active" for n in nodes)

    def worker_pid(self, node: str) -> int:
        info = self.c.query(node, "ping") or {}
        pid = int((info.get("worker") or {}).get("pid") or 0)
        if pid:
            self.pids[node] = pid
        return pid

    def signal_node(self, node: str, sig: int) -> None:
        """Signal the node's daemon and its worker (each runs in its own process group).

        A stopped daemon cannot say who its worker is, so SIGCONT goes to the pid it reported
        before (without this the worker stayed stopped for the rest of the test)."""
        pid = self.worker_pid(node) or (self.pids.get(node, 0) if sig == signal.SIGCONT else 0)
        self.c.kill(node, sig)
        if pid:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, sig)

    def assert_consistent(self) -> int:
        """Same step, same digest, on every node that committed it; returns steps checked."""
        by_step: dict[int, dict[str, str]] = {}
        for node in self.c.node_ids:
            for row in self.records(node):
                by_step.setdefault(row["step"], {})[node] = row["digest"]
        shared = 0
        for step, digests in sorted(by_step.items()):
            assert len(set(digests.values())) == 1, f"step {step} diverged: {digests}"
            shared += len(digests) > 1
        assert shared > 0, "no step was committed by two nodes"
        return shared

    def assert_loss_falls(self, node: str) -> None:
        losses = [r["loss"] for r in self.records(node)]
        assert len(losses) >= 40
        assert sum(losses[-20:]) / 20 < sum(losses[:20]) / 20

    def events(self, kind: str) -> list[dict[str, Any]]:
        return self.c.events(self.c.node_ids[0], kind)


def connections(r: Run, a: str, b: str) -> list[tuple[int, int]]:
    """(local port, peer port) of the TCP connections from ``a``'s worker to ``b``'s."""
    pa, pb = r.worker_pid(a), r.worker_pid(b)
    if not (pa and pb):
        return []
    listing = subprocess.run(["ss", "-tnpH", "state", "established"], capture_output=True,
                             text=True, check=True).stdout
    found = []
    for line in listing.splitlines():
        if f"pid={pa}," not in line:
            continue
        parts = line.split()
        local, peer = parts[2], parts[3]
        peer_port = int(peer.rsplit(":", 1)[1])
        owners = subprocess.run(["ss", "-tnpH", "state", "established", "sport", "=",
                                 f":{peer_port}"], capture_output=True, text=True).stdout
        if f"pid={pb}," in owners:
            found.append((int(local.rsplit(":", 1)[1]), peer_port))
    return found


def kill_link(r: Run, a: str, b: str) -> int:
    """Reset the TCP connections from ``a``'s worker to ``b``'s (ss -K); how many."""
    found = connections(r, a, b)
    for lport, peer_port in found:
        subprocess.run(["ss", "-K", "sport", "=", f":{lport}", "dport", "=", f":{peer_port}"],
                       capture_output=True, check=False)
    return len(found)
