"""The scale-out rendezvous on the peer links: a new node asks its sources, each offers.

It runs on the authenticated PeerLinks link. One :class:`StateTransfer` per worker handles
both sides: the :class:`~chaos_edge.trainer.source.Source` offers through it (and owns it),
the :class:`~chaos_edge.trainer.joiner.Joiner` asks through it. The new node sends
``STATE_REQ`` (the step it wants, in ``aux``) to each source. A source answers once it holds
a snapshot of that step or a later one: ``STATE_MANIFEST`` carries ``{"port", "manifest"}``,
where ``port`` is a :class:`~chaos_edge.replication.transfer.serve.StateServer` that the
source runs for this one new node. ``STATE_END`` carries the reason it cannot serve. The bytes
then move on the replication wire (:mod:`chaos_edge.replication.transfer.fetch`): the planned
ranges from every source at once, each block verified as it lands, and a failed source's
undelivered bytes re-planned onto the others.

A source serves from the snapshot it took at the step boundary, on the server's own threads,
while its training loop goes on with the next steps (the overlap of the paper's Fig. 5). Its
extra memory is that one copy of the state plus the server's bounded overhead (see
:mod:`chaos_edge.replication.transfer.serve`); the copy is dropped once the new node trains
with us. The memory guard (:func:`snapshot_room`) declines to take the copy when it would
leave less than ``snapshot_reserve_mib`` available; the new node then plans with its other
sources.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Container, Iterable, Sequence
from dataclasses import dataclass

import psutil

from chaos_edge.dataplane import PeerGone, PeerLinks
from chaos_edge.dataplane.frames import FrameHeader, Kind
from chaos_edge.dataplane.threads import ThreadSet
from chaos_edge.replication.errors import ManifestError
from chaos_edge.replication.manifest import Manifest
from chaos_edge.replication.state import StateSpace
from chaos_edge.replication.transfer.serve import StateServer
from chaos_edge.replication.transfer.snapshot import Snapshot
from chaos_edge.trainer.control import TrainerError

log = logging.getLogger("chaos.trainer.transfer")  # the name its log lines have always had
MAX_OFFER = 8 << 20  # bytes of one STATE_MANIFEST/STATE_END payload
STOP_CHECK_S = 0.2  # how often a wait for offers asks whether it is still wanted
OFFER_WAIT_S = 60.0  # a source waits this long for its own snapshot of the asked step
LINK_WAIT_S = 10.0  # the new node waits this long for its links to the sources
REASK_S = 5.0  # a source that has not answered is asked again this often
_KINDS = (Kind.STATE_REQ, Kind.STATE_MANIFEST, Kind.STATE_DATA, Kind.STATE_END)


class TransferFailed(TrainerError):
    """No source could offer the state (the join retries)."""


class Refusal(str):
    """A source's own reason for making no offer (its ``STATE_END``), as opposed to a lost
    link or a silence: the new node reports these, so the scale-out event names who declined
    even when the source's own report reaches the scheduler after the new node's."""


def snapshot_room(nbytes: int, reserve_bytes: int, available: int | None = None) -> str | None:
    """The memory guard: why a snapshot of ``nbytes`` must not be taken, or None if it fits.

    Args:
        nbytes: Size of the state (the snapshot is one copy of it).
        reserve_bytes: Memory that must stay available after the copy.
        available: Available memory (default: psutil's; a seam for tests).
    """
    free = psutil.virtual_memory().available if available is None else available
    if free - nbytes >= reserve_bytes:
        return None
    mib = 1 << 20
    return (f"not enough memory for a {nbytes / mib:.0f} MiB snapshot: {free / mib:.0f} MiB "
            f"available, {reserve_bytes / mib:.0f} MiB must stay free (snapshot_reserve_mib)")


@dataclass(frozen=True)
class Offer:
    """A source's answer: the manifest of its snapshot and the port that serves it."""

    source: str
    manifest: Manifest
    port: int


class StateTransfer:
    """Serves snapshots to new nodes, and gathers the offers of the sources for a new node.

    Args:
        links: This node's PeerLinks (the STATE_* kinds are handled here).
        host: Where state servers listen (the data plane's bind address).
    """

    def __init__(self, links: PeerLinks, host: str = "0.0.0.0") -> None:
        self.links, self.host = links, host
        self._cond = threading.Condition()
        self._servers: dict[str, StateServer] = {}  # new node -> the server of its snapshot
        self._declined: dict[str, str] = {}  # new node -> why we cannot serve it
        self._asked: dict[str, int] = {}  # new-node side: source -> step asked of it
        self._answers: dict[str, Offer | str] = {}  # source -> its offer, or why not
        self._first_offer = 0.0
        self._waiting: set[tuple[str, int]] = set()  # source side: requests not answered yet
        self._unnamed: set[tuple[str, int]] = set()  # of those, the ones no command explains
        self._threads = ThreadSet()  # askers, answerers and closers, joined on close
        links.register_handler(_KINDS, self)
        links.add_down_listener(self._on_down)

    # -- source side -----------------------------------------------------------------------
    def offer(self, new_node: str, state: StateSpace, serve_bps: float | None = None) -> None:
        """Serve ``state`` to ``new_node`` (replacing an older offer to it), sending it at most
        ``serve_bps`` bytes/s (None: uncapped)."""
        rate: Callable[[str], float | None] | None = None
        if serve_bps:
            bps = serve_bps
            rate = lambda _peer: bps  # noqa: E731 - the server's per-peer rate hook
        server = StateServer(Snapshot.of(state), self.links.me, host=self.host, rate=rate,
                             is_allowed=lambda peer: peer == new_node)  # fmt: skip
        server.start()
        with self._cond:
            old = self._servers.pop(new_node, None)
            self._servers[new_node] = server
            self._declined.pop(new_node, None)
            self._cond.notify_all()
        if old is not None:
            self._close_later([old])
        log.info("offering the state of step %d to %s (%d bytes, port %d)",
                 state.manifest.version, new_node, state.manifest.total_bytes,
                 server.address[1])  # fmt: skip

    def decline(self, new_node: str, why: str) -> None:
        """Answer ``new_node``'s requests with ``why`` instead of an offer."""
        log.warning("not serving %s: %s", new_node, why)
        with self._cond:
            self._declined[new_node] = why
            self._cond.notify_all()

    def withdraw(self, nodes: Iterable[str]) -> None:
        """Stop serving ``nodes`` (they train with us, so they have the state)."""
        with self._cond:
            for n in nodes:
                self._declined.pop(n, None)
            gone = [self._servers.pop(n) for n in nodes if n in self._servers]
        if gone:
            self._close_later(gone)

    def refuse_unnamed(self, named: Container[str]) -> None:
        """(At a step boundary, once chaosd's commands are taken in.) Refuse at once the
        waiting requests of new nodes that no replicate command names us a source of
        (``named``) and that we neither serve nor declined.

        Such a request used to wait its full minute for a snapshot that no command would
        ever make: a source whose chaosd lost the command in a broker restart held the new
        node's pull open, the new node could not ask to join again (which has the scheduler
        send the command once more) until that pull failed, and the rounds that add it
        waited on both (soak fault 20, 101 s). Refused, the new node's pull fails, it
        retries, and asks again after ``ASK_AGAIN_S``. A command that is merely late (taken
        in after this boundary) costs one retry.
        """
        with self._cond:
            stray = {(peer, step) for peer, step in self._waiting if peer not in named
                     and peer not in self._servers and peer not in self._declined}
            if not stray <= self._unnamed:
                self._unnamed |= stray
                self._cond.notify_all()

    def serving(self) -> dict[str, int]:
        """New node -> bytes sent to it so far, for the offers still open."""
        with self._cond:
            servers = dict(self._servers)
        return {n: s.stats().bytes_sent for n, s in servers.items()}

    def answered(self) -> set[str]:
        """New nodes we serve or have declined."""
        with self._cond:
            return {*self._servers, *self._declined}

    def _serve_request(self, peer: str, step: int) -> None:
        # The request may come before we have committed that step: wait for our snapshot.
        key = (peer, step)
        with self._cond:
            self._cond.wait_for(lambda: self._has(peer, step) or peer in self._declined
                                or key in self._unnamed, OFFER_WAIT_S)  # fmt: skip
            server = self._servers.get(peer)
            declined = None if self._has(peer, step) else self._declined.get(peer)
            if declined is None and server is None and key in self._unnamed:
                declined = f"no replicate command names {self.links.me.node_id} a source of {peer}"
            self._waiting.discard(key)
            self._unnamed.discard(key)
        try:
            if declined is not None:
                self._send(peer, Kind.STATE_END, declined.encode())
                return
            if server is None or server.snapshot.manifest.version < step:
                have = None if server is None else server.snapshot.manifest.version
                why = f"no snapshot of step {step} for {peer} (have {have})"
                self._send(peer, Kind.STATE_END, why.encode())
                return
            doc = {"port": server.address[1], "manifest": server.snapshot.manifest.to_dict()}
            self._send(peer, Kind.STATE_MANIFEST, json.dumps(doc).encode())
        except PeerGone as exc:
            log.warning("answering %s's state request failed: %s", peer, exc.reason)

    def _has(self, peer: str, step: int) -> bool:
        server = self._servers.get(peer)
        # A later step than asked is fine: a late command is served from where we are.
        return server is not None and server.snapshot.manifest.version >= step

    def _send(self, peer: str, kind: Kind, payload: bytes, aux: int = 0) -> None:
        header = FrameHeader(kind, 0, 0, aux, 0, len(payload))
        self.links.send(peer, header, payload, time.monotonic() + 30.0)

    # -- new-node side ---------------------------------------------------------------------
    def ask(self, sources: Sequence[str], step: int, deadline: float) -> None:
        """Ask each source for its snapshot of ``step`` (answers arrive on reader threads)."""
        with self._cond:
            self._asked = dict.fromkeys(sources, step)
            self._answers, self._first_offer = {}, 0.0
        self.links.wait_connected(sources, max(0.0, min(LINK_WAIT_S, deadline - time.monotonic())))
        for source in sources:
            try:
                self._send(source, Kind.STATE_REQ, b"", aux=step)
            except PeerGone as exc:
                self._answer(source, f"no link: {exc.reason}")

    def offers(self, deadline: float, grace_s: float, stop: Callable[[], bool] | None = None
               ) -> tuple[dict[str, Offer], dict[str, str]]:
        """Wait for the answers to :meth:`ask`: all of them, or ``grace_s`` after the first
        offer (a source that lags that far behind its peers is left out of the plan), or
        until ``stop`` (checked a few times a second, outside the lock) says the wait is moot.

        Returns:
            The offers, and the reasons of the sources that made none.
        """
        next_ask = time.monotonic() + REASK_S
        next_check = time.monotonic() + STOP_CHECK_S
        stopped = False
        with self._cond:
            while len(self._answers) < len(self._asked):
                now = time.monotonic()
                late = self._first_offer and now > self._first_offer + grace_s
                if now > deadline or late:
                    break
                if stop is not None and now > next_check:
                    next_check = now + STOP_CHECK_S
                    self._cond.release()  # stop() may take in commands that need this lock
                    try:
                        stopped = stop()
                    finally:
                        self._cond.acquire()
                    if stopped:
                        break
                if now > next_ask:
                    # A request or its answer can be lost with a connection that is replaced
                    # (a peer restarted); asking again is cheap and a source answers each ask.
                    next_ask = now + REASK_S
                    for peer in [p for p in self._asked if p not in self._answers]:
                        self._threads.start(self._ask_again, f"state-ask-{peer}", peer,
                                            self._asked[peer])
                self._cond.wait(0.05)
            answers, asked = dict(self._answers), list(self._asked)
            self._asked = {}
        offers = {s: a for s, a in answers.items() if isinstance(a, Offer)}
        errors = {s: a for s, a in answers.items() if isinstance(a, str)}
        silent = "superseded by a newer replicate command" if stopped else "no answer in time"
        errors.update({s: silent for s in asked if s not in answers})
        return offers, errors

    def _answer(self, source: str, answer: Offer | str) -> None:
        with self._cond:
            if source in self._asked and source not in self._answers:
                self._answers[source] = answer
                if isinstance(answer, Offer) and not self._first_offer:
                    self._first_offer = time.monotonic()
                self._cond.notify_all()

    def close(self) -> None:
        """Stop every state server."""
        with self._cond:
            servers, self._servers = list(self._servers.values()), {}
        for s in servers:
            s.close(timeout=1.0)
        stuck = self._threads.join(2.0)
        if stuck:
            log.warning("state transfer threads still running at close: %s", ", ".join(stuck))

    def _close_later(self, servers: list[StateServer]) -> None:
        """Close servers off the training thread: joining their threads takes up to a poll."""
        def run() -> None:
            for s in servers:
                s.close()

        self._threads.start(run, "state-close")

    # -- FrameHandler (reader threads) -----------------------------------------------------
    def buffer_for(
        self, peer: str, h: FrameHeader, is_open: Callable[[], bool]
    ) -> memoryview | None:
        """Where a STATE_* payload goes (None: it is skipped)."""
        if h.kind is Kind.STATE_REQ:
            # Answer on a thread of our own: the reader must keep reading this link.
            with self._cond:
                if (peer, h.aux) in self._waiting:
                    return None  # a thread already waits to answer exactly this
                self._waiting.add((peer, h.aux))
            self._threads.start(self._serve_request, f"state-offer-{peer}", peer, h.aux)
            return None
        with self._cond:
            wanted = peer in self._asked and peer not in self._answers
        if h.kind in (Kind.STATE_MANIFEST, Kind.STATE_END) and wanted and h.length <= MAX_OFFER:
            return memoryview(bytearray(h.length))
        if wanted:
            self._answer(peer, f"unexpected {h.kind.name} frame of {h.length} bytes")
        return None

    def on_frame(self, peer: str, h: FrameHeader, payload: memoryview) -> None:
        """Take a delivered offer (or refusal)."""
        if h.kind is Kind.STATE_END:
            self._answer(peer, Refusal(bytes(payload).decode("utf-8", "replace") or "refused"))
            return
        if h.kind is not Kind.STATE_MANIFEST:
            return
        try:
            doc = json.loads(bytes(payload))
            offer = Offer(peer, Manifest.from_dict(doc["manifest"]), int(doc["port"]))
            if not 0 < offer.port < 65536:
                raise ValueError(f"port {offer.port}")
        except (ValueError, KeyError, TypeError, ManifestError) as exc:
            self._answer(peer, f"malformed offer: {exc}")
            return
        self._answer(peer, offer)

    def _on_down(self, peer: str, reason: str) -> None:
        with self._cond:
            step = self._asked.get(peer) if peer not in self._answers else None
        if step is None:
            return
        if self.links.state(peer) == "up":
            # One of two connections (both ends dialled) was dropped; the request may have
            # gone with it, so ask again on the one that stays (a source answers each ask).
            self._threads.start(self._ask_again, f"state-ask-{peer}", peer, step)
            return
        self._answer(peer, f"link lost: {reason}")

    def _ask_again(self, peer: str, step: int) -> None:
        try:
            self._send(peer, Kind.STATE_REQ, b"", aux=step)
        except PeerGone as exc:
            self._answer(peer, f"link lost: {exc.reason}")

