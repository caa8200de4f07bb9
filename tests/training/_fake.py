"""A fake chaosd + scheduler in the test process: the seam the Trainer talks to.

Each node gets its own control socket; all of them share one scheduler state that follows
docs/training-protocol.md (bootstrap, scale-out with one source and a step margin, graceful
leave, failure at once), with a chain topology over the sorted members. Tests drive failures
(:meth:`FakeCluster.fail`) and read what workers reported. As chaosd's supervisor does, the
fake drops a member whose worker exits while attached (any exit code): a job's last round can
leave one member uncertain whether it committed, and only the policy without the ones that
finished lets it decide alone (a fake that kept them, as before, held it waiting forever).
"""

from __future__ import annotations

import itertools
import json
import os
import socketserver
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO, Any

from chaos_edge.dataplane import spanning_tree
from daemon.contracts.config import WorkerConfig
from daemon.contracts.protocol import Bootstrap, Connect, Replicate, WorkerCommand
from tests._jsonl import JsonLines

SECRET = "ab" * 16
MARGIN = 2


class FakeCluster:
    """Shared scheduler state behind every node's fake control socket."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.lock = threading.Lock()
        self.version = 0
        self.policy: dict[str, Any] | None = None
        #: Every policy published, by version: a poll gets those newer than the worker's, as
        #: from the real daemon (with the newest alone, a first node whose first poll came
        #: after a second node's join never saw the policy it bootstraps under, and waited).
        self.published: dict[int, dict[str, Any]] = {}
        self.members: list[str] = []
        self.addrs: dict[str, str] = {}
        self.steps: dict[str, int] = {}
        self.commands: dict[str, list[dict[str, Any]]] = {}
        self.sent: dict[str, list[dict[str, Any]]] = {}  # a new node's replicate, to resend
        self.leave: set[str] = set()
        self.reports: list[tuple[str, dict[str, Any]]] = []
        self.servers: list[socketserver.UnixStreamServer] = []
        #: Seconds the sources' replicate commands take to arrive (a broker restart lost the
        #: first copy, and the scheduler sent it again); 0: with the new node's.
        self.source_late_s = 0.0
        self._timers: list[threading.Timer] = []
        self.attached: set[str] = set()  # attached and not detached: an exit is a failure
        self._closed = threading.Event()

    def socket_for(self, node: str) -> str:
        """Start (once) the control socket of ``node`` and return its path."""
        path = str(self.workdir / f"{node}.sock")
        cluster = self

        class Handler(socketserver.StreamRequestHandler):
            def handle(self) -> None:
                for line in self.rfile:
                    req = json.loads(line)
                    data = cluster.op(node, req["op"], req.get("args") or {})
                    self.wfile.write(json.dumps({"v": 1, "ok": True, "data": data}).encode()
                                     + b"\n")

        srv = socketserver.ThreadingUnixStreamServer(path, Handler)
        srv.daemon_threads = True
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        self.servers.append(srv)
        return path

    def watch(self, node: str, proc: subprocess.Popen[bytes]) -> None:
        """Play chaosd's supervisor for ``node``'s worker: its exit while attached drops it
        (a ``worker-exit``, which the scheduler answers with a policy without it)."""
        def wait() -> None:
            while proc.poll() is None:
                if self._closed.wait(0.05):
                    return
            with self.lock:
                attached = node in self.attached
                self.attached.discard(node)
            if attached:
                self.fail(node)
        threading.Thread(target=wait, daemon=True).start()

    def close(self) -> None:
        self._closed.set()
        for t in self._timers:
            t.cancel()
        for srv in self.servers:
            srv.shutdown()
            srv.server_close()

    # -- the scheduler ---------------------------------------------------------------------
    def _publish(self, effective: int) -> None:
        self.version += 1
        members = sorted(self.members)
        chain = {(a, b): 1.0 for a, b in itertools.pairwise(members)}
        tree = spanning_tree(members, chain)
        pol = tree.policy(self.version).to_dict()
        pol["addrs"] = {m: self.addrs[m] for m in members}
        pol["effective_step"] = effective
        self.policy = self.published[self.version] = pol

    def _late(self, node: str, cmd: WorkerCommand) -> None:
        with self.lock:
            self._cmd(node, cmd)

    def _cmd(self, node: str, cmd: WorkerCommand) -> None:
        """Queue a command in its wire form (the worker parses it as it parses the real)."""
        self.commands.setdefault(node, []).append({"op": cmd.OP, "args": cmd.to_args()})

    def op(self, node: str, op: str, args: dict[str, Any]) -> Any:
        with self.lock:
            if op == "worker.attach" and node in self.members:
                self.attached.add(node)
                # A new node asking again (its pulls were refused): its own command again.
                self.commands.setdefault(node, []).extend(self.sent.get(node, []))
                return {"node": node, "cluster": "fake", "secret": SECRET, "incarnation": "x"}
            if op == "worker.attach":
                self.attached.add(node)
                self.addrs[node] = f"127.0.0.1:{args['port']}"
                self.steps[node] = 0
                if not self.members:
                    self.members = [node]
                    self._publish(0)
                    # As the real scheduler does: the first node is told to start alone.
                    self._cmd(node, Bootstrap(new=node, policy_version=self.version))
                else:
                    source = sorted(self.members)[0]
                    t = max(self.steps[m] for m in self.members) + MARGIN
                    self.members.append(node)
                    self._publish(t + 1)
                    rep = Replicate(version_step=t, new=node, policy_version=self.version,
                                    sources={source: self.addrs[source]}, neighbors=[source])
                    # As the real scheduler does: both ends of the new link are told first.
                    self._cmd(source, Connect(peer=node, addr=self.addrs[node]))
                    self._cmd(node, Connect(peer=source, addr=self.addrs[source]))
                    self._cmd(node, rep)
                    self.sent[node] = [{"op": rep.OP, "args": rep.to_args()}]
                    if self.source_late_s:
                        self._timers.append(threading.Timer(self.source_late_s,
                                                            self._late, (source, rep)))
                        self._timers[-1].start()
                    else:
                        self._cmd(source, rep)
                return {"node": node, "cluster": "fake", "secret": SECRET, "incarnation": "x"}
            if op == "ping":  # a daemon without snapshots ([snapshots] off)
                return {"node": node, "cluster": "fake"}
            if op == "worker.poll":
                self.steps[node] = int(args.get("step", 0))
                known = int(args.get("policy_version", -1))
                newer = [p for v, p in sorted(self.published.items()) if v > known]
                return {"policy": self.policy, "policies": newer,
                        "commands": self.commands.pop(node, []),
                        "leave": node in self.leave}
            if op == "worker.report":
                self.reports.append((node, dict(args)))
                return {}
            if op == "worker.detach":
                self.attached.discard(node)
                return {}
            if op == "worker.leave":
                if node in self.members:
                    self.members.remove(node)
                    self._publish(int(args["step"]) + 1)
                return {}
        raise AssertionError(f"unexpected op {op}")

    def fail(self, node: str) -> None:
        """The scheduler detected ``node``'s failure: a policy without it, effective at once."""
        with self.lock:
            if node in self.members:
                self.members.remove(node)
                if self.members:  # the last one gone: no policy to publish, as from chaosd
                    self._publish(0)

    def member_count(self) -> int:
        with self.lock:
            return len(self.members)


def worker_env(path: str, node: str) -> dict[str, str]:
    """Environment of a worker process attached to the fake."""
    return {**os.environ, "CHAOS_SOCKET": path, "CHAOS_NODE_ID": node,
            "CHAOS_DATA_BIND": "127.0.0.1", "PYTHONUNBUFFERED": "1"}


def _nicer(nice: int) -> None:
    os.nice(nice)


def spawn_worker(argv: list[str], fake: FakeCluster, node: str, log: IO[bytes]
                 ) -> subprocess.Popen[bytes]:
    """A worker attached to the fake, started as chaosd starts one: in a session of its own,
    at ``[worker] nice``'s default below this process (the fake daemon)."""
    nice = WorkerConfig().nice
    proc = subprocess.Popen(argv, env=worker_env(fake.socket_for(node), node), stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True,
                            preexec_fn=lambda: _nicer(nice))
    fake.watch(node, proc)
    return proc


class FakeRun:
    """Worker processes (tests/training/_worker.py) attached to one FakeCluster, each with
    its step records (``NODE.jsonl``) and log (``NODE.log``) in the cluster's workdir."""

    WORKER = str(Path(__file__).with_name("_worker.py"))

    def __init__(self, fake: FakeCluster, steps: int) -> None:
        self.fake, self.steps, self.dir = fake, steps, fake.workdir
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self._lines = JsonLines()

    def start(self, node: str, *extra: str) -> None:
        """Start ``node``'s worker, paced at 0.05 s a step."""
        argv = [sys.executable, self.WORKER, "--steps", str(self.steps), "--sleep", "0.05",
                "--out", str(self.dir / f"{node}.jsonl"), *extra]
        log = open(self.dir / f"{node}.log", "wb")  # noqa: SIM115 - closed with the process
        self.procs[node] = spawn_worker(argv, self.fake, node, log)

    def records(self, node: str) -> list[dict[str, Any]]:
        return self._lines.rows(self.dir / f"{node}.jsonl")

    def log(self, node: str) -> str:
        return (self.dir / f"{node}.log").read_text(errors="replace")

    def wait_steps(self, node: str, n: int, timeout: float = 60) -> None:
        """Until ``node`` committed ``n`` steps (every worker still running)."""
        deadline = time.monotonic() + timeout
        while len(self.records(node)) < n:
            assert time.monotonic() < deadline, f"{node} did not train"
            assert all(p.poll() is None for p in self.procs.values()), "a worker exited early"
            time.sleep(0.1)

    def finish(self, timeout: float = 120) -> None:
        """Until every worker exited; each must have exited 0."""
        deadline = time.monotonic() + timeout
        while any(p.poll() is None for p in self.procs.values()):
            assert time.monotonic() < deadline, "workers did not finish"
            time.sleep(0.2)
        logs = {n: self.log(n) for n in self.procs}
        assert {n: p.returncode for n, p in self.procs.items()} == dict.fromkeys(self.procs, 0), \
            logs

    def assert_in_step(self, last: str) -> None:
        """Every member held the same state at every step it committed, and ``last`` (the
        newest node) trained to the end."""
        by_step: dict[int, set[str]] = {}
        for node in self.procs:
            for rec in self.records(node):
                by_step.setdefault(int(str(rec["step"])), set()).add(str(rec["digest"]))
        assert by_step[self.steps] and all(len(d) == 1 for d in by_step.values())
        assert max(int(str(r["step"])) for r in self.records(last)) == self.steps

    def close(self) -> None:
        for p in self.procs.values():
            if p.poll() is None:
                p.kill()
            p.wait(10)
        self.fake.close()
