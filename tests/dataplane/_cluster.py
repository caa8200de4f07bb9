"""Multi-process harness: each node is a spawned process with PeerLinks + AllReducer.

The test process drives the nodes through pipes; every wait is bounded, and ``Cluster.close``
always terminates, then kills, every child.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import multiprocessing as mp
import os
import signal
from multiprocessing.connection import Connection
from typing import Any

import numpy as np

SECRET = b"test-cluster-secret"
REPLY_TIMEOUT = 40.0


def make_grad(seed: int, n: int) -> np.ndarray:
    """Gradient whose weighted sums are exact in float32 (multiples of 1/16, small)."""
    rng = np.random.default_rng(seed)
    return (rng.integers(-1000, 1000, n) * 2.0**-4).astype(np.float32)


def expected_digest(parts: list[tuple[int, int]], n: int) -> str:
    """Digest of the exact weighted average of ``(seed, samples)`` contributions."""
    total = sum(s for _, s in parts)
    acc = sum(make_grad(seed, n).astype(np.float64) * s for seed, s in parts)
    avg = np.asarray(acc).astype(np.float32) / np.float32(max(total, 1))
    return hashlib.sha256(avg.astype(np.float32).tobytes()).hexdigest()


def _node_main(node_id: str, conn: Connection, chunk_bytes: int) -> None:
    from chaos_edge.dataplane import AllReducer, PeerLinks, RoundAborted, SyncPolicy

    logging.basicConfig(level=logging.WARNING)
    members: set[str] = set()
    kill_at: list[tuple[int, int]] = []  # (step, chunk) at which this node dies

    def hook(event: str, chunk: int) -> None:
        if kill_at and event == "reduce" and (current_step[0], chunk) == kill_at[0]:
            os.kill(os.getpid(), signal.SIGKILL)

    current_step = [0]
    links = PeerLinks(node_id, "test", SECRET, is_member=members.__contains__)
    conn.send(links.start())
    reducer = AllReducer(links, chunk_bytes=chunk_bytes, fault_hook=hook)
    while True:
        cmd, *args = conn.recv()
        if cmd == "stop":
            links.close()
            conn.send(("ok",))
            return
        if cmd == "members":
            members.clear()
            members.update(args[0])
            conn.send(("ok",))
        elif cmd == "allow":
            links.allow(*args[0])
            conn.send(("ok",))
        elif cmd == "connect":
            links.connect_to(*args)
            conn.send(("ok",))
        elif cmd == "kill_at":
            kill_at[:] = [tuple(args)]
            conn.send(("ok",))
        elif cmd == "run":
            step, policy_json, seed, samples, n, timeout = args
            current_step[0] = step
            try:
                res = reducer.allreduce(
                    make_grad(seed, n),
                    samples,
                    step=step,
                    policy=SyncPolicy.from_json(policy_json),
                    timeout=timeout,
                )
            except RoundAborted as exc:
                conn.send(("aborted", exc.reason))
            else:
                digest = hashlib.sha256(res.values.tobytes()).hexdigest()
                conn.send(("ok", digest, res.total_samples))


class Cluster:
    """A set of node processes on 127.0.0.1."""

    def __init__(self, ids: list[str], chunk_bytes: int = 1 << 16) -> None:
        self.ids, self.chunk_bytes = ids, chunk_bytes
        self.procs: dict[str, Any] = {}
        self.conns: dict[str, Connection] = {}
        self.addr: dict[str, tuple[str, int]] = {}

    def start(self) -> Cluster:
        """Spawn the node processes and wait for their listening addresses."""
        ctx = mp.get_context("spawn")
        ids, chunk_bytes = self.ids, self.chunk_bytes
        for node in ids:
            parent, child = ctx.Pipe()
            proc = ctx.Process(target=_node_main, args=(node, child, chunk_bytes), daemon=True)
            proc.start()
            self.procs[node], self.conns[node] = proc, parent
        for node in ids:
            self.addr[node] = self._recv(node)
        for node in ids:
            self.call(node, "members", list(ids))
        return self

    def _recv(self, node: str, timeout: float = REPLY_TIMEOUT) -> Any:
        conn = self.conns[node]
        if not conn.poll(timeout):
            raise TimeoutError(f"node {node} did not answer within {timeout}s")
        try:
            return conn.recv()
        except EOFError:
            return ("dead",)  # the node process exited (e.g. killed by a fault hook)

    def call(self, node: str, *cmd: Any) -> Any:
        self.conns[node].send(cmd)
        return self._recv(node)

    def connect(self, edges: list[tuple[str, str]]) -> None:
        """Make each edge a live link (``a`` dials ``b``)."""
        for a, b in edges:
            self.call(b, "allow", [a])
            self.call(a, "connect", b, *self.addr[b])

    def run(
        self, plan: dict[str, tuple[str, int, int]], step: int, n: int, timeout: float = 20.0
    ) -> dict[str, Any]:
        """Start a round on every node of ``plan`` (node -> (policy json, seed, samples))."""
        for node, (policy, seed, samples) in plan.items():
            self.conns[node].send(("run", step, policy, seed, samples, n, timeout))
        return {node: self._recv(node, timeout + 15.0) for node in plan}

    def close(self) -> None:
        for node, proc in self.procs.items():
            if proc.is_alive():
                with contextlib.suppress(OSError):
                    self.conns[node].send(("stop",))
        for proc in self.procs.values():
            proc.join(3.0)
            if proc.is_alive():
                proc.terminate()
                proc.join(2.0)
            if proc.is_alive():
                proc.kill()
                proc.join(2.0)
