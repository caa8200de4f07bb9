"""A throw-away local cluster: one embedded broker and N ``chaosd`` processes in a temp dir.

Used by ``chaosctl demo`` (and meant for the benchmarks). Each child runs in its own process
group, so that kill -9 hits exactly one node and teardown can kill whatever a child spawned.
Teardown is SIGTERM, a bounded wait, then SIGKILL; :meth:`LocalCluster.close` runs from a
``finally``, and on Linux the children also get SIGTERM if chaosctl itself dies (PDEATHSIG).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

from chaosctl.client import ControlFailure, CtlError, call_once
from chaosctl.polling import agreed, wait_until

T = TypeVar("T")
READY_RE = re.compile(rb"^ready (\d+)\s*$", re.MULTILINE)
SECRET_KEY_RE = re.compile(r"^\s*secret\s*=", re.MULTILINE)
TERM_GRACE_S = 5.0
_PR_SET_PDEATHSIG = 1


class ClusterError(CtlError):
    """The local cluster could not be started or did not behave as expected."""

    exit_code = 1


def free_port(host: str = "127.0.0.1") -> int:
    """Return a TCP port that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def mosquitto_binary() -> str:
    """Path of the mosquitto broker (Debian puts it in /usr/sbin, off a user's PATH)."""
    found = shutil.which("mosquitto") or shutil.which("mosquitto", path="/usr/sbin:/usr/local/sbin")
    if not found:
        raise ClusterError("mosquitto not found (apt-get install mosquitto)")
    return found


def _listening(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(0.2)
        return sock.connect_ex((host, port)) == 0


def thread_budget(nodes: int) -> dict[str, str]:
    """``OMP_NUM_THREADS`` for the workers of ``nodes`` nodes on this box, unless the caller set
    one: the box's cores shared out among them. torch's default takes every core for each
    worker, and its OpenMP threads spin between ops: four workers of a tiny model on 2 cores
    spent 74 ms of CPU a step each, against 11 ms with one thread (a 2.7x faster step)."""
    if "OMP_NUM_THREADS" in os.environ:
        return {}
    return {"OMP_NUM_THREADS": str(max(1, (os.cpu_count() or 1) // max(1, nodes)))}


def chaosd_command() -> list[str]:
    """Return the argv prefix that starts ``chaosd`` from this installation."""
    beside = Path(sys.executable).with_name("chaosd")
    if beside.exists():
        return [str(beside)]
    found = shutil.which("chaosd")
    if found:
        return [found]
    raise ClusterError(
        "chaosd not found next to this Python or on PATH (reinstall: pip install -e .)"
    )


def _die_with_parent() -> None:
    # Runs in the child between fork and exec: ask the kernel for SIGTERM when chaosctl dies,
    # so not even a kill -9 of chaosctl leaves daemons behind.
    with contextlib.suppress(Exception):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


@dataclass
class Child:
    """One child process of the cluster and where its output goes."""

    name: str
    argv: list[str]
    log: Path
    proc: subprocess.Popen[bytes] | None = None
    started_at: float = 0.0

    def alive(self) -> bool:
        """Whether the process is running."""
        return self.proc is not None and self.proc.poll() is None


@dataclass
class LocalCluster:
    """Broker plus ``chaosd`` nodes ``node-1..node-N`` under ``workdir``.

    Args:
        workdir: Directory for sockets, data dirs and logs (created if missing).
        size: Number of nodes.
        cluster: The cluster name passed to every node.
    """

    workdir: Path
    size: int
    cluster: str = "demo"
    port: int = 0
    broker_kind: str = "embedded"  # "embedded" (python -m daemon.agent.broker) or "mosquitto"
    mosquitto_conf: str = ""  # extra mosquitto.conf lines (the control bench: sys_interval)
    config: str = ""  # chaosd.toml text every node loads (flags still win)
    node_config: dict[str, str] = field(default_factory=dict)  # node -> its own, instead
    # node -> the port of another broker on 127.0.0.1 it attaches to instead of ``port``
    # (a second broker bridged to this one: tests/integration/test_bridge.py)
    node_port: dict[str, int] = field(default_factory=dict)
    # The cluster secret every node's config gets (unless its text sets one): fresh per
    # cluster, so control messages are signed as in a real deployment.
    secret: str = field(default_factory=lambda: secrets.token_hex(32))
    broker: Child | None = None
    nodes: dict[str, Child] = field(default_factory=dict)

    def __enter__(self) -> LocalCluster:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    @property
    def node_ids(self) -> list[str]:
        """Node ids in order."""
        return [f"node-{i}" for i in range(1, self.size + 1)]

    def socket_of(self, node_id: str) -> Path:
        """The control socket of ``node_id``."""
        return self.workdir / f"{node_id}.sock"

    def thread_budget(self) -> dict[str, str]:
        """``OMP_NUM_THREADS`` for the nodes' workers (:func:`thread_budget`)."""
        return thread_budget(self.size)

    def _spawn(self, child: Child) -> None:
        with open(child.log, "ab") as log:
            child.proc = subprocess.Popen(
                child.argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.workdir,
                env={**os.environ, "PYTHONUNBUFFERED": "1", **self.thread_budget()},
                start_new_session=True,  # own process group: see the module docstring
                preexec_fn=_die_with_parent if sys.platform == "linux" else None,
            )
        child.started_at = time.monotonic()

    def start_broker(self, timeout: float = 20.0) -> int:
        """Start the broker (again on the same port after :meth:`stop_broker`); wait until ready.

        ``embedded`` runs ``python -m daemon.agent.broker`` and waits for its ``ready <port>`` line;
        ``mosquitto`` runs the real broker with a minimal config and waits for its port.
        """
        self.workdir.mkdir(parents=True, exist_ok=True)
        # A port free a moment ago can be taken before the broker binds it (another test's
        # process, on a busy box): a port of our choosing is chosen again. A restart keeps
        # the port the nodes know.
        for attempt in range(3):
            port = self.port or free_port()
            if self._start_broker_on(port, timeout, retry=not self.port and attempt < 2):
                self.port = port
                return port
        raise ClusterError("no free port for the broker")  # not reached: the last try raises

    def _start_broker_on(self, port: int, timeout: float, retry: bool) -> bool:
        """Start the broker on ``port`` and wait until ready; False if ``retry`` and the port
        was taken."""
        log = self.workdir / "broker.log"
        if self.broker_kind == "mosquitto":
            conf = self.workdir / "mosquitto.conf"
            conf.write_text(f"listener {port} 127.0.0.1\nallow_anonymous true\n"
                            "persistence false\nlog_dest stderr\n" + self.mosquitto_conf)
            argv = [mosquitto_binary(), "-c", str(conf)]
        elif self.broker_kind == "embedded":
            argv = [sys.executable, "-m", "daemon.agent.broker", "--bind", "127.0.0.1",
                    "--port", str(port)]
        else:
            raise ClusterError(f"unknown broker kind {self.broker_kind!r}")
        offset = log.stat().st_size if log.exists() else 0
        self.broker = Child("broker", argv, log)
        self._spawn(self.broker)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.broker_kind == "embedded":
                ready = READY_RE.search(log.read_bytes()[offset:]) is not None
            else:
                ready = _listening("127.0.0.1", port)
            if ready:
                return True
            if not self.broker.alive():
                if retry and b"in use" in log.read_bytes()[offset:].lower():
                    return False
                raise ClusterError(f"the {self.broker_kind} broker exited early; see {log}")
            time.sleep(0.05)
        raise ClusterError(f"the {self.broker_kind} broker was not ready within {timeout:g}s; "
                           f"see {log}")

    def stop_broker(self, sig: int = signal.SIGTERM) -> None:
        """Stop the broker (the nodes keep running and reconnect when it is back)."""
        if self.broker is None or self.broker.proc is None:
            return
        if sig == signal.SIGTERM:
            self._stop([self.broker], TERM_GRACE_S)
        else:
            self.kill_child(self.broker, sig)

    def node_argv(self, node_id: str) -> list[str]:
        """The ``chaosd`` command line of ``node_id``."""
        text = self.node_config.get(node_id, self.config)
        if not SECRET_KEY_RE.search(text):
            # Top-level keys must precede any [table]: put the secret first.
            text = f'secret = "{self.secret}"\n{text}'
        conf = self.workdir / f"{node_id}.toml"
        conf.write_text(text)
        conf.chmod(0o600)
        return [
            *chaosd_command(), "--config", str(conf),
            "--node-id", node_id,
            "--cluster", self.cluster,
            "--broker", f"mqtt://127.0.0.1:{self.node_port.get(node_id, self.port)}",
            "--socket", str(self.socket_of(node_id)),
            "--data-dir", str(self.workdir / node_id),
            "--advertise", "127.0.0.1",
        ]

    def start_node(self, node_id: str) -> None:
        """Start (or restart) ``node_id``; its log is appended to ``<node_id>.log``."""
        child = self.nodes.get(node_id)
        if child is not None and child.alive():
            raise ClusterError(f"{node_id} is already running")
        (self.workdir / node_id).mkdir(parents=True, exist_ok=True)
        child = Child(node_id, self.node_argv(node_id), self.workdir / f"{node_id}.log")
        self.nodes[node_id] = child
        self._spawn(child)

    def start(self) -> None:
        """Start the broker and every node."""
        self.start_broker()
        for node_id in self.node_ids:
            self.start_node(node_id)

    def kill(self, node_id: str, sig: int = signal.SIGKILL) -> None:
        """Send ``sig`` to the node's process group and reap it if it was a kill."""
        self.kill_child(self.nodes[node_id], sig)

    @staticmethod
    def kill_child(child: Child, sig: int) -> None:
        """Send ``sig`` to ``child``'s process group and reap it if it was a kill."""
        if child.proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(child.proc.pid, sig)
        if sig == signal.SIGKILL:
            with contextlib.suppress(subprocess.TimeoutExpired):
                child.proc.wait(timeout=TERM_GRACE_S)

    def exited(self) -> list[str]:
        """Names of children that are no longer running (any of them may be expected)."""
        children = [*self.nodes.values(), *([self.broker] if self.broker else [])]
        return [c.name for c in children if c.proc is not None and not c.alive()]

    def query(self, node_id: str, op: str, timeout: float = 1.0) -> Any:
        """Ask ``node_id``'s control socket; return ``None`` if it does not answer well."""
        try:
            return call_once(self.socket_of(node_id), op, timeout=timeout)
        except ControlFailure:
            return None

    def agreed(self, nodes: list[str] | None = None,
               states: dict[str, int] | None = None) -> tuple[str, int] | None:
        """The ``(scheduler, term)`` that every node in ``nodes`` reports, if they all agree.

        Also requires that exactly that node says it leads, and (with ``states``) that every
        node counts members per state exactly so.
        """
        return agreed(self.query, self.node_ids if nodes is None else nodes, states)

    def events(self, node_id: str, kind: str, since_ts: float = 0.0) -> list[dict[str, Any]]:
        """Events of ``kind`` that ``node_id`` has seen, stamped after ``since_ts``."""
        rows = self.query(node_id, "events") or []
        return [e for e in rows if e.get("kind") == kind and e.get("ts", 0) > since_ts]

    @staticmethod
    def wait(pred: Callable[[], T | None], timeout: float, what: str, every: float = 0.05) -> T:
        """Poll ``pred`` until it returns something truthy, or raise :class:`ClusterError`."""
        return wait_until(pred, timeout, what, every, ClusterError)

    def close(self, grace: float = TERM_GRACE_S) -> None:
        """Stop every child: SIGTERM to each group, wait up to ``grace``, then SIGKILL.

        Nodes go first so they can leave cleanly through the broker, then the broker.
        """
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN)  # a 2nd Ctrl-C must not leak
        try:
            self._stop([c for c in self.nodes.values() if c.proc], grace)
            if self.broker is not None and self.broker.proc is not None:
                self._stop([self.broker], grace)
        finally:
            signal.signal(signal.SIGINT, previous)

    @staticmethod
    def _stop(children: list[Child], grace: float) -> None:
        for child in children:
            assert child.proc is not None
            if child.alive():
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(child.proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        for child in children:
            assert child.proc is not None
            with contextlib.suppress(subprocess.TimeoutExpired):
                child.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            # Kill the whole group even if the leader exited: it may have left children.
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(child.proc.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                child.proc.wait(timeout=grace)
