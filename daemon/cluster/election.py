"""Scheduler election over MQTT, which has no compare-and-set.

Rules (all nodes apply the same ones, so they converge without talking more):

* A claim ``(term, id)`` beats another if its term is higher, or the terms tie and its id is
  lower. Every node remembers the best claim it has seen; ``term`` never goes down.
* A node stands only when the accepted leader is gone (its last will fired, or its heartbeats
  stopped) and it has been connected for ``grace_s`` (so a reconnecting node hears the retained
  claim first). Live nodes stand in id order, ``stagger_s`` apart, so usually exactly one does;
  if two do, the tie-break settles it.
* A leader that sees a better claim steps down at once. A leader that sees a worse claim (a
  stale leader thawed from SIGSTOP, say) re-asserts its own, repairing the retained topic.
* Commands carry the term: a node drops a command whose term is below the best it knows.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from daemon.contracts.clock import Clock
from daemon.contracts.config import ElectionConfig


class Action(enum.Enum):
    NONE = "none"
    CLAIM = "claim"          # publish our claim (new term or re-assertion)
    STEP_DOWN = "step-down"  # we were leader and no longer are
    FOLLOW = "follow"        # a new leader was accepted


@dataclass(frozen=True)
class Verdict:
    action: Action
    term: int
    leader: str | None


def better(a: tuple[int, str], b: tuple[int, str]) -> bool:
    """Is claim ``a`` = (term, id) better than ``b``?"""
    return a[0] > b[0] or (a[0] == b[0] and a[1] < b[1])


class Election:
    """One node's view of who schedules, and when to stand."""

    def __init__(self, me: str, cfg: ElectionConfig, clock: Clock) -> None:
        self.me = me
        self._cfg = cfg
        self._clock = clock
        self.term = 0
        self.leader: str | None = None
        self.elected_at: float | None = None
        self._vacant_since: float | None = None
        self._connected_since: float | None = None
        self._my_term: int | None = None  # the last term this process itself claimed

    @property
    def is_leader(self) -> bool:
        return self.leader == self.me

    def _verdict(self, action: Action) -> Verdict:
        return Verdict(action, self.term, self.leader)

    def connected(self) -> None:
        self._connected_since = self._clock.monotonic()
        self._vacant_since = None

    def disconnected(self) -> None:
        self._connected_since = None

    def on_claim(self, leader: str, term: int) -> Verdict:
        """Apply a claim heard on ``sched/leader``."""
        if leader == self.me and term != self._my_term:
            # A claim in our name that this process never made: an earlier run of this node
            # left it retained, and peers may still follow it. Leave the seat vacant in our
            # view so that we stand afresh with a higher term (or repair it if we lead).
            if self.is_leader and term < self.term:
                return self._verdict(Action.CLAIM)
            if term > self.term or self.leader in (None, self.me):
                was_leader = self.is_leader
                self.term, self.leader = max(self.term, term), None
                return self._verdict(Action.STEP_DOWN if was_leader else Action.NONE)
            return self._verdict(Action.NONE)
        if self.leader is None and term >= self.term:
            was = self.leader
            self.term, self.leader = term, leader
            return self._verdict(Action.NONE if was == leader else Action.FOLLOW)
        current = (self.term, self.leader or "")
        if (term, leader) == current:
            return self._verdict(Action.NONE)
        if better((term, leader), current):
            was_leader = self.is_leader
            self.term, self.leader = term, leader
            self._vacant_since = None
            return self._verdict(Action.STEP_DOWN if was_leader else Action.FOLLOW)
        # A worse claim: only the leader answers, by re-asserting its own.
        return self._verdict(Action.CLAIM if self.is_leader else Action.NONE)

    def leader_lost(self) -> None:
        """The accepted leader died (last will or detector): the seat is vacant."""
        if not self.is_leader:
            self.leader = None

    def tick(self, live: set[str]) -> Verdict:
        """Decide whether to stand, given the nodes we currently believe alive.

        Args:
            live: ids of live nodes as this node sees them (``me`` is implied).
        """
        now = self._clock.monotonic()
        if self._connected_since is None or now - self._connected_since < self._cfg.grace_s:
            return self._verdict(Action.NONE)
        if self.leader is not None and (self.leader in live or self.is_leader):
            self._vacant_since = None
            return self._verdict(Action.NONE)
        if self._vacant_since is None:
            self._vacant_since = now
        rank = sorted(live | {self.me}).index(self.me)
        if now - self._vacant_since < rank * self._cfg.stagger_s:
            return self._verdict(Action.NONE)
        self.term += 1
        self.leader = self.me
        self._my_term = self.term
        self.elected_at = now
        self._vacant_since = None
        return self._verdict(Action.CLAIM)

    def admits(self, term: int, leader: str) -> bool:
        """Fencing: may a command stamped ``(term, leader)`` act on this node?"""
        if term < self.term:
            return False
        return not (term == self.term and self.leader is not None and leader != self.leader)
