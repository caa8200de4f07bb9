"""The worker's link to its daemon: polling, commands, links to neighbours, exit signals.

:class:`Session` owns the control-socket client, the PeerLinks and the policy book. Its
:class:`Poller` polls chaosd on a thread of its own; at each step boundary the training thread
takes in what it fetched, turning it into policies and command effects
(``connect``/``disconnect``; ``replicate`` and ``bootstrap`` wait in
:meth:`Session.take_replications` for the Trainer's joiner and source), and keeps the tree
links up (the lower id dials). Reports from any thread are queued and sent with the next poll.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from types import FrameType
from typing import Any

from typing_extensions import assert_never

from chaos_edge.dataplane import AuthError, PeerGone, PeerLinks
from chaos_edge.dataplane.threads import ThreadSet
from chaos_edge.trainer.control import TrainerError
from chaos_edge.trainer.policy import PolicyBook, parse_addr
from chaos_edge.trainer.poller import Poller
from daemon.contracts.control import ControlClient
from daemon.contracts.errors import ControlFailure
from daemon.contracts.policy import SyncPolicy
from daemon.contracts.protocol import (
    Bootstrap,
    Connect,
    Disconnect,
    LinkFailed,
    Replicate,
    WorkerCommand,
    WorkerReport,
)

log = logging.getLogger("chaos.trainer")
EXIT_EVENT = threading.Event()
DIAL_RETRY_S = 0.2
DIAL_FOR_S = 30.0


def install_signal_handlers() -> None:
    """SIGINT/SIGTERM set the exit flag; a second SIGINT interrupts at once (main thread only)."""
    if threading.current_thread() is not threading.main_thread():
        return

    def on_signal(signum: int, frame: FrameType | None) -> None:
        if EXIT_EVENT.is_set() and signum == signal.SIGINT:
            raise KeyboardInterrupt  # the second Ctrl-C: the user wants out now
        EXIT_EVENT.set()

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)


@dataclass(frozen=True)
class ReplicationLimits:
    """chaosd's ``[replication]`` settings that a worker follows (from ``worker.attach``).

    Attributes:
        serve_bps: Cap, in bytes/s, on what a source sends one new node (None: uncapped).
        probe_min_bytes: A joiner measures unmeasured source links only for a state this big.
        reserve_bytes: Memory a source's snapshot must leave available (the memory guard).
    """

    serve_bps: float | None = None
    probe_min_bytes: int = 16 << 20
    reserve_bytes: int = 256 << 20

    @classmethod
    def from_attach(cls, doc: Mapping[str, Any]) -> ReplicationLimits:
        """The limits in ``worker.attach``'s ``replication`` section (MiB and Mbit/s)."""
        mbps = doc.get("serve_mbps") or 0
        return cls(serve_bps=float(mbps) * 1e6 / 8 if mbps else None,
                   probe_min_bytes=int(float(doc.get("probe_min_mib", 16)) * (1 << 20)),
                   reserve_bytes=int(float(doc.get("snapshot_reserve_mib", 256)) * (1 << 20)))


class Session:
    """Everything between the Trainer and the outside world.

    Args:
        socket: Control socket path (default ``$CHAOS_SOCKET``).
        call_timeout: Seconds one control call may take.
    """

    def __init__(self, socket: str | os.PathLike[str] | None, call_timeout: float) -> None:
        self.client = ControlClient(socket, call_timeout)
        self.book = PolicyBook()
        # Bind where told (CHAOS_DATA_BIND), else everywhere; an empty host in worker.attach
        # makes the daemon advertise its own --advertise address for us.
        self.bind = os.environ.get("CHAOS_DATA_BIND", "0.0.0.0")
        # The credentials come from worker.attach, which needs our address first: listen under
        # a placeholder identity that no peer can authenticate against, then set the real one.
        self.links = PeerLinks("unattached", "unattached", os.urandom(32),
                               is_member=self._admit, host=self.bind)  # fmt: skip
        self.host, self.port = self.links.start()
        self.limits = ReplicationLimits()  # chaosd's, from worker.attach
        #: Whether ``peer`` is a new node this worker is to serve (it may dial us for the
        #: state before a policy names it); set by the Trainer to its source's ``knows``.
        self.serves: Callable[[str], bool] = lambda peer: False
        self.node_id = ""
        self._replications: list[Replicate | Bootstrap] = []  # not yet taken
        self.leave_requested = False
        self._lock = threading.Lock()
        self._reports: list[WorkerReport] = []
        self._wanted: dict[str, tuple[str, int]] = {}  # peers we keep linked, and their address
        self._dialing: set[str] = set()
        self._quiet_down: set[str] = set()  # peers we disconnected on purpose
        self._outside = False  # the newest policy leaves this node out (it was dropped)
        # Peers to disconnect once no round needs them, and the policy the drop came with.
        self._closing: dict[str, int] = {}
        self._closed = threading.Event()
        self._threads = ThreadSet()  # dialers
        self.links.add_down_listener(self._on_down)
        self.poller = Poller(self.client, self.flush_reports)

    def attach(self, step: int = 0) -> dict[str, Any]:
        """``worker.attach`` (which asks to join, saying we hold the state of ``step``; 0: a
        fresh model); sets this node's identity on the data plane."""
        data = self.client.call(
            "worker.attach",
            {"pid": os.getpid(), "host": "" if self.host == "0.0.0.0" else self.host,
             "port": self.port, "step": step},
        )
        try:
            node, cluster, secret = str(data["node"]), str(data["cluster"]), str(data["secret"])
            self.links.set_identity(node, cluster, bytes.fromhex(secret))
        except (KeyError, TypeError, ValueError) as exc:
            raise TrainerError(f"chaosd sent a malformed worker.attach reply: {exc!r}") from None
        self.node_id = node
        self.limits = ReplicationLimits.from_attach(data.get("replication") or {})
        self.poller.start()
        return dict(data)

    def poll(self, step: int, state: str, version: int = -1) -> SyncPolicy | None:
        """Publish our position (``version``: the policy our last committed round ran under)
        and take in what the poller fetched (no I/O on this path): policies, commands, a
        leave request. Returns the newest new policy.

        Raises:
            ControlFailure: chaosd stopped answering the poller.
        """
        self.poller.position = (step, state)
        self.poller.version = version
        policies, commands, leave = self.poller.take()
        new = None
        for pub in policies:
            added = self.book.put(pub)
            if added is not None and (new is None or added.version > new.version):
                new = added
        if new is not None:
            self._follow_tree(new)
            newest = self.book.newest
            self._outside = newest is not None and self.node_id not in newest.members
        for cmd in commands:
            self._command(cmd)
        if leave:
            self.leave_requested = True
            EXIT_EVENT.set()
        return new

    def take_replications(self) -> list[Replicate | Bootstrap]:
        """The ``replicate`` and ``bootstrap`` commands taken in since the last call, oldest
        first (a newer command for a node has replaced the older ones)."""
        out, self._replications = self._replications, []
        return out

    def wait(self, timeout: float) -> None:
        """Sleep up to ``timeout``, waking early when the poller fetched something new."""
        self.poller.wait(timeout)

    def drop(self, peers: Iterable[str], reason: str) -> None:
        """Close the links to ``peers`` now: a policy that governs the round in flight no
        longer has them as members (a failure). A send blocked on a silent peer returns, and
        no ``link-failed`` report follows; a connect command brings a link back."""
        for peer in peers:
            self._quiet_down.add(peer)
            self._closing.pop(peer, None)
            self._wanted.pop(peer, None)
            self.links.disconnect(peer, reason=reason)

    def report(self, rep: WorkerReport) -> None:
        """Queue a ``worker.report``; the poller sends it at once (safe from any thread)."""
        with self._lock:
            self._reports.append(rep)
        self.poller.wake()

    def flush_reports(self) -> None:
        """Send queued reports; a report that fails is dropped with a log line."""
        with self._lock:
            reports, self._reports = self._reports, []
        outside = self._outside  # set by the training thread; the book is its alone
        for rep in reports:
            if isinstance(rep, LinkFailed) and (outside or self.links.state(rep.peer) == "up"):
                # Up: a duplicate connection was dropped, the link itself is up. Outside the
                # newest policy: the links closed because this node was dropped, and the
                # scheduler, reading the report after our rejoin, would cut the new links.
                continue
            try:
                self.client.call("worker.report", rep.to_args())
            except ControlFailure as exc:
                log.warning("dropping report %s: %s", rep.KIND, exc)

    def close(self) -> None:
        """Stop the poller, close links and the control connection."""
        self._closed.set()
        self.poller.stop(self.client.timeout + 1.0)
        self._threads.join(DIAL_RETRY_S + 1.0)  # dialers see _closed and stop
        self.links.close()
        self.client.close()

    # -- commands and links ----------------------------------------------------------------
    def _command(self, cmd: WorkerCommand) -> None:
        if isinstance(cmd, Connect):
            self.want(cmd.peer, cmd.addr)
        elif isinstance(cmd, Disconnect):
            # Closed at the step boundary where no governing policy needs it any more
            # (settle): the policy without the link takes effect at a later step, and
            # closing at once left the rounds before it without a tree edge, aborting
            # and rerunning the same step under the same policy for ever.
            self._closing[cmd.peer] = cmd.policy_version
        elif isinstance(cmd, (Replicate, Bootstrap)):
            if cmd.new != self.node_id:
                self.links.allow(cmd.new)  # the new node may dial us for the state
            # A newer command for the same node supersedes the older ones.
            self._replications = [r for r in self._replications if r.new != cmd.new]
            self._replications.append(cmd)
        else:
            assert_never(cmd)

    def settle(self, next_step: int) -> None:
        """Close the links we were told to drop once no policy that governs round
        ``next_step`` or a later one has them as tree edges. A policy published before the
        drop may still be waiting to take effect with the link (a link added and removed
        in quick succession): closing it then stalls that round until it times out."""
        if not self._closing:
            return  # the usual step: nothing to close, no tree walk on the step's path
        needed = {peer for p in self.book.governing_from(next_step) if self.node_id in p.members
                  for peer in (p.parent(self.node_id), *p.children(self.node_id)) if peer}
        known = self.book.newest_version
        for peer, version in list(self._closing.items()):
            # Not before we hold the policy the drop came with: a policy published just
            # before it, still on its way to us, may route a coming round over this link.
            if peer in needed or version > known:
                continue
            del self._closing[peer]
            self._wanted.pop(peer, None)
            self._quiet_down.add(peer)
            self.links.disconnect(peer, reason="disconnect-link")

    def want(self, peer: str, addr: str) -> None:
        """Keep a link to ``peer``; the lower id dials, the other end accepts."""
        self._closing.pop(peer, None)
        self._quiet_down.discard(peer)
        self.links.allow(peer)
        self._wanted[peer] = parse_addr(addr)
        # Only the lower id dials, even for a new node and its sources: when both ends dialled,
        # frames sent on the connection that lost the tie were dropped with it.
        if self.node_id < peer:
            self._dial(peer)

    def _follow_tree(self, pub: SyncPolicy) -> None:
        if self.node_id not in pub.members:
            return
        p = pub
        for peer in (*((p.parent(self.node_id),) if p.parent(self.node_id) else ()),
                     *p.children(self.node_id)):  # fmt: skip
            addr = pub.addrs.get(peer) if peer else None
            if peer and addr and peer not in self._wanted:
                self.want(peer, addr)

    def _dial(self, peer: str) -> None:
        with self._lock:
            if peer in self._dialing:
                return
            self._dialing.add(peer)
        self._threads.start(self._dial_loop, f"dial-{peer}", peer)

    def _dial_loop(self, peer: str) -> None:
        # The peer may not know we are a member yet (its policy lags ours): retry, bounded.
        deadline = time.monotonic() + DIAL_FOR_S
        try:
            while not self._closed.is_set() and time.monotonic() < deadline:
                addr = self._wanted.get(peer)
                if addr is None or self.links.state(peer) == "up":
                    return
                try:
                    self.links.connect_to(peer, *addr)
                    return
                except (AuthError, PeerGone) as exc:
                    log.debug("dialling %s: %s", peer, exc)
                self._closed.wait(DIAL_RETRY_S)
        finally:
            with self._lock:
                self._dialing.discard(peer)

    def redial(self) -> None:
        """Re-dial wanted links that are down (after an abort)."""
        for peer in list(self._wanted):
            if self.links.state(peer) != "up" and self.node_id < peer:
                self._dial(peer)

    def _admit(self, peer: str) -> bool:
        return self.book.knows(peer) or self.serves(peer) or peer in self._wanted

    def _on_down(self, peer: str, reason: str) -> None:
        if peer in self._quiet_down or self._closed.is_set() or self.links.state(peer) == "up":
            return  # on purpose, or one of two connections (both ends dialled) was dropped
        self.report(LinkFailed(peer=peer, reason=reason[:200]))
