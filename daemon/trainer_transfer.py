"""State replication over the data-plane links (first version: one source).

The new node asks its source on their authenticated link (``STATE_REQ``, the step it wants);
the source answers with the snapshot's manifest (``STATE_MANIFEST``), the bytes in frames of
at most ``CHUNK`` (``STATE_DATA``, offset in ``aux``), then ``STATE_END``. A source that has
no snapshot of that step answers ``STATE_END`` with a reason. The receiver reads every chunk
straight into its final buffer, and ``StateSpace.restore`` verifies every block before it
loads anything. Serving runs on its own thread, overlapped with the source's next step.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable

from daemon.dataplane import PeerGone, PeerLinks
from daemon.dataplane.frames import FrameHeader, Kind
from daemon.replication.errors import ManifestError
from daemon.replication.manifest import Manifest
from daemon.replication.state import StateSpace

log = logging.getLogger("chaos.trainer.transfer")
CHUNK = 4 << 20
MAX_MANIFEST = 8 << 20
OFFER_WAIT_S = 60.0
_KINDS = (Kind.STATE_REQ, Kind.STATE_MANIFEST, Kind.STATE_DATA, Kind.STATE_END)


class TransferFailed(Exception):
    """The state could not be fetched from this source."""


class _Fetch:
    def __init__(self, source: str, step: int) -> None:
        self.source, self.step = source, step
        self.manifest: Manifest | None = None
        self.buffer: bytearray | None = None
        self.received = 0
        self.error: str | None = None
        self.done = False
        self._manifest_buf = bytearray()


class StateTransfer:
    """Serves snapshots to new nodes and fetches one from a source, over PeerLinks.

    Args:
        links: This node's PeerLinks (the handler for the STATE_* kinds is registered here).
    """

    def __init__(self, links: PeerLinks) -> None:
        self.links = links
        self._cond = threading.Condition()
        self._snapshots: dict[str, StateSpace] = {}  # new node -> snapshot it may fetch
        self._serving: dict[str, threading.Lock] = {}  # new node -> held while streaming
        self._fetch: _Fetch | None = None
        self._threads: list[threading.Thread] = []
        links.register_handler(_KINDS, self)
        links.add_down_listener(self._on_down)

    # -- source side -----------------------------------------------------------------------
    def offer(self, new_node: str, state: StateSpace) -> None:
        """Let ``new_node`` fetch ``state`` (replacing an older offer)."""
        with self._cond:
            self._snapshots[new_node] = state
            self._cond.notify_all()

    def withdraw(self, nodes: Iterable[str]) -> None:
        """Drop the offers to ``nodes`` (they have their state: they are in our rounds)."""
        with self._cond:
            for node in nodes:
                self._snapshots.pop(node, None)

    def _serve(self, peer: str, step: int) -> None:
        with self._serving.setdefault(peer, threading.Lock()):  # one stream at a time
            self._serve_one(peer, step)

    def _serve_one(self, peer: str, step: int) -> None:
        # The request may come before this node has committed that step: wait for the offer.
        with self._cond:
            self._cond.wait_for(lambda: self._has(peer, step), OFFER_WAIT_S)
            state = self._snapshots.get(peer)
        deadline = time.monotonic() + 600.0
        try:
            if state is None or state.manifest.version < step:
                have = None if state is None else state.manifest.version
                reason = f"no snapshot of step {step} for {peer} (have {have})".encode()
                self._send(peer, Kind.STATE_END, 0, reason, deadline)
                return
            self._send(peer, Kind.STATE_MANIFEST, 0, state.manifest.to_json().encode(), deadline)
            view = memoryview(state.buffer)
            for off in range(0, len(view), CHUNK):
                self._send(peer, Kind.STATE_DATA, off, view[off : off + CHUNK], deadline)
            self._send(peer, Kind.STATE_END, 0, b"", deadline)
            log.info("served the state of step %d to %s (%d bytes)", step, peer, len(view))
        except PeerGone as exc:
            log.warning("serving the state to %s failed: %s", peer, exc.reason)
        # The offer stays until withdrawn: sent is not received (the link may be replaced
        # by the one we dialled at the same time), and the new node then fetches again.

    def _has(self, peer: str, step: int) -> bool:
        state = self._snapshots.get(peer)
        # A later step than asked is fine: a late command is served from where we are.
        return state is not None and state.manifest.version >= step

    def _send(self, peer: str, kind: Kind, aux: int, payload: bytes | memoryview, dl: float
              ) -> None:  # fmt: skip
        self.links.send(peer, FrameHeader(kind, 0, 0, aux, 0, len(payload)), payload, dl)

    # -- new-node side ---------------------------------------------------------------------
    def fetch(self, source: str, step: int, timeout: float) -> StateSpace:
        """Fetch a snapshot of ``step`` or later from ``source`` (the link must be up).

        Raises:
            TransferFailed: The source refused, the link dropped, or the deadline passed.
        """
        deadline = time.monotonic() + timeout
        if not self.links.wait_connected([source], timeout):
            raise TransferFailed(f"no data-plane link to {source} within {timeout:g}s")
        fetch = _Fetch(source, step)
        with self._cond:
            self._fetch = fetch
        try:
            self._send(source, Kind.STATE_REQ, step, b"", deadline)
            with self._cond:
                while not fetch.done:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise TransferFailed(f"fetching the state from {source} timed out")
                    self._cond.wait(min(left, 0.5))
        except PeerGone as exc:
            raise TransferFailed(f"link to {source} lost: {exc.reason}") from None
        finally:
            with self._cond:
                self._fetch = None
        if fetch.error is not None or fetch.manifest is None or fetch.buffer is None:
            raise TransferFailed(f"{source} could not serve the state: {fetch.error}")
        return StateSpace(fetch.manifest, fetch.buffer)

    def close(self) -> None:
        """Wait briefly for serving threads."""
        for t in self._threads:
            t.join(1.0)

    # -- FrameHandler (reader threads) -----------------------------------------------------
    def buffer_for(
        self, peer: str, h: FrameHeader, is_open: Callable[[], bool]
    ) -> memoryview | None:
        """Where a STATE_* payload goes."""
        with self._cond:
            if h.kind is Kind.STATE_REQ:
                # Serve on a thread of our own: the reader must keep reading this link.
                t = threading.Thread(target=self._serve, args=(peer, h.aux), daemon=True,
                                     name=f"state-serve-{peer}")  # fmt: skip
                self._threads = [x for x in self._threads if x.is_alive()] + [t]
                t.start()
                return None
            f = self._fetch
            if f is None or peer != f.source or f.done:
                return None
            if h.kind in (Kind.STATE_MANIFEST, Kind.STATE_END) and h.length <= MAX_MANIFEST:
                f._manifest_buf = bytearray(h.length)
                return memoryview(f._manifest_buf)
            if (h.kind is Kind.STATE_DATA and f.buffer is not None
                    and h.aux + h.length <= len(f.buffer)):  # fmt: skip
                return memoryview(f.buffer)[h.aux : h.aux + h.length]
            f.error, f.done = f"unexpected {h.kind.name} frame", True
            self._cond.notify_all()
            return None

    def on_frame(self, peer: str, h: FrameHeader, payload: memoryview) -> None:
        """Account for a delivered STATE_* payload."""
        with self._cond:
            f = self._fetch
            if f is None or peer != f.source or f.done:
                return
            if h.kind is Kind.STATE_MANIFEST:
                try:
                    f.manifest = Manifest.from_json(bytes(payload))
                    f.buffer = bytearray(f.manifest.total_bytes)
                except ManifestError as exc:
                    f.error, f.done = str(exc), True
            elif h.kind is Kind.STATE_DATA:
                f.received += h.length
            elif h.kind is Kind.STATE_END:
                if h.length:
                    f.error = bytes(payload).decode("utf-8", "replace")
                f.done = True
            self._cond.notify_all()

    def _on_down(self, peer: str, reason: str) -> None:
        with self._cond:
            f = self._fetch
            if f is not None and f.source == peer and not f.done:
                f.error, f.done = f"link lost: {reason}", True
                self._cond.notify_all()
