"""The invariants, checked after every event of a simulated run, and the run's coverage.

Stated bounds (simulated seconds):

- ``JOIN_BOUND_S``: a join ends (member, refused, or abandoned with a reason) within this long
  of its request, not counting time its own box spent frozen or cut off.
- ``STALL_BOUND_S``: while a majority of the boxes with a worker run and reach the broker and
  each other, and the cluster has members, some round commits at least this often.

The invariants (DST section of issue 20; docs/architecture.md):

1. At most one scheduler acts per term, as each node sees it: a daemon obeys the commands of
   one scheduler per term, and its term never goes back (across restarts too: it keeps the
   term on disk). Cluster-wide uniqueness of a term's leader would need consensus, which MQTT
   (no compare-and-set) cannot give: two sides of a cut may each elect a scheduler of the
   same term, and a newcomer after a total outage that wiped the broker may reuse a term. The
   fencing token is the pair (term, leader), and the tie-break settles which pair wins.
2. No committed step is committed again (a rollback, or two halves of a split both training),
   and every member that commits step ``s`` holds the same state for it.
3. While any holder of the newest state runs, no member starts over from an older or a fresh
   state (a bootstrap that drops the state is a loss, whatever step number it reuses). When
   no running process holds a state any more (every holder died: a site lost power), a
   bootstrap begins a new lineage and its steps may reuse numbers; that is counted
   (``total-loss``, with the steps lost), not a violation: keeping the state through that is
   durability's job (snapshots on disk), not the protocol's.
4. Every join ends within ``JOIN_BOUND_S``.
5. No stall beyond ``STALL_BOUND_S`` while a majority is connected.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from chaos_bench.dst.plane import FRESH, State, advance
from daemon.contracts.policy import SyncPolicy

JOIN_BOUND_S = 150.0
STALL_BOUND_S = 90.0


@dataclass(frozen=True)
class Violation:
    """One broken invariant: which, when, and what the run was doing."""

    kind: str
    at: float
    detail: str


@dataclass
class Referee:
    """Watches a run: the invariants after every event, and what the run exercised."""

    now: Callable[[], float]
    note: Callable[[str], None]
    coverage: Counter[str] = field(default_factory=Counter)
    violations: list[Violation] = field(default_factory=list)
    chain: dict[int, str] = field(default_factory=dict)  # step -> the digest committed
    term_leader: dict[tuple[str, int, int], str] = field(default_factory=dict)
    terms: dict[str, int] = field(default_factory=dict)  # node -> highest term it held
    joins: dict[str, float] = field(default_factory=dict)  # node -> when its join began
    impaired: dict[str, float] = field(default_factory=dict)  # node -> excused seconds
    last_commit: float = 0.0
    quorum_since: float | None = None
    holders: Callable[[], list[State]] = list  # the states every running worker holds

    # --- recording ----------------------------------------------------------------------
    def count(self, what: str) -> None:
        self.coverage[what] += 1

    def violation(self, kind: str, detail: str) -> None:
        if any(v.kind == kind and v.detail == detail for v in self.violations):
            return
        self.violations.append(Violation(kind, self.now(), detail))
        self.note(f"VIOLATION {kind}: {detail}")

    @property
    def frontier(self) -> int:
        return max(self.chain, default=0)

    # --- 1. one scheduler per term ------------------------------------------------------
    def command_obeyed(self, node: str, incarnation: int, term: int, leader: str) -> None:
        """``node`` (this process of it) obeyed a command of ``leader`` in ``term``."""
        held = self.term_leader.setdefault((node, incarnation, term), leader)
        if held != leader:
            self.violation("two-schedulers", f"term {term}: {node} obeys {leader}, having "
                           f"obeyed {held} in the same term")

    def term_seen(self, node: str, term: int) -> None:
        if term < self.terms.get(node, 0):
            self.violation("term-back", f"{node} went from term {self.terms[node]} to {term}")
        self.terms[node] = max(term, self.terms.get(node, 0))

    # --- 2. commits ---------------------------------------------------------------------
    def committed(self, rnd: int, pub: SyncPolicy, states: dict[str, State]) -> None:
        self.count("round")
        digests = {st.digest for st in states.values()}
        if len(digests) > 1:
            self.violation("diverged", f"round {rnd} under v{pub.version} committed by "
                           f"members of {len(digests)} different states")
        new = advance(next(iter(sorted(digests))), rnd)
        if rnd in self.chain:
            # Committed before: by a branch whose every holder may have died since (then those
            # steps were lost, not rolled back), or by one that still runs (a violation).
            others = [st for st in self.holders() if all(st is not s for s in states.values())]
            held = self.held_state(others)
            if held is not None and held.step >= rnd:
                kind = "rolled-back" if self.chain[rnd] == new else "split"
                self.violation(kind, f"step {rnd} committed again (v{pub.version}, "
                               f"{', '.join(pub.members)}) while a running process holds "
                               f"step {held.step}")
            else:
                self.count("holders-died")
                self.coverage["steps-lost"] += self.frontier - rnd + 1
                self.note(f"step {rnd} committed again: every holder of steps {rnd}-"
                          f"{self.frontier} died ({self.frontier - rnd + 1} steps lost)")
            self.chain = {s: d for s, d in self.chain.items() if s < rnd}
        self.chain[rnd] = new
        self.last_commit = self.now()

    # --- 3. state loss ------------------------------------------------------------------
    def held_state(self, holders: list[State]) -> State | None:
        """The newest committed state a running process holds (None: nobody holds one)."""
        good = [st for st in holders if self.chain.get(st.step) == st.digest or
                (st.step == 0 and st.digest == FRESH)]
        return max(good, key=lambda st: st.step, default=None)

    def bootstrap(self, node: str, state: State) -> None:
        self.count("bootstrap")
        if not self.chain or self.chain.get(state.step) == state.digest == self.chain.get(
                self.frontier) or (state.step == self.frontier and state.digest == FRESH):
            return  # the first member, or one that carries on from the newest state
        held = self.held_state([st for st in self.holders() if st is not state])
        what = "a fresh model" if state.digest == FRESH else f"its own state of step {state.step}"
        if held is not None and (held.step, held.digest) != (state.step, state.digest) and \
                held.step >= state.step:
            self.violation("state-lost", f"{node} bootstraps from {what} while a running "
                           f"process holds step {held.step}")
        else:
            self.count("total-loss")
            self.coverage["steps-lost"] += self.frontier - state.step
            self.note(f"{node} starts over from {what}: no running process holds a newer "
                      f"state ({self.frontier - state.step} steps lost)")
        # A new lineage: its steps may reuse numbers of the one that was lost.
        keep = state.step if self.chain.get(state.step) == state.digest else 0
        self.chain = {s: d for s, d in self.chain.items() if s <= keep}

    def restored(self, node: str, got: State) -> None:
        self.count("restored")
        if got.step > 0 and self.chain.get(got.step) not in (None, got.digest):
            self.violation("bad-replica", f"{node} restored step {got.step} unlike the "
                           "cluster's")

    # --- 4. joins -----------------------------------------------------------------------
    def join_started(self, node: str) -> None:
        self.joins.setdefault(node, self.now())
        self.impaired.pop(node, None)

    def join_ended(self, node: str, how: str, why: str) -> None:
        self.count(f"join:{how}")
        self.joins.pop(node, None)

    def excuse(self, node: str, seconds: float) -> None:
        """``node`` could not make progress for ``seconds`` (frozen, cut off, broker down)."""
        if node in self.joins:
            self.impaired[node] = self.impaired.get(node, 0.0) + seconds

    # --- 5 and the periodic checks --------------------------------------------------------
    def check(self, quorum: bool, members: bool) -> None:
        now = self.now()
        for node, began in list(self.joins.items()):
            if now - began - self.impaired.get(node, 0.0) > JOIN_BOUND_S:
                self.violation("join-stuck", f"{node}'s join, begun at {began:.1f}s, has not "
                               f"ended after {now - began:.0f}s")
                self.joins.pop(node)
        if quorum and members:
            if self.quorum_since is None:
                self.quorum_since = now
            since = max(self.quorum_since, self.last_commit)
            if now - since > STALL_BOUND_S:
                self.violation("stall", f"no round committed for {now - since:.0f}s with a "
                               f"majority connected (frontier {self.frontier})")
                self.last_commit = now  # one report per stall
        else:
            self.quorum_since = None

    def summary(self) -> dict[str, Any]:
        return {"frontier": self.frontier, "violations": [v.__dict__ for v in self.violations],
                "coverage": dict(sorted(self.coverage.items()))}
