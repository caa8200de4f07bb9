"""The testbed's state file and the teardown that works from it alone.

``<dir>/testbed.json`` is written *before* anything is created and rewritten as things are
added, so whatever happens to the process holding the testbed (an exception, Ctrl-C, kill -9),
``chaosctl testbed down`` (or the next ``up`` in the same directory) finds out what to remove.
Teardown does not trust the file to be complete either: every name carries the run prefix, so
it also sweeps every namespace and root-namespace link with that prefix, and every process in
those namespaces (:func:`netprobe.netns.cleanup`).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import psutil

from chaosctl.client import CtlError
from netprobe import netns
from netprobe.errors import NetprobeError

STATE_FILE = "testbed.json"
STATE_VERSION = 1
TERM_GRACE_S = 5.0


class TestbedError(CtlError):
    """The testbed could not be built, driven or torn down; the message says why."""

    __test__ = False  # not a pytest test class, despite the name
    exit_code = 1


@dataclass
class ProcRecord:
    """A process the testbed started: ``create_time`` guards against a recycled pid."""

    name: str
    pid: int
    create_time: float
    netns: str


@dataclass
class LinkRecord:
    """One data link: the interface ``dev_a`` in ``a``'s namespace is the peer of ``dev_b``."""

    a: str
    b: str
    dev_a: str
    dev_b: str
    mbit: float


@dataclass
class NodeRecord:
    """One node: its namespace, addresses, and where its chaosd keeps socket and data."""

    ns: str
    addr: str
    mgmt: str
    socket: str
    data_dir: str
    log: str


@dataclass
class TestbedState:
    """Everything one testbed created (see the module docstring)."""

    __test__ = False

    prefix: str
    dir: str
    hub_ns: str
    broker: str
    topology: str
    seed: int
    bw: tuple[float, float]
    redraw_period_s: float = 0.0
    qdisc: str = "tbf"
    cluster: str = "testbed"
    config: str = ""  # more chaosd.toml for every node (a bench's [training] mode, say)
    owner_pid: int = field(default_factory=os.getpid)
    created_at: float = field(default_factory=time.time)
    nodes: dict[str, NodeRecord] = field(default_factory=dict)
    links: list[LinkRecord] = field(default_factory=list)
    procs: list[ProcRecord] = field(default_factory=list)
    version: int = STATE_VERSION

    @property
    def namespaces(self) -> list[str]:
        """Every namespace of the testbed, hub last."""
        return [n.ns for n in self.nodes.values()] + [self.hub_ns]

    def link(self, a: str, b: str) -> LinkRecord:
        """The link between ``a`` and ``b`` (either order).

        Raises:
            TestbedError: There is no such node or no data link between them.
        """
        for name in (a, b):
            if name not in self.nodes:
                raise TestbedError(f"no node {name!r} in this testbed "
                                   f"(nodes: {', '.join(self.nodes)})")
        for rec in self.links:
            if {rec.a, rec.b} == {a, b}:
                return rec
        raise TestbedError(f"{a} and {b} are not neighbours in this testbed")

    def save(self) -> None:
        """Write the file atomically (a reader never sees half of it)."""
        path = Path(self.dir) / STATE_FILE
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(self), indent=2) + "\n")
        os.replace(tmp, path)

    @classmethod
    def load(cls, directory: str | Path) -> TestbedState | None:
        """Read ``<directory>/testbed.json``; None when there is none.

        Raises:
            TestbedError: The file exists but is not a testbed state this version understands.
        """
        path = Path(directory) / STATE_FILE
        try:
            doc: dict[str, Any] = json.loads(path.read_text())
        except FileNotFoundError:
            return None
        except (OSError, json.JSONDecodeError) as exc:
            raise TestbedError(f"cannot read the testbed state {path}: {exc}") from None
        try:
            if doc.get("version") != STATE_VERSION:
                raise TypeError(f"state version {doc.get('version')}")
            doc["bw"] = tuple(doc["bw"])
            doc["nodes"] = {k: NodeRecord(**v) for k, v in doc["nodes"].items()}
            doc["links"] = [LinkRecord(**v) for v in doc["links"]]
            doc["procs"] = [ProcRecord(**v) for v in doc["procs"]]
            return cls(**doc)
        except (KeyError, TypeError) as exc:
            raise TestbedError(f"{path} is not a testbed state this chaosctl understands "
                               f"({exc}); remove it and run `ip netns list` to check") from None


def record(proc_pid: int, name: str, ns: str) -> ProcRecord:
    """A :class:`ProcRecord` for a process that was just started."""
    try:
        created = psutil.Process(proc_pid).create_time()
    except psutil.Error:
        created = 0.0  # already gone; the namespace sweep still covers it
    return ProcRecord(name, proc_pid, created, ns)


def _live(rec: ProcRecord) -> psutil.Process | None:
    try:
        proc = psutil.Process(rec.pid)
        same = abs(proc.create_time() - rec.create_time) < 0.05
        return proc if same and proc.status() != psutil.STATUS_ZOMBIE else None
    except psutil.Error:
        return None


def _in_namespaces(names: list[str]) -> list[psutil.Process]:
    procs = []
    for name in names:
        for pid in netns.netns_pids(name):
            with contextlib.suppress(psutil.Error):
                procs.append(psutil.Process(pid))
    return procs


def _gone(proc: psutil.Process) -> bool:
    try:
        # A zombie has released everything; its parent (maybe not us) reaps it in its own time.
        return not proc.is_running() or proc.status() == psutil.STATUS_ZOMBIE
    except psutil.Error:
        return True


def _wait_gone(procs: list[psutil.Process], timeout: float) -> list[psutil.Process]:
    """Wait until every process in ``procs`` is gone or a zombie; return those that are not."""
    deadline = time.monotonic() + timeout
    alive = [p for p in procs if not _gone(p)]
    while alive and time.monotonic() < deadline:
        time.sleep(0.05)
        alive = [p for p in alive if not _gone(p)]
    return alive


def _signal_all(procs: list[psutil.Process], sig: int) -> None:
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            proc.send_signal(sig)


def stop_processes(state: TestbedState, grace_s: float = TERM_GRACE_S) -> list[int]:
    """SIGTERM every testbed process (nodes before the hub), then SIGKILL what is left.

    The nodes go first so they can still tell the broker they are leaving. Returns the pids
    that were signalled.
    """
    node_ns = [n.ns for n in state.nodes.values()]
    recorded = [p for p in (_live(r) for r in state.procs) if p is not None]
    seen: dict[int, psutil.Process] = {p.pid: p for p in recorded}
    for group in (node_ns, [state.hub_ns]):
        procs = [p for p in recorded if any(r.pid == p.pid and r.netns in group
                                            for r in state.procs)]
        procs += _in_namespaces(group)
        seen.update({p.pid: p for p in procs})
        _signal_all(procs, signal.SIGTERM)
        alive = _wait_gone(procs, grace_s)
        _signal_all(alive, signal.SIGKILL)
        _wait_gone(alive, grace_s)
    return sorted(seen)


def teardown(state: TestbedState, grace_s: float = TERM_GRACE_S) -> netns.CleanupReport:
    """Remove everything ``state`` records, and everything else with its prefix.

    Safe to run twice, or on a state whose testbed was only half built.

    Raises:
        TestbedError: ``ip`` failed (e.g. not root); the state file is kept.
    """
    try:
        pids = stop_processes(state, grace_s)
        report = netns.cleanup(state.prefix)
    except NetprobeError as exc:
        # The state file stays, so the same `down` can be run again once the cause is fixed.
        raise TestbedError(f"tearing down {state.prefix}* failed: {exc}") from None
    report.killed_pids = sorted(set(report.killed_pids) | set(pids))
    for node in state.nodes.values():
        with contextlib.suppress(FileNotFoundError):
            os.unlink(node.socket)
    for extra in ("mosquitto.conf", "redraw.json"):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(Path(state.dir) / extra)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(Path(state.dir) / STATE_FILE)
    return report


def clean_dir(directory: str | Path) -> netns.CleanupReport | None:
    """Tear down a testbed left in ``directory`` (by a crash or a forgotten ``up``), if any."""
    state = TestbedState.load(directory)
    return teardown(state) if state is not None else None
