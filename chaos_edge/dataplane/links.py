"""PeerLinks: authenticated, persistent TCP connections to this node's neighbours only.

One listening socket accepts neighbours; ``connect_to`` dials them. Each connection is
authenticated (``auth.py``) and then served by one reader thread that decodes frame headers
and asks the handler registered for the frame's kind where the payload goes, so payloads land
directly in their final buffers, and one writer thread that sends the frames queued with
``post`` (or ``send``, which waits until its frame is written) in order. A malformed frame, an
EOF or a socket error closes only that connection; the loss becomes link state
(``state(peer) == "down"``) and a listener callback, never an exception in a background thread.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Callable, Iterable
from typing import Literal

from chaos_edge.dataplane import auth
from chaos_edge.dataplane.conn import Done, FrameHandler, Link, LinkConfig, Outgoing
from chaos_edge.dataplane.errors import AuthError, DataPlaneError, PeerGone
from chaos_edge.dataplane.frames import FrameHeader, Kind, encode_header
from chaos_edge.dataplane.sockets import set_buffers, tune_established
from chaos_edge.dataplane.threads import ThreadSet

log = logging.getLogger("chaos.dataplane.links")

#: The longest a new link waits for the listeners of the peer's lost one (a bound only
#: against a listener that hangs: they take a lock and return).
TELL_WAIT_S = 10.0
LinkState = Literal["up", "down", "unknown"]
DownListener = Callable[[str, str], None]


class PeerLinks:
    """Authenticated connections of one node to its neighbours.

    Args:
        node_id: This node's id.
        cluster: Cluster name.
        secret: The cluster's shared secret.
        is_member: Called for every authenticated incoming peer; False refuses it.
        host: Address to listen on.
        port: Port to listen on (0 picks a free one; see ``address``).
        config: Tuning knobs.
    """

    def __init__(
        self,
        node_id: str,
        cluster: str,
        secret: bytes,
        *,
        is_member: Callable[[str], bool],
        host: str = "127.0.0.1",
        port: int = 0,
        config: LinkConfig | None = None,
    ) -> None:
        self.me = auth.Identity(node_id, cluster, secret, auth.new_incarnation())
        self.config = config or LinkConfig()
        self._is_member, self._bind = is_member, (host, port)
        self._lock = threading.Condition()
        self._links: dict[str, Link] = {}
        self._down: dict[str, str] = {}
        # Per peer: dropped links whose down listeners are still being told. A new link to
        # the peer waits for them, so no listener hears a stale loss while it is up.
        self._telling: dict[str, int] = {}
        self._allowed: set[str] = set()
        self._handlers: dict[Kind, FrameHandler] = {}
        self._listeners: list[DownListener] = []
        self._threads = ThreadSet()
        self._listener: socket.socket | None = None
        self._closing = threading.Event()
        self._pending = threading.BoundedSemaphore(self.config.max_pending)

    # -- lifecycle -------------------------------------------------------------------------
    def start(self) -> tuple[str, int]:
        """Bind and listen; returns the (host, port) that neighbours should dial."""
        lsock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        lsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        set_buffers(lsock, self.config.sock_buf)  # inherited by accepted sockets
        lsock.bind(self._bind)
        lsock.listen(64)
        lsock.settimeout(self.config.io_poll)
        self._listener = lsock
        self._spawn(self._accept_loop, "dp-accept")
        return self.address

    @property
    def address(self) -> tuple[str, int]:
        """The listening (host, port)."""
        if self._listener is None:
            raise DataPlaneError("PeerLinks.start() has not been called")
        host, port = self._listener.getsockname()[:2]
        return str(host), int(port)

    def close(self) -> None:
        """Stop accepting, close every link, and join the threads (bounded)."""
        self._closing.set()
        if self._listener is not None:
            self._listener.close()
        for peer in list(self._links):
            self.disconnect(peer, reason="shutting down")
        self._threads.join(2 * self.config.io_poll + 1.0)

    def __enter__(self) -> PeerLinks:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def set_identity(self, node_id: str, cluster: str, secret: bytes) -> None:
        """Set who we are, for a listener started before the credentials were known.

        A worker must advertise its listening address to learn its id and the cluster secret;
        no handshake can succeed before this call, because nobody else knows the placeholder.

        Raises:
            DataPlaneError: A link is already up.
        """
        with self._lock:
            new = auth.Identity(node_id, cluster, secret, self.me.incarnation)
            if new == self.me:
                return  # a rejoin attaches again as the same node: its links stay valid
            if self._links:
                raise DataPlaneError("cannot change identity while links are up")
            self.me = new

    # -- neighbours ------------------------------------------------------------------------
    def allow(self, *peers: str) -> None:
        """Let these peers connect to us (they must also pass ``is_member``)."""
        with self._lock:
            self._allowed.update(peers)

    def set_allowed(self, peers: Iterable[str]) -> None:
        """Replace the neighbour set; links to peers no longer in it are closed."""
        with self._lock:
            self._allowed = set(peers)
            gone = [p for p in self._links if p not in self._allowed]
        for peer in gone:
            self.disconnect(peer, reason="no longer a neighbour")

    def connect_to(self, peer: str, host: str, port: int) -> None:
        """Dial and authenticate a neighbour (no-op if a live link exists).

        Raises:
            AuthError: The peer failed or refused the handshake.
            PeerGone: The TCP connection could not be established.
        """
        self.allow(peer)
        if self.state(peer) == "up":
            return
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        set_buffers(sock, self.config.sock_buf)
        sock.settimeout(self.config.connect_timeout)
        try:
            sock.connect((host, port))
            hello = auth.initiate(sock, self.me, peer, self.config.handshake_timeout)
        except OSError as exc:
            sock.close()
            raise PeerGone(peer, f"cannot connect to {host}:{port}: {exc}") from None
        except AuthError as exc:
            sock.close()
            log.warning("connection to %s at %s:%d refused: %s", peer, host, port, exc)
            raise
        self._register(sock, hello, initiator=self.me.node_id)

    def disconnect(self, peer: str, reason: str = "disconnected locally") -> None:
        """Close the link to ``peer`` and stop accepting it."""
        with self._lock:
            self._allowed.discard(peer)
            link = self._links.get(peer)
        if link is not None:
            self._drop(link, reason)

    def state(self, peer: str) -> LinkState:
        """``up``, ``down`` (a link existed and was lost or closed) or ``unknown``."""
        with self._lock:
            if peer in self._links:
                return "up"
            return "down" if peer in self._down else "unknown"

    def connected(self) -> frozenset[str]:
        """Peers with a live link."""
        with self._lock:
            return frozenset(self._links)

    def traffic(self) -> tuple[int, int]:
        """Bytes ``(sent, received)`` over the live links, frame headers included (a link's
        count starts when it comes up)."""
        with self._lock:
            links = list(self._links.values())
        return sum(lk.sent_bytes for lk in links), sum(lk.received_bytes for lk in links)

    def wait_connected(self, peers: Iterable[str], timeout: float) -> bool:
        """Wait until every peer in ``peers`` has a live link; False on timeout."""
        want = set(peers)
        with self._lock:
            return self._lock.wait_for(lambda: want <= self._links.keys(), timeout)

    def register_handler(self, kinds: Iterable[Kind], handler: FrameHandler) -> None:
        """Route frames of ``kinds`` to ``handler`` (frames of other kinds are discarded)."""
        for kind in kinds:
            self._handlers[kind] = handler

    def add_down_listener(self, listener: DownListener) -> None:
        """Call ``listener(peer, reason)`` (from a link thread) whenever a link goes down."""
        self._listeners.append(listener)

    def send(
        self,
        peer: str,
        header: FrameHeader,
        payload: bytes | memoryview = b"",
        deadline: float | None = None,
    ) -> None:
        """Send one frame to ``peer`` (after the frames queued before it), giving up at
        ``deadline`` (``time.monotonic()``); returns once the frame is written.

        Raises:
            PeerGone: No live link, or the send failed or stalled (the link is then closed,
                because a partial or late frame would break its framing or ordering).
        """
        link = self._live(peer)
        sent = threading.Event()
        ok = [False]

        def done(written: bool) -> None:
            ok[0] = written
            sent.set()

        if not link.post(Outgoing(encode_header(header), payload, deadline, None, done)):
            raise PeerGone(peer, self._down.get(peer, "link closed"))
        # The writer enforces the deadline while it writes; the slack covers its poll.
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        if not sent.wait(None if left is None else left + 2 * self.config.io_poll + 1.0):
            self._drop(link, "send stalled past the deadline")
            sent.wait(2 * self.config.io_poll + 1.0)
        if not ok[0]:
            raise PeerGone(peer, self._down.get(peer, "link lost while sending"))

    def post(
        self,
        peer: str,
        header: FrameHeader,
        payload: bytes | memoryview,
        deadline: float | None,
        live: Callable[[], bool] | None = None,
        done: Done | None = None,
    ) -> None:
        """Queue one frame for ``peer``'s writer thread and return at once.

        Frames go out in the order they were queued (``send`` included). ``payload`` must
        stay unchanged until ``done(True)``. ``live()`` is checked just before writing; False
        drops the frame (``done(False)``), as does losing the link: a failed write closes the
        link, and the down listeners hear of it.

        Raises:
            PeerGone: No live link.
        """
        link = self._live(peer)
        if not link.post(Outgoing(encode_header(header), payload, deadline, live, done)):
            raise PeerGone(peer, self._down.get(peer, "link closed"))

    def _live(self, peer: str) -> Link:
        link = self._links.get(peer)  # one atomic dict read: no lock on the per-chunk path
        if link is None:
            with self._lock:
                raise PeerGone(peer, self._down.get(peer, "not connected"))
        return link

    # -- internals -------------------------------------------------------------------------
    def _spawn(self, target: Callable[..., None], name: str, *args: object) -> None:
        self._threads.start(target, name, *args)

    def _may_accept(self, peer: str) -> bool:
        try:
            member = bool(self._is_member(peer))
        except Exception:
            log.exception("is_member(%r) failed; refusing", peer)
            return False
        with self._lock:
            return member and peer in self._allowed and not self._closing.is_set()

    def _accept_loop(self) -> None:
        assert self._listener is not None
        while not self._closing.is_set():
            try:
                sock, addr = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                break  # listener closed
            if not self._pending.acquire(blocking=False):
                log.warning("dropping connection from %s: too many pending handshakes", addr)
                sock.close()
                continue
            self._spawn(self._handshake, "dp-handshake", sock, addr)

    def _handshake(self, sock: socket.socket, addr: tuple[str, int]) -> None:
        try:
            hello = auth.accept(sock, self.me, self._may_accept, self.config.handshake_timeout)
        except AuthError as exc:
            log.warning("refused data-plane connection from %s:%d: %s", addr[0], addr[1], exc)
            sock.close()
            return
        finally:
            self._pending.release()
        self._register(sock, hello, initiator=hello.node_id)

    def _register(self, sock: socket.socket, hello: auth.PeerHello, initiator: str) -> None:
        tune_established(sock, self.config.io_poll)
        link = Link(hello.node_id, sock, initiator, hello.incarnation)
        with self._lock:
            # A loss the listeners hear after this link is up would be taken for this one's
            # (a round on it aborted for nothing): let them hear it first.
            self._lock.wait_for(lambda: not self._telling.get(link.peer), TELL_WAIT_S)
            old = self._links.get(link.peer)
            # Both ends dialled at once: both keep the connection the smaller id opened.
            duplicate = old is not None and old.incarnation == link.incarnation
            if duplicate and old is not None and old.initiator == min(self.me.node_id, link.peer):
                sock.close()
                return
            if self._closing.is_set():
                sock.close()
                return
            self._links[link.peer] = link
            self._down.pop(link.peer, None)
            self._lock.notify_all()
        if old is not None:
            self._drop(old, "replaced by a newer connection", forget=False)
        log.info("link to %s up (opened by %s)", link.peer, initiator)
        self._spawn(self._write_loop, f"dp-write-{link.peer}", link)
        self._spawn(self._read_loop, f"dp-read-{link.peer}", link)

    def _drop(self, link: Link, reason: str, forget: bool = True) -> None:
        with self._lock:
            if self._links.get(link.peer) is link and forget:
                del self._links[link.peer]
                self._down[link.peer] = reason
                self._lock.notify_all()
            first = not link.closed.is_set()
            link.closed.set()
            if first:
                self._telling[link.peer] = self._telling.get(link.peer, 0) + 1
        link.shutdown()
        if not first:
            return
        log.info("link to %s down: %s", link.peer, reason)
        try:
            for listener in list(self._listeners):
                try:
                    listener(link.peer, reason)
                except Exception:
                    log.exception("link-down listener failed")
        finally:
            with self._lock:
                left = self._telling.pop(link.peer) - 1
                if left:
                    self._telling[link.peer] = left
                self._lock.notify_all()

    def _write_loop(self, link: Link) -> None:
        reason = "writer stopped"
        try:
            reason = link.write_loop(self.config.io_poll)  # never raises
        finally:
            self._drop(link, reason)
            link.drain()

    def _read_loop(self, link: Link) -> None:
        reason = "reader stopped"
        try:
            reason = link.read_loop(self._handlers)  # never raises
        finally:
            self._drop(link, reason)
            link.sock.close()
