"""A source's side of scale-out: when to snapshot for a new node, and serving the snapshot.

*When* a source takes its snapshot is the subtle part of scale-out: at the last step the
cluster commits without the new node (the :class:`~chaos_edge.trainer.scaleout.ServeMachine`
decides which boundary that is), and at a step boundary where the registered objects are in
their step-``t`` state: ``check_state_replication()`` or the start of ``update()``, never right
after a commit, when the script has yet to step its scheduler. :class:`Source` asks the machine
at each such boundary, checks the memory guard, snapshots the training state (through
:class:`Servable` only) and offers it on the rendezvous, or declines.

In diloco mode inner steps are no rounds, so sources may serve different steps of one window;
each serves the outer state (the same all window long) and the new node takes the state most
sources offer.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Protocol

from chaos_edge.replication.state import StateSpace
from chaos_edge.trainer.poller import POLL_S
from chaos_edge.trainer.rendezvous import StateTransfer, snapshot_room
from chaos_edge.trainer.scaleout import ServeMachine, new_neighbours
from chaos_edge.trainer.session import Session
from daemon.contracts.clock import Clock
from daemon.contracts.policy import SyncPolicy
from daemon.contracts.protocol import Bootstrap, Replicate, ServeDeclined, WorkerCommand

log = logging.getLogger("chaos.trainer")
SERVE_WAIT_S = 5.0  # a source waits this long for the replicate command of a new neighbour


class Servable(Protocol):
    """What serving needs of the training state (the Trainer's
    :class:`~chaos_edge.trainer.replica.Replica`)."""

    @property
    def step(self) -> int:
        """The last committed step."""
        ...

    def last_round_step(self) -> int:
        """The step of our last round (in diloco mode, the last outer step)."""
        ...

    def local_bytes(self) -> int:
        """Bytes a snapshot copies (the memory guard)."""
        ...

    def snapshot(self) -> StateSpace:
        """The state to serve, taken now."""
        ...


class Source:
    """Serves this member's state to the new nodes the scheduler names it a source of.

    Args:
        me: This node's id.
        session: The worker's session (the policy book, reports, chaosd's limits).
        rendezvous: The STATE_* exchange on the peer links; the source owns it from now on
            (:meth:`close` closes it).
        state: The training state to snapshot.
        clock: The time source of the wait for a new neighbour's command.
        poll: Callback: take in what the poller fetched at this step boundary (the Trainer's
            ``_poll``); commands for other nodes come back through :meth:`offer`.
    """

    def __init__(self, me: str, session: Session, rendezvous: StateTransfer, state: Servable,
                 clock: Clock, poll: Callable[[], None]) -> None:  # fmt: skip
        self.me, self._s, self.rendezvous = me, session, rendezvous
        self._state, self._clock, self._poll = state, clock, poll
        self._machine = ServeMachine(me)

    def offer(self, cmd: Replicate | Bootstrap) -> None:
        """A command for another node (kept if it names us a source)."""
        self._machine.offer(cmd)

    def late(self, cmd: WorkerCommand, committed_version: int) -> Replicate | None:
        """(Any thread.) ``cmd`` if it has us serve a new node that we have not answered yet
        and that no round of ours has committed with (we last committed under
        ``committed_version``): a round in flight that waits on that node can only end once
        we serve it. None for any other command."""
        if not isinstance(cmd, Replicate) or cmd.new == self.me or self.me not in cmd.sources \
                or committed_version >= cmd.policy_version:
            return None
        return None if cmd.new in self.rendezvous.answered() else cmd

    def knows(self, node: str) -> bool:
        """Whether ``node`` is a new node we are to serve (it may dial us for the state)."""
        return self._machine.knows(node)

    def serve_due(self) -> None:
        """At a step boundary: snapshot for every new node whose first round is our next one
        (:meth:`ServeMachine.due`), and offer it, or decline if the memory guard says no.
        A request from a node no command names us a source of is refused
        (:meth:`StateTransfer.refuse_unnamed`)."""
        step = self._state.step
        for rep in self._machine.due(step, self._s.book.for_round(step + 1)):
            if rep.version_step < step:
                # The command or its policy came late: every member ran the rounds since
                # under the old policy (rounds are synchronous), so the new one takes effect
                # for all of them at our next round, and the new node starts from our step.
                log.info("replicate for %s names step %d; serving step %d", rep.new,
                         rep.version_step, step)
            limits = self._s.limits
            why = snapshot_room(self._state.local_bytes(), limits.reserve_bytes)
            if why is not None:
                self.rendezvous.decline(rep.new, why)  # the new node plans without us
                self._s.report(ServeDeclined(new=rep.new, reason=why))
                continue
            self.rendezvous.offer(rep.new, self._state.snapshot(), limits.serve_bps)
        self.rendezvous.refuse_unnamed(self._machine.waiting)

    def before_round(self, pub: SyncPolicy, last_version: int, deadline: float) -> None:
        """Before the first round with a new tree neighbour, wait (bounded) for the replicate
        command that names us its source, and serve it. The command and the policy travel
        on different topics: a round started first waits for the new node, which waits for
        our offer, and both stall until the round times out.

        Args:
            pub: The policy of our next round.
            last_version: The policy version our last committed round ran under.
            deadline: The step's deadline.
        """
        if pub.version == last_version:
            return  # the policy of our last round: nobody new (the common, per-step case)
        prev = self._s.book.for_round(self._state.last_round_step())
        new = new_neighbours(self.me, pub, prev)
        until = min(deadline, self._clock.monotonic() + SERVE_WAIT_S)
        while new and not set(new) <= self.rendezvous.answered():
            if self._clock.monotonic() > until:
                log.warning("no replicate command for %s arrived in %gs; running round %d "
                            "without serving it", new, SERVE_WAIT_S, self._state.step + 1)
                return
            self._s.wait(POLL_S)
            self._poll()

    def withdraw(self, members: Iterable[str]) -> None:
        """Drop our offers to ``members``, and any command still waiting to serve one: they
        committed a round with us, so they hold the state (a waiting command would otherwise
        come due later and snapshot the state for nobody)."""
        members = list(members)
        self.rendezvous.withdraw(members)
        for node in members:
            self._machine.forget(node)

    def close(self) -> None:
        """Stop every state server."""
        self.rendezvous.close()
