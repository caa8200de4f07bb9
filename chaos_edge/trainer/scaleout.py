"""The worker's side of scale-out, as two state machines with no I/O of their own.

:class:`JoinMachine` is the new node's side: it takes the scheduler's commands for this node
(:class:`~daemon.contracts.protocol.Replicate`, :class:`~daemon.contracts.protocol.Bootstrap`)
and says what to do next; :class:`ServeMachine` is a source's side: it keeps the commands
that name this node a source and says at which step boundary to snapshot for each new node.
Both are driven by an owner that does the I/O: the ``Trainer``'s
:class:`~chaos_edge.trainer.joiner.Joiner` and :class:`~chaos_edge.trainer.source.Source` over
the real data plane, and the deterministic simulator over a modelled one. Time is passed in,
never read, so a run replays exactly.

The new node (:class:`JoinPhase`)::

    WAITING --Replicate--> FETCHING --ok--> AWAITING_POLICY --policy that adds it--> MEMBER
       |                      |  ^                  ^
       |                      |  +--(retry: newest command, FETCH_RETRY_S later;
       |                      |      failing for ASK_AGAIN_S: AskAgain first)
       |                      +--failed or superseded--> RETRYING
       +--Bootstrap (in touch, not superseded)--------+
    any phase --deadline--> TIMED_OUT;  a state that does not fit --> REFUSED
    AWAITING_POLICY --a Replicate of another plan--> FETCHING

A ``Bootstrap`` is carried out only while chaosd is in touch with the cluster, and not once a
newer policy leaves this node out: a box frozen with one in its queue thawed and started over
from its older state while the scheduler had long made another node the start (the
simulator's seed 2167). Nor once the term of the scheduler that sent it has ended (the poll
says chaosd's term): the next scheduler plans the join itself (seed 2759, where the worker's
book was two terms old). Such a bootstrap is dropped, and the machine waits for the command
chaosd asks for again.

A source: a ``Replicate`` naming it waits in :class:`ServeMachine` until the source has
committed the command's ``version_step`` *and* the policy that adds the new node governs its
next round; then it is due, and the owner snapshots at that boundary and serves it.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Literal

from daemon.contracts.policy import SyncPolicy
from daemon.contracts.protocol import Bootstrap, Replicate

FETCH_RETRY_S = 0.5  # pause before pulling a replicated state again after a failure
# Pulls failing this long: the join is asked again, so that the scheduler sends its command
# to the node and every source once more. A source cut off from the broker when the command
# went out never learnt of the join and refused it ("not an allowed neighbour", "no snapshot
# for you") while the rounds that add the node waited on it (the soak's hour in stop 31: a
# 256-s stall after a broker restart).
ASK_AGAIN_S = 5.0


class JoinPhase(enum.Enum):
    """Where the new node's join stands (module docstring)."""

    WAITING = "waiting"  # attached, or dropped from the policy: no command yet
    FETCHING = "fetching"  # pulling the state a Replicate names (the owner does the I/O)
    RETRYING = "retrying"  # the last pull failed: the newest command is pulled again soon
    AWAITING_POLICY = "awaiting-policy"  # the state is in: waits for the policy naming it
    MEMBER = "member"  # done: it takes part in the rounds
    REFUSED = "refused"  # the cluster's state does not fit this script (terminal)
    TIMED_OUT = "timed-out"  # no membership before the deadline (terminal)


@dataclass(frozen=True)
class Fetch:
    """Pull the state ``command`` names, then call :meth:`JoinMachine.fetched`."""

    command: Replicate


@dataclass(frozen=True)
class StartAlone:
    """No member holds a state: start from our own (then the machine awaits the policy)."""

    command: Bootstrap


@dataclass(frozen=True)
class Wait:
    """Nothing to do until the next poll."""


@dataclass(frozen=True)
class AskAgain:
    """Pulls have failed for ``ASK_AGAIN_S``: ask to join again (the owner re-attaches),
    then pull on; the scheduler resends the command to us and to every source."""


@dataclass(frozen=True)
class Joined:
    """We are a member: the policy that names us has arrived."""


@dataclass(frozen=True)
class GiveUp:
    """The join did not finish before its deadline; ``reason`` says where it stood."""

    reason: str


JoinAction = Fetch | StartAlone | Wait | Joined | GiveUp | AskAgain
TERMINAL = (JoinPhase.MEMBER, JoinPhase.REFUSED, JoinPhase.TIMED_OUT)


class JoinMachine:
    """One join of this node, from the request to membership.

    Args:
        me: This node's id.
        deadline: Monotonic time by which it must be a member.
    """

    def __init__(self, me: str, deadline: float) -> None:
        self.me, self.deadline = me, deadline
        self.phase = JoinPhase.WAITING
        self.command: Replicate | Bootstrap | None = None  # the one being carried out
        self._newest: Replicate | Bootstrap | None = None  # the newest one received
        self._retry_at = 0.0
        self._failing_since: float | None = None  # the first failed pull since the last good
        self.fetches = 0  # pulls started (a retry is one more)

    def offer(self, cmd: Replicate | Bootstrap) -> None:
        """A command for this node arrived (the newest replaces older ones; the one being
        carried out, sent again after we asked again, changes nothing)."""
        if cmd.new == self.me and self.phase not in TERMINAL and cmd != self.command:
            self._newest = cmd

    @property
    def unused(self) -> Replicate | Bootstrap | None:
        """The newest command that came after the one carried out (it arrived while the pull
        ran or the policy was awaited): the owner keeps it for the next join, as it keeps
        every command for this node that comes between joins."""
        return self._newest

    @property
    def superseded(self) -> bool:
        """(While fetching.) A newer command arrived: the pull in flight is moot."""
        return self.phase is JoinPhase.FETCHING and self._newest is not None

    def advance(self, now: float, book_newest: SyncPolicy | None,
                in_touch: bool = True, term: int = 0) -> JoinAction:
        """What to do now, given the newest policy this worker holds and whether its chaosd
        is in touch with the cluster (its book is then as new as the broker's)."""
        if self.phase is JoinPhase.MEMBER:
            return Joined()
        if self.phase in (JoinPhase.REFUSED, JoinPhase.TIMED_OUT):
            return GiveUp(f"the join ended {self.phase.value}")
        replanned = self.phase is JoinPhase.AWAITING_POLICY and self._replanned()
        if self.phase is JoinPhase.AWAITING_POLICY and not replanned and \
                self._has_policy(book_newest):
            self.phase = JoinPhase.MEMBER
            return Joined()
        if now > self.deadline:
            was = self.phase
            self.phase = JoinPhase.TIMED_OUT
            return GiveUp(self._late(was))
        if self.phase is JoinPhase.FETCHING or (
                self.phase is JoinPhase.AWAITING_POLICY and not replanned):
            return Wait()  # the policy is on its way; or the owner's pull is in flight
        if self.phase is JoinPhase.RETRYING and now < self._retry_at:
            return Wait()
        if (self.phase is JoinPhase.RETRYING and self._failing_since is not None
                and now - self._failing_since >= ASK_AGAIN_S):
            self._failing_since = now  # once per ASK_AGAIN_S while the pulls fail
            return AskAgain()
        cmd = self._newest or self.command
        if isinstance(cmd, Bootstrap) and not in_touch:
            return Wait()  # what we know of the cluster may be old: the command stays
        self._newest = None
        if isinstance(cmd, Bootstrap) and (cmd.ended(term) or (
                book_newest is not None
                and cmd.stale(book_newest.version, book_newest.members))):
            self.command, self.phase = None, JoinPhase.WAITING
            return Wait()
        if isinstance(cmd, Bootstrap):
            self.command, self.phase = cmd, JoinPhase.AWAITING_POLICY
            return StartAlone(cmd)
        if isinstance(cmd, Replicate):
            self.command, self.phase = cmd, JoinPhase.FETCHING
            self.fetches += 1
            return Fetch(cmd)
        return Wait()

    def fetched(self, ok: bool, now: float) -> None:
        """The owner's pull of :attr:`command` ended: the state is in, or it failed."""
        if self.phase is not JoinPhase.FETCHING:
            return
        if ok:
            self.phase, self._failing_since = JoinPhase.AWAITING_POLICY, None
        else:
            self.phase, self._retry_at = JoinPhase.RETRYING, now + FETCH_RETRY_S
            if self._failing_since is None:
                self._failing_since = now

    def refused(self) -> None:
        """The pulled state does not fit this script: the join ends here."""
        self.phase = JoinPhase.REFUSED

    def _replanned(self) -> bool:
        """(Awaiting the policy.) A command of another plan came: the scheduler planned our
        join anew (a new scheduler, or other sources), and the state we restored is the old
        plan's. Its policy may name us, but from the new plan's step: joining on it with the
        older state, a node restored at 363 trained alone on while another held 384 (the
        simulator's seed 397). The new command is carried out instead. The same plan's
        command sent again changes nothing, nor does a bootstrap, which starts from the state
        we hold anyway: each is kept for the next join (:attr:`unused`)."""
        return (isinstance(self._newest, Replicate) and self.command is not None
                and self._newest.policy_version != self.command.policy_version)

    def _has_policy(self, newest: SyncPolicy | None) -> bool:
        """The command that brought the state may outrun the policy that adds us (another
        topic): without that policy, the first round would find us in none and ask again."""
        if newest is None or self.command is None:
            return False
        if self.command.policy_version < 0:  # no version named: the policy must name us
            return self.me in newest.members
        return newest.version >= self.command.policy_version

    def _late(self, phase: JoinPhase) -> str:
        if phase is JoinPhase.AWAITING_POLICY and self.command is not None:
            return (f"{self.me} restored its state, but the policy v"
                    f"{self.command.policy_version} that adds it never arrived")
        if phase in (JoinPhase.FETCHING, JoinPhase.RETRYING) and self.command is not None:
            return (f"{self.me} could not pull the state from "
                    f"{', '.join(sorted(getattr(self.command, 'sources', {})))} in time")
        return (f"{self.me} did not become a member in time: no replicate command arrived; "
                "check `chaosctl nodes` and the scheduler")


class ServeMachine:
    """A source's pending replicate commands, and when each is due.

    Args:
        me: This node's id.
    """

    def __init__(self, me: str) -> None:
        self.me = me
        self.waiting: dict[str, Replicate] = {}  # new node -> its newest command

    def offer(self, cmd: Replicate | Bootstrap) -> None:
        """A command for another node arrived; kept if it names us a source. The newest
        command for a node replaces the older ones, so one that does not name us (another
        plan, or a bootstrap) ends our wait to serve that node."""
        if cmd.new == self.me:
            return
        self.waiting.pop(cmd.new, None)  # the newest goes last: due ones serve in arrival order
        if isinstance(cmd, Replicate) and self.me in cmd.sources:
            self.waiting[cmd.new] = cmd

    def forget(self, new: str) -> None:
        """Stop waiting to serve ``new`` (it trains with us now, or went)."""
        self.waiting.pop(new, None)

    def due(self, step: int, next_round: SyncPolicy | None) -> list[Replicate]:
        """The commands to serve at this step boundary, after committing ``step`` with
        ``next_round`` governing our next round; they leave the machine.

        The snapshot's step must be the last the cluster commits without the new node. Two
        things decide that boundary, and both must hold: (1) we committed ``version_step`` (or
        more, if the command came late), and (2) the policy that adds the new node governs our
        next round. Without (2), a command that outran its policy (they travel on different
        topics) made us serve step ``t`` and then commit ``t + 1, ...`` with the old members,
        and the new node's first agreement found it steps behind everyone. Once (2) holds, no
        round without the new node can commit any more: we are a member of every such round.
        """
        ready = [rep for rep in self.waiting.values()
                 if rep.version_step <= step and next_round is not None
                 and next_round.version >= rep.policy_version and rep.new in next_round.members]
        for rep in ready:
            del self.waiting[rep.new]
        return ready

    def knows(self, node: str) -> bool:
        """Whether ``node`` is a new node we are to serve (it may dial us for the state)."""
        return node in self.waiting


Standing = Literal["member", "rejoin", "left", "wait"]


def standing(pub: SyncPolicy | None, me: str, leaving: bool) -> Standing:
    """What the policy of our next round (``pub``) tells this worker to do: take part, ask to
    join again (dropped: declared failed, or on the losing side of a partition, so only a
    fresh replica lets it back in, even when a newer policy adds it back), stop (a leave is
    done), or wait for a policy.

    It must be the policy of the *next round*, not the newest one: a node dropped and added
    back at once (a link back to a partitioned node) whose replicate command was lost in a
    broker restart saw itself in the newest policy, waited for rounds it was not in, and was
    never replicated (fault 5 of the soak).
    """
    if pub is None:
        return "wait"
    if me in pub.members:
        return "member"
    return "left" if leaving else "rejoin"


def new_neighbours(me: str, pub: SyncPolicy, prev: SyncPolicy | None) -> list[str]:
    """Our tree neighbours under ``pub`` that were no members under ``prev``: new nodes whose
    first round with us cannot finish before they have our offer (or our refusal)."""
    if prev is None or prev is pub or me not in prev.members or me not in pub.members:
        return []  # no change, or we are new ourselves (a new node is nobody's source)
    near = (pub.parent(me), *pub.children(me))
    return [m for m in near if m and m not in prev.members]
