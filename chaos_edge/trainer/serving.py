"""The sources' side of scale-out in the Trainer: when to snapshot, and serving the snapshot.

A mixin of :class:`~chaos_edge.trainer.api.Trainer`, kept apart because *when* a source takes its
snapshot is the subtle part of scale-out: at the last step the cluster commits without the
new node, and at a step boundary where the registered objects are in their step-``t`` state
(``check_state_replication()`` or the start of ``update()``, never right after a commit,
when the script has yet to step its scheduler).
"""

from __future__ import annotations

import logging

from chaos_edge.trainer.parts import TrainerParts
from chaos_edge.trainer.poller import POLL_S
from chaos_edge.trainer.transfer import snapshot_room
from daemon.contracts.policy import SyncPolicy
from daemon.contracts.protocol import Replicate, ServeDeclined

log = logging.getLogger("chaos.trainer")
SERVE_WAIT_S = 5.0  # a source waits this long for the replicate command of a new neighbour


class Serving(TrainerParts):
    """Snapshot and serve a new neighbour's state (mixed into the Trainer)."""


    def _serve_first(self, pub: SyncPolicy, deadline: float) -> None:
        """Before the first round with a new tree neighbour, wait (bounded) for the replicate
        command that names us its source, and serve it. The command and the policy travel
        on different topics: a round started first waits for the new node, which waits for
        our offer, and both stall until the round times out."""
        if pub.version == self._version:
            return  # the policy of our last round: nobody new (the common, per-step case)
        prev = self._s.book.for_round(self._replica.last_round_step())
        if prev is None or prev is pub or self.node_id not in prev.members:
            return  # no change, or we are new ourselves (a new node is nobody's source)
        p = pub
        near = (p.parent(self.node_id), *p.children(self.node_id))
        new = [m for m in near if m and m not in prev.members]
        until = min(deadline, self._clock.monotonic() + SERVE_WAIT_S)
        while new and not set(new) <= self._s.transfer.answered():
            if self._clock.monotonic() > until:
                log.warning("no replicate command for %s arrived in %gs; running round %d "
                            "without serving it", new, SERVE_WAIT_S, self._replica.step + 1)
                return
            self._s.wait(POLL_S)
            self._poll()

    def _serve_due(self) -> None:
        """Snapshot at the boundary where the new node becomes a member, and offer it.

        The snapshot's step must be the last step the cluster commits without the new node:
        the new node's first round is the one after it. Two things decide that boundary, and
        both must hold here: (1) we committed ``version_step`` (or more, if the command came
        late), and (2) the policy that adds the new node governs our next round. Without (2),
        a command that outran its policy (they travel on different MQTT topics) made us serve
        step ``t`` and then commit ``t + 1, t + 2, ...`` with the old members, and the new
        node's first agreement found it steps behind everyone (``StateDiverged`` on every node).
        Once (2) holds, no round without the new node can commit any more: we are a member of
        every such round and run the next one under the new policy.

        In diloco mode inner steps are no rounds, so sources may serve different steps of one
        window; each serves the outer state (the same all window long, :meth:`Replica.snapshot`) and
        the new node takes the state most sources offer.
        """
        keep = []
        step = self._replica.step
        nxt = self._s.book.for_round(step + 1)
        for rep in self._s.replications:
            if rep.new == self.node_id:
                keep.append(rep)  # ours to fetch (a rejoin); handled by _join
                continue
            if not isinstance(rep, Replicate) or self.node_id not in rep.sources:
                continue
            if (rep.version_step > step or nxt is None or nxt.version < rep.policy_version
                    or rep.new not in nxt.members):  # fmt: skip
                keep.append(rep)
                continue
            if rep.version_step < step:
                # The command or its policy came late: every member ran the rounds since
                # under the old policy (rounds are synchronous), so the new one takes effect
                # for all of them at our next round, and the new node starts from our step.
                log.info("replicate for %s names step %d; serving step %d", rep.new,
                         rep.version_step, step)
            why = snapshot_room(self._replica.local_bytes(), self._s.transfer.reserve_bytes)
            if why is not None:
                self._s.transfer.decline(rep.new, why)  # the new node plans without us
                self._s.report(ServeDeclined(new=rep.new, reason=why))
                continue
            self._s.transfer.offer(rep.new, self._replica.snapshot())  # diloco: the outer state
        self._s.replications = keep

