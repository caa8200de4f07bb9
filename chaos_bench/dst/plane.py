"""The data plane, modelled: rounds that commit or wait, and state transfers that take time.

The control plane under test is real; what moves tensors is not. A round of step ``r`` under
policy ``P`` commits when every member of ``P`` is ready for ``(r, P)``, runs (no freeze), and
reaches the others (no cut between their sites). Then every member's state moves to ``r`` at
once. A state is a ``(step, digest)`` pair: committing ``r`` hashes ``r`` into the digest, so
two members hold the same state exactly when they have the same history.

Scale-out transfers: a source offers the state it snapshotted (its serve machine said when),
the new node waits for offers (all sources, or 2 s after the first), takes the state most of
them offer, and receives it after a time drawn from the seed; a source that dies or is cut
off meanwhile has its bytes re-planned onto the others, and with no source left the pull fails.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Container
from dataclasses import dataclass, field
from typing import Protocol

from chaos_bench.dst.loop import Sim
from daemon.contracts.policy import SyncPolicy

OFFER_GRACE_S = 2.0  # the joiner's grace after the first offer (chaos_edge's OFFER_GRACE_S)
OFFER_WAIT_S = 75.0  # how long a pull waits for offers before it fails (60 + 10 + 5 s)
FRESH = "fresh"


def advance(digest: str, step: int, commit: int) -> str:
    """The digest of the state after committing round ``step`` on top of ``digest``; each
    commit has its own number, so a round committed twice (a rollback redone, two halves of a
    split) gives two states, as two runs of real training would."""
    return hashlib.blake2b(f"{digest}/{step}/{commit}".encode(), digest_size=8).hexdigest()


def fresh_state() -> tuple[int, str]:
    """A model as every script builds it: step 0, the same initial weights everywhere."""
    return 0, FRESH


@dataclass(frozen=True)
class State:
    """What a worker holds: the committed step and the digest of its history."""

    step: int
    digest: str


class Worker(Protocol):
    """What the plane needs of a simulated worker."""

    state: State
    alive: bool

    def runs(self) -> bool: ...
    def stale(self, why: str) -> None: ...
    def committed(self, rnd: int, pub: SyncPolicy, digest: str) -> None: ...


@dataclass
class Pull:
    """One pull of a new node in flight."""

    joiner: str
    sources: tuple[str, ...]
    min_step: int
    started: float
    first_offer: float | None = None
    chosen: dict[str, State] = field(default_factory=dict)
    done_at: float | None = None
    refused: set[str] = field(default_factory=set)  # sources no command named (answered)


class DataPlane:
    """Rounds and transfers between the simulated workers."""

    def __init__(self, sim: Sim, reach: Callable[[str, str], bool],
                 on_commit: Callable[[int, SyncPolicy, dict[str, State], str], None]) -> None:
        self.sim, self.reach, self.on_commit = sim, reach, on_commit
        self.commits = 0
        self.workers: dict[str, Worker] = {}
        self.ready: dict[str, tuple[int, int]] = {}  # node -> (round, policy version)
        self.offers: dict[tuple[str, str], State] = {}  # (source, new node) -> its snapshot
        self.declined: set[tuple[str, str]] = set()
        self.pulls: dict[str, Pull] = {}  # new node -> its pull in flight (what sources see)

    # --- rounds -------------------------------------------------------------------------
    def set_ready(self, node: str, rnd: int, pub: SyncPolicy) -> None:
        self.ready[node] = (rnd, pub.version)

    def unready(self, node: str) -> None:
        self.ready.pop(node, None)

    def try_commit(self, node: str, pub: SyncPolicy) -> bool:
        """Commit the round ``node`` is ready for, if every member is ready for a round under
        ``pub`` and reaches ``node``.

        The members' agreement decides first: the round is the one after the newest step
        any of them committed; a member further behind cannot take part, and leaves (the
        real one raises ``StateDiverged`` and rejoins). The others wait for the policy
        without it.
        """
        want = self.ready.get(node)
        if want is None or want[1] != pub.version:
            return False
        rounds: dict[str, int] = {}
        for m in pub.members:
            w, got = self.workers.get(m), self.ready.get(m)
            if w is None or not w.runs() or got is None or got[1] != pub.version:
                return False
            if m != node and not self.reach(node, m):
                return False
            rounds[m] = got[0]
        rnd = max(rounds.values())
        behind = [m for m, r in rounds.items() if r < rnd]
        if behind:
            for m in behind:
                self.unready(m)
                self.workers[m].stale(f"at step {rounds[m] - 1}, the others at {rnd - 1}")
            return False
        states = {m: self.workers[m].state for m in pub.members}
        for m in pub.members:
            del self.ready[m]
        self.commits += 1
        # One result for all: the members hold one state (the referee checks they did).
        new = advance(min(st.digest for st in states.values()), rnd, self.commits)
        self.on_commit(rnd, pub, states, new)
        for m in pub.members:
            self.workers[m].committed(rnd, pub, new)
        return True

    # --- transfers ----------------------------------------------------------------------
    def offer(self, source: str, new: str, state: State) -> None:
        self.offers[(source, new)] = state
        self.declined.discard((source, new))

    def decline(self, source: str, new: str) -> None:
        self.declined.add((source, new))
        self.offers.pop((source, new), None)

    def start_pull(self, joiner: str, sources: tuple[str, ...], min_step: int) -> Pull:
        """The new node asks ``sources`` for the state of ``min_step`` or later."""
        pull = self.pulls[joiner] = Pull(joiner, sources, min_step, self.sim.now)
        return pull

    def end_pull(self, joiner: str) -> None:
        self.pulls.pop(joiner, None)

    def refuse_unnamed(self, source: str, named: Container[str]) -> int:
        """(A source's poll.) As the real rendezvous: refuse the pulls asking ``source`` for
        a node no command names it a source of, and that it neither serves nor declined.
        Returns how many it refused."""
        n = 0
        for pull in self.pulls.values():
            key = (source, pull.joiner)
            if (source in pull.sources and source not in pull.refused and pull.joiner not in named
                    and key not in self.offers and key not in self.declined
                    and self.reach(source, pull.joiner)):
                pull.refused.add(source)
                n += 1
        return n

    def withdraw(self, source: str, members: tuple[str, ...]) -> None:
        for m in members:
            self.offers.pop((source, m), None)

    def forget(self, node: str) -> None:
        """A process ended: its readiness and its offers go with it."""
        self.ready.pop(node, None)
        self.pulls.pop(node, None)
        for key in [k for k in self.offers if k[0] == node]:
            del self.offers[key]

    def step_pull(self, pull: Pull) -> tuple[str, State | None]:
        """Advance a pull; returns ``("wait", None)``, ``("ok", state)`` or ``("fail", None)``."""
        now = self.sim.now
        live = [s for s in pull.sources if self._serves(s, pull.joiner)]
        if pull.done_at is None:
            got = {s: self.offers[(s, pull.joiner)] for s in live
                   if (s, pull.joiner) in self.offers
                   and self.offers[(s, pull.joiner)].step >= pull.min_step}
            answered = set(got) | pull.refused | {s for s in pull.sources
                                                  if (s, pull.joiner) in self.declined}
            if got and pull.first_offer is None:
                pull.first_offer = now
            all_in = answered >= set(pull.sources)
            late = pull.first_offer is not None and now >= pull.first_offer + OFFER_GRACE_S
            if not got:
                if now >= pull.started + OFFER_WAIT_S or (all_in and pull.sources):
                    return "fail", None
                return "wait", None
            if not (all_in or late):
                return "wait", None
            # The state most sources offer (members at one step hold the same one).
            groups: dict[State, list[str]] = {}
            for s, st in sorted(got.items()):
                groups.setdefault(st, []).append(s)
            best = max(groups, key=lambda st: (len(groups[st]), st.step))
            pull.chosen = {s: best for s in groups[best]}
            pull.done_at = now + 0.2 + self.sim.rng.random() * 2.5
            return "wait", None
        alive = [s for s in pull.chosen if s in live]
        if not alive:
            return "fail", None  # every source went: nothing left to re-plan onto
        if now < pull.done_at:
            return "wait", None
        return "ok", pull.chosen[alive[0]]

    def _serves(self, source: str, joiner: str) -> bool:
        w = self.workers.get(source)
        return w is not None and w.runs() and self.reach(source, joiner)
