"""``Testbed``: N chaosd nodes in network namespaces, joined by shaped veth links.

The Python API behind ``chaosctl testbed``, for tests, scripted chaos scenarios and benchmarks::

    with Testbed("/tmp/tb", nodes=4, topology="ring", bw=(100, 1000), seed=1) as tb:
        tb.up()                              # namespaces, links, broker, 4 chaosd, election
        tb.cut("n1", "n2"); tb.heal("n1", "n2"); tb.shape("n1", "n2", 200)
        tb.query("n3", "nodes"); tb.kill("n4")
        tb.exec("n1", ["chaosctl", "join", "--", "python", "train.py"])  # CHAOS_SOCKET is set

Layout: the plan (topology, rates, addresses) is :mod:`chaosctl.testbed.topo`; the network is
:mod:`chaosctl.testbed.net`; the processes :mod:`chaosctl.testbed.procs`; the state file and
teardown :mod:`chaosctl.testbed.state`; the CLI :mod:`chaosctl.testbed.cli`.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
from collections.abc import Callable, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

from chaosctl.client import SOCKET_ENV, ControlFailure, call_once
from chaosctl.cluster import thread_budget
from chaosctl.polling import agreed, wait_until
from chaosctl.testbed import net as net
from chaosctl.testbed import procs as procs
from chaosctl.testbed import topo as topo
from chaosctl.testbed.state import (
    LinkRecord,
    NodeRecord,
    TestbedError,
    TestbedState,
    clean_dir,
    record,
    teardown,
)
from netprobe import netns

T = TypeVar("T")
DEFAULT_DIR = "/tmp/chaos-testbed"


class Testbed:
    """A namespace testbed, owned by this object until :meth:`down` (or the ``with`` exit).

    Args:
        directory: Run directory: state file, logs, sockets, data dirs.
        nodes: Number of nodes ``n1..nN``.
        topology: ``line``, ``ring``, ``star``, ``full`` or ``random``.
        bw: Link bandwidth range in Mbit/s; each link draws from it.
        seed: Seed for the topology and the bandwidths.
        degree: Neighbours per new node in ``random``.
        redraw_period_s: Redraw every link's bandwidth this often (0: never).
        qdisc: ``tbf`` or ``htb``.
        run_id: Run id for the name prefix (random by default).
        config: More chaosd.toml text for every node (tables after the secret).
    """

    __test__ = False  # not a pytest test class, despite the name

    def __init__(self, directory: str | Path = DEFAULT_DIR, nodes: int = 4,
                 topology: str = "random", bw: tuple[float, float] = (100.0, 1000.0),
                 seed: int = 0, degree: int = topo.DEFAULT_DEGREE, redraw_period_s: float = 0.0,
                 qdisc: str = "tbf", run_id: str | None = None, config: str = "") -> None:
        if qdisc not in ("tbf", "htb"):
            raise topo.TopologyError(f"--qdisc must be tbf or htb, not {qdisc!r}")
        self.dir = Path(directory).resolve()
        plan = topo.Plan.make(nodes, topology, bw, seed, degree)
        prefix = netns.make_prefix(run_id)
        self.state = TestbedState(prefix=prefix, dir=str(self.dir), hub_ns=prefix + "hub",
                                  broker=procs.broker_url(), topology=topology, seed=seed, bw=bw,
                                  redraw_period_s=redraw_period_s, qdisc=qdisc,
                                  config=config)
        for name in plan.nodes:
            self.state.nodes[name] = NodeRecord(
                ns=prefix + name, addr=topo.data_addr(name), mgmt=topo.mgmt_addr(name),
                socket=str(self.dir / f"{name}.sock"), data_dir=str(self.dir / name),
                log=str(self.dir / f"{name}.log"))
        self.state.links = [LinkRecord(a, b, topo.link_dev(b), topo.link_dev(a),
                                       plan.rates[(a, b)]) for a, b in plan.links]
        self.children: dict[str, subprocess.Popen[bytes]] = {}

    @classmethod
    def attach(cls, directory: str | Path = DEFAULT_DIR) -> Testbed:
        """Drive a testbed that another process brought up, through its state file.

        Raises:
            TestbedError: There is no testbed state in ``directory``.
        """
        state = TestbedState.load(directory)
        if state is None:
            raise TestbedError(f"no testbed in {directory} (no testbed.json; "
                               "start one with 'chaosctl testbed up')")
        tb = cls.__new__(cls)
        tb.dir, tb.state, tb.children = Path(state.dir), state, {}
        return tb

    def __enter__(self) -> Testbed:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.down()

    # -- life cycle ---------------------------------------------------------------------------

    def up(self, wait_s: float = 30.0, start_daemons: bool = True) -> None:
        """Build the network, start the broker and every chaosd, and wait for one scheduler.

        A testbed left in the same directory by a crashed run is torn down first. On any
        failure (or Ctrl-C) everything built so far is removed before the error propagates.

        Raises:
            TestbedError: A requirement is missing, or a step failed (the message says which).
        """
        problems = procs.requirements(self.state.qdisc)
        if problems:
            raise TestbedError("cannot build a testbed: " + "; ".join(problems))
        clean_dir(self.dir)
        # A new testbed has new nodes: the data dirs a testbed before it left in this
        # directory (its scheduler's term, its job) made every chaosd wait out its orphan
        # delay (20 s) for a cluster that was gone before it stood for election.
        for rec in self.state.nodes.values():
            shutil.rmtree(rec.data_dir, ignore_errors=True)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.state.save()  # before anything exists, so a crash from here on is recoverable
        try:
            net.build(self.state)
            self.start_broker()
            if self.state.redraw_period_s > 0:
                self._start("redraw", self.state.hub_ns, procs.redraw_argv(self.state),
                            self.dir / "redraw.log")
            if start_daemons:
                for node in self.state.nodes:
                    self.start_node(node, save=False)
            self.state.save()
            if start_daemons:
                self.wait(lambda: self.agreed(), wait_s, "every node to agree on a scheduler")
        except BaseException:
            self.down()
            raise

    def down(self, grace_s: float = 5.0) -> netns.CleanupReport:
        """Stop every process, delete every namespace and veth, remove sockets and the state."""
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN)  # a 2nd Ctrl-C must not leak
        try:
            report = teardown(self.state, grace_s)
            for child in self.children.values():
                with contextlib.suppress(subprocess.TimeoutExpired):
                    child.wait(timeout=grace_s)  # reap our own children: no zombies either
            self.children.clear()
            return report
        finally:
            signal.signal(signal.SIGINT, previous)

    # -- processes ----------------------------------------------------------------------------

    def _start(self, name: str, ns: str, argv: list[str], log: Path,
               env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        child = procs.spawn(ns, argv, log, env, cwd=self.dir)
        self.children[name] = child
        self.state.procs = [p for p in self.state.procs if p.name != name]
        self.state.procs.append(record(child.pid, name, ns))
        return child

    def start_broker(self) -> None:
        """Start (or restart) mosquitto in the hub and wait until it listens."""
        log = self.dir / "broker.log"
        child = self._start("broker", self.state.hub_ns, procs.broker_argv(self.state), log)
        self.state.save()
        procs.wait_broker(child, log)

    def stop_broker(self, sig: int = signal.SIGTERM) -> None:
        """Stop the broker (the nodes keep running and reconnect when it is back)."""
        self.kill("broker", sig)

    def start_node(self, node: str, save: bool = True) -> None:
        """Start (or restart) chaosd in ``node``'s namespace."""
        rec = self._node(node)
        child = self.children.get(node)
        if child is not None and child.poll() is None:
            raise TestbedError(f"chaosd on {node} is already running (pid {child.pid})")
        Path(rec.data_dir).mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(rec.socket)  # a socket left by a killed daemon
        # Its workers inherit its environment: each emulated box gets its share of the cores
        # (a worker with torch's default threads spins them between ops).
        self._start(node, rec.ns, procs.chaosd_argv(self.state, node), Path(rec.log),
                    env=thread_budget(len(self.state.nodes)))
        if save:
            self.state.save()

    def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
        """Send ``sig`` to a node's chaosd (or to ``broker``), and reap it if that killed it."""
        pid = self.pid_of(name)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)
        child = self.children.get(name)
        if child is not None and sig in (signal.SIGKILL, signal.SIGTERM):
            with contextlib.suppress(subprocess.TimeoutExpired):
                child.wait(timeout=10)

    def pid_of(self, name: str) -> int:
        """The pid of a node's chaosd, or of ``broker``/``redraw``."""
        for rec in self.state.procs:
            if rec.name == name:
                return rec.pid
        raise TestbedError(f"no process {name!r} in this testbed")

    def exec(self, node: str, argv: Sequence[str], **popen_kwargs: Any) -> subprocess.Popen[bytes]:
        """Start ``argv`` inside ``node``'s namespace with ``CHAOS_SOCKET`` naming its chaosd.

        The caller owns the Popen. Whatever is still running at :meth:`down` is killed with the
        namespace. This is the path for training workers: ``exec(n, ["chaosctl", "join", "--",
        ...])`` has the node's own chaosd supervise the worker.
        """
        rec = self._node(node)
        env = {**os.environ, **popen_kwargs.pop("env", {}), SOCKET_ENV: rec.socket,
               "CHAOS_NODE_ID": node}
        return netns.exec_in(rec.ns, list(argv), env=env, **popen_kwargs)

    def join(self, node: str, command: Sequence[str],
             neighbors: Sequence[str] | None = None, timeout: float = 30.0) -> Any:
        """Ask ``node``'s chaosd to join and supervise ``command`` as its training worker.

        The worker runs in the node's namespace because its chaosd does. ``neighbors``
        defaults to the node's testbed neighbours, so the overlay follows the data links.

        Raises:
            CtlError: The daemon refused or did not answer (the daemon's own message).
        """
        args = {"neighbors": list(self.neighbours(node) if neighbors is None else neighbors),
                "command": list(command)}
        return call_once(self.socket_of(node), "join", args, timeout=timeout)

    # -- links --------------------------------------------------------------------------------

    def cut(self, a: str, b: str) -> None:
        """Cut the data link a-b: each address becomes unreachable from the other."""
        net.set_up(self.state, self.state.link(a, b), False)

    def heal(self, a: str, b: str) -> None:
        """Restore a link cut with :meth:`cut`."""
        net.set_up(self.state, self.state.link(a, b), True)

    def shape(self, a: str, b: str, mbit: float) -> None:
        """Set the bandwidth of link a-b (both directions) to ``mbit`` Mbit/s."""
        net.shape(self.state, self.state.link(a, b), mbit)

    def link_info(self) -> list[net.LinkInfo]:
        """Every data link as the kernel has it now (up or cut, rate)."""
        return [net.link_info(self.state, rec) for rec in self.state.links]

    # -- queries ------------------------------------------------------------------------------

    @property
    def nodes(self) -> list[str]:
        """Node names in order."""
        return list(self.state.nodes)

    @property
    def links(self) -> list[tuple[str, str]]:
        """The data links (a, b), a before b."""
        return [(r.a, r.b) for r in self.state.links]

    def neighbours(self, node: str) -> list[str]:
        """The nodes with a data link to ``node``."""
        return topo.neighbours(self.links, node)

    def addr_of(self, node: str) -> str:
        """The node's data address (what its chaosd advertises)."""
        return self._node(node).addr

    def ns_of(self, node: str) -> str:
        """The node's namespace name."""
        return self._node(node).ns

    def socket_of(self, node: str) -> Path:
        """The node's chaosd control socket."""
        return Path(self._node(node).socket)

    def query(self, node: str, op: str, args: dict[str, Any] | None = None,
              timeout: float = 2.0) -> Any:
        """Ask ``node``'s chaosd; None when it does not answer well (for polling loops)."""
        try:
            return call_once(self.socket_of(node), op, args, timeout=timeout)
        except ControlFailure:
            return None

    def agreed(self, nodes: list[str] | None = None) -> tuple[str, int] | None:
        """``(scheduler, term)`` when every node in ``nodes`` names it and sees them all."""
        return agreed(self.query, self.nodes if nodes is None else nodes)

    @staticmethod
    def wait(pred: Callable[[], T | None], timeout: float, what: str, every: float = 0.1) -> T:
        """Poll ``pred`` until it returns something truthy, or raise :class:`TestbedError`."""
        return wait_until(pred, timeout, what, every, TestbedError)

    def _node(self, node: str) -> NodeRecord:
        try:
            return self.state.nodes[node]
        except KeyError:
            raise TestbedError(f"no node {node!r} in this testbed "
                               f"(nodes: {', '.join(self.state.nodes)})") from None
