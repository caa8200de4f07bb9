"""The worker's background poll of chaosd (``worker.poll``), on its own thread.

The training thread blocks in rounds, so a poll made only between steps learned of a failure
policy only after the round in flight timed out (30 s by default). :class:`Poller` polls every
``POLL_S`` whatever the training thread does: it flushes queued reports, tells chaosd the
position the training thread last published (which also keeps the worker visibly alive to its
supervisor), hands each new policy to ``on_policy`` and each command to ``on_command`` at once
(the Trainer aborts a round that policy governs, or that waits on a node the command has us
serve), and keeps policies, commands and the leave flag in an inbox that the
training thread takes in at its step boundaries. Nothing is polled on a step's own path.

Commands are parsed here, once, into their typed records: a malformed one is counted and
logged (rate-limited) here, and nothing after the poller sees it.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from typing import Any

from daemon.contracts.clock import SystemClock
from daemon.contracts.control import ControlClient
from daemon.contracts.errors import ControlFailure, MessageError
from daemon.contracts.policy import SyncPolicy, parse
from daemon.contracts.protocol import WorkerCommand, parse_worker_command
from daemon.contracts.ratelog import RateLimitedLog

log = logging.getLogger("chaos.trainer")
# A new policy reaches a round in flight within this (plus one control call). Each poll costs
# both processes a wake-up and a JSON round trip: at 20 ms an idle member spent about 4.5% of a
# core on polling here, at 50 ms under 2%. Reports do not wait for it (:meth:`Poller.wake`).
POLL_S = 0.05
#: Weight of the newest step in the moving average of a step's compute (about ten steps).
COMPUTE_WEIGHT = 0.1


class Poller:
    """Polls chaosd from a thread; the training thread takes in what it gathered.

    Args:
        client: The worker's control client (thread-safe).
        flush: Sends the queued reports; called before every poll.
        every: Seconds between polls.
    """

    def __init__(self, client: ControlClient, flush: Callable[[], None],
                 every: float = POLL_S) -> None:  # fmt: skip
        self.client, self.flush, self.every = client, flush, every
        #: The training thread's ``(last committed step, state)``, sent with every poll.
        self.position: tuple[int, str] = (0, "joining")
        #: The policy version the last committed round ran under (-1: none yet).
        self.version = -1
        #: Whether chaosd was in touch with the cluster at the last poll (no round starts
        #: otherwise: a member alone in its policy would train on by itself).
        self.in_touch = True
        #: The newest term chaosd knew at the last poll (0: it did not say).
        self.term = 0
        #: Called on the poller's thread with each new policy, oldest first.
        self.on_policy: Callable[[SyncPolicy], None] | None = None
        #: Called on the poller's thread with each well-formed command.
        self.on_command: Callable[[WorkerCommand], None] | None = None
        self._lock = threading.Lock()
        self._policies: list[SyncPolicy] = []
        self._commands: list[WorkerCommand] = []
        self.rejects = RateLimitedLog(log, "ignored %d malformed worker command(s); last: %s",
                                      SystemClock())
        self._leave = False
        self._error: ControlFailure | None = None
        self._known = -1  # newest policy version fetched
        self._sync_ms: list[float] = []  # collective times of the steps since the last poll
        self._compute_ms: float | None = None  # moving average of a step's own compute
        #: Elements of the vector the rounds all-reduce (0: no round yet).
        self.elements = 0
        #: Why this worker cannot run DiLoCo's local steps ("": it can); the controller keeps
        #: a cluster with such a member out of the diloco modes.
        self.cannot_diloco = ""
        self._news = threading.Event()
        self._stop = threading.Event()
        self._wake = threading.Event()  # poll now: stop, or a report queued
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Start polling (no-op while running)."""
        if self._thread is not None and self._thread.is_alive():
            return
        self._stop.clear()
        self._wake.clear()
        self._thread = threading.Thread(target=self._run, name="chaos-poller", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop polling and join the thread (a call in flight ends within its own timeout)."""
        self._stop.set()
        self._wake.set()
        t = self._thread
        if t is not None and t is not threading.current_thread():
            t.join(timeout)
            if t.is_alive():
                log.warning("the poller did not stop within %gs", timeout)

    def record_sync(self, ms: float) -> None:
        """A committed step's time in collectives; the next poll carries it (chaosd's
        ``chaos_allreduce_seconds``). Safe from any thread; at most 1000 wait."""
        with self._lock:
            self._sync_ms.append(round(ms, 3))
            del self._sync_ms[:-1000]

    def record_compute(self, ms: float) -> None:
        """A step's time outside the collectives (the script's work, the optimizer step and
        the framework's), averaged over about ten steps; every poll carries the average.
        Safe from any thread."""
        with self._lock:
            old = self._compute_ms
            self._compute_ms = ms if old is None else old + COMPUTE_WEIGHT * (ms - old)

    def take(self) -> tuple[list[SyncPolicy], list[WorkerCommand], bool]:
        """New policies, commands (each once) and whether chaosd asked us to leave.

        Raises:
            ControlFailure: The last poll failed (the poller has stopped).
        """
        with self._lock:
            if self._error is not None:
                raise self._error
            out = self._policies, self._commands, self._leave
            self._policies, self._commands = [], []
            self._news.clear()
        return out

    def wake(self) -> None:
        """Poll now rather than at the next tick: a report is queued (a failed link's report
        then reaches the scheduler at once, not up to ``every`` later). Safe from any thread."""
        self._wake.set()

    def wait(self, timeout: float) -> bool:
        """Wait until the inbox has something new (or an error); False on timeout."""
        return self._news.wait(timeout)

    def _run(self) -> None:
        # The first poll goes at once: a node that attaches first must see the policy that
        # makes it the only member before a second node's join replaces it, or it never
        # bootstraps.
        while not self._stop.is_set():
            self._wake.clear()  # before the poll: what is queued from now on wakes the next
            try:
                self.poll_once()
            except ControlFailure as exc:
                with self._lock:
                    self._error = exc
                    self._news.set()
                return
            self._wake.wait(self.every)

    def poll_once(self) -> None:
        """One ``worker.poll`` (the thread's body; a test may call it directly)."""
        self.flush()
        step, state = self.position
        with self._lock:
            sync, self._sync_ms = self._sync_ms, []
            compute = self._compute_ms
        args: dict[str, Any] = {"step": step, "state": state, "policy_version": self._known}
        if compute is not None and self.elements:
            args["compute_ms"], args["elements"] = round(compute, 3), self.elements
            args["cannot_diloco"] = self.cannot_diloco
        if self.version >= 0:
            args["committed_version"] = self.version  # whose policies we train under
        if sync:
            args["sync_ms"] = sync
        data = self.client.call("worker.poll", args) or {}
        fresh: list[SyncPolicy] = []
        for doc in [*(data.get("policies") or []), data.get("policy")]:
            version = doc.get("version") if isinstance(doc, Mapping) else None
            if not isinstance(version, int) or version <= self._known:
                continue  # the current policy comes with every answer: parse it once
            pub = parse(doc)
            if pub is not None and all(p.version != pub.version for p in fresh):
                fresh.append(pub)
        fresh.sort(key=lambda p: p.version)
        if fresh:
            self._known = fresh[-1].version
        commands = self._parse_commands(data.get("commands"))
        leave = bool(data.get("leave"))
        self.in_touch = data.get("in_touch") is not False  # an older daemon does not say
        term = data.get("term")
        self.term = term if isinstance(term, int) and not isinstance(term, bool) else 0
        with self._lock:
            self._policies.extend(fresh)
            self._commands.extend(commands)
            self._leave = self._leave or leave
            if fresh or commands or leave:
                self._news.set()
        for pub in fresh:
            if self.on_policy is not None:
                try:
                    self.on_policy(pub)
                except Exception:  # the poll must go on; the round then only times out
                    log.exception("handling policy v%d failed", pub.version)
        for cmd in commands:
            if self.on_command is not None:
                try:
                    self.on_command(cmd)
                except Exception:  # as above: the training thread still takes it in
                    log.exception("handling command %r failed", cmd.OP)

    def _parse_commands(self, raw: Any) -> list[WorkerCommand]:
        """The well-formed commands of a poll's answer, in order; the rest counted."""
        out: list[WorkerCommand] = []
        for doc in raw if isinstance(raw, list) else []:
            try:
                if not isinstance(doc, Mapping):
                    raise MessageError(f"a worker command is an object, not {doc!r:.80}")
                out.append(parse_worker_command(str(doc.get("op")), doc.get("args")))
            except MessageError as exc:
                self.rejects.note(str(exc))
        self.rejects.flush()
        return out
