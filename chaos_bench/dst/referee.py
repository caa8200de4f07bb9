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
2. No committed state is forked: two different rounds committed on top of one state (a
   rollback redone, two halves of a split) while a holder of the first branch is reachable
   (runs, not frozen, connected). Every member that commits a round holds the same state.
3. No member starts the cluster over (a bootstrap) from an older or a fresh state while a
   reachable process holds a newer committed state of the same lineage (or any committed
   state, for a fresh model), nor while a box that is up and runs its job holds a newer
   snapshot of it on disk (issue 21: after a power cut the newest snapshot returns).

   A holder the cluster cannot reach (frozen, cut off, or gone with its site) cannot be told
   apart from a dead one: what only it held may be lost, and is counted (``steps-lost``), not
   flagged. Keeping state through such losses is the job of snapshots on disk (issue 21).
4. Every join ends within ``JOIN_BOUND_S``.
5. No stall beyond ``STALL_BOUND_S`` while a majority is connected.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from chaos_bench.dst.plane import FRESH, State
from daemon.contracts.policy import SyncPolicy

JOIN_BOUND_S = 150.0
STALL_BOUND_S = 90.0


@dataclass(frozen=True)
class Violation:
    """One broken invariant: which, when, and what the run was doing."""

    kind: str
    at: float
    detail: str


@dataclass(frozen=True)
class Lineage:
    """Where a committed state comes from: its parent, its step, the root it grew from."""

    parent: str
    step: int
    root: str


@dataclass
class Referee:
    """Watches a run: the invariants after every event, and what the run exercised."""

    now: Callable[[], float]
    note: Callable[[str], None]
    coverage: Counter[str] = field(default_factory=Counter)
    violations: list[Violation] = field(default_factory=list)
    states: dict[str, Lineage] = field(default_factory=dict)  # every committed state
    children: dict[str, list[str]] = field(default_factory=dict)
    frontier: int = 0  # the newest step committed
    term_leader: dict[tuple[str, int, int], str] = field(default_factory=dict)
    terms: dict[str, int] = field(default_factory=dict)  # node -> highest term it held
    joins: dict[str, float] = field(default_factory=dict)  # node -> when its join began
    impaired: dict[str, float] = field(default_factory=dict)  # node -> excused seconds
    last_commit: float = 0.0
    quorum_since: float | None = None
    # Every running worker's state, and whether the cluster can reach it now.
    holders: Callable[[], list[tuple[State, bool]]] = list
    # (box, the newest snapshot on its disk) for each box that is up, reachable, and runs its
    # job: its worker will load that snapshot and bring it.
    disks: Callable[[], list[tuple[str, State]]] = list

    # --- recording ----------------------------------------------------------------------
    def count(self, what: str) -> None:
        self.coverage[what] += 1

    def violation(self, kind: str, detail: str) -> None:
        if any(v.kind == kind and v.detail == detail for v in self.violations):
            return
        self.violations.append(Violation(kind, self.now(), detail))
        self.note(f"VIOLATION {kind}: {detail}")

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

    # --- lineage ------------------------------------------------------------------------
    def root_of(self, st: State) -> str:
        if st.digest == FRESH:
            return FRESH
        got = self.states.get(st.digest)
        return got.root if got is not None else st.digest

    def descends(self, digest: str, ancestor: str) -> bool:
        """Whether the committed state ``digest`` grew from ``ancestor``."""
        while digest in self.states:
            if digest == ancestor:
                return True
            digest = self.states[digest].parent
        return digest == ancestor

    def _reachable(self, exclude: tuple[State, ...] = ()) -> list[State]:
        return [st for st, reach in self.holders()
                if reach and all(st is not x for x in exclude)
                and (st.digest in self.states)]

    # --- 2. commits ---------------------------------------------------------------------
    def committed(self, rnd: int, pub: SyncPolicy, states: dict[str, State], new: str) -> None:
        self.count("round")
        digests = {st.digest for st in states.values()}
        if len(digests) > 1:
            self.violation("diverged", f"round {rnd} under v{pub.version} committed by "
                           f"members of {len(digests)} different states")
        parent = min(digests)
        base = next(iter(states.values()))
        root = self.root_of(base) if parent != FRESH else f"fresh@{self.now():.3f}"
        if parent == FRESH and not self.states:
            root = FRESH
        self.states[new] = Lineage(parent, rnd, root)
        siblings = self.children.setdefault(parent, [])
        if siblings:
            # The same state was already built on by another round: a fork.
            others = self._reachable(tuple(states.values()))
            ahead = [st for st in others if st.step >= rnd
                     and any(self.descends(st.digest, s) for s in siblings)]
            if ahead:
                self.violation("split", f"round {rnd} (v{pub.version}, "
                               f"{', '.join(pub.members)}) rebuilds on a state another "
                               f"branch already built on, which a reachable process holds "
                               f"at step {max(s.step for s in ahead)}")
            else:
                self.count("holders-died")
                lost = max(0, self.frontier - rnd + 1)
                self.coverage["steps-lost"] += lost
                self.note(f"round {rnd} rebuilds on step {rnd - 1}: no reachable process holds "
                          f"the branch built on it before ({lost} steps lost)")
        siblings.append(new)
        self.frontier = max(self.frontier, rnd)
        self.last_commit = self.now()

    # --- 3. state loss ------------------------------------------------------------------
    def bootstrap(self, node: str, state: State) -> None:
        self.count("bootstrap")
        others = self._reachable((state,))
        what = "a fresh model" if state.digest == FRESH else f"its own state of step {state.step}"
        if state.digest == FRESH:
            newer = [st for st in others if st.step > 0]
        else:
            root = self.root_of(state)
            newer = [st for st in others if self.root_of(st) == root and st.step > state.step]
        on_disk = [(box, st) for box, st in self.disks() if st.step > state.step
                   and (state.digest == FRESH or self.root_of(st) == self.root_of(state))]
        if newer:
            self.violation("state-lost", f"{node} bootstraps from {what} while a reachable "
                           f"process holds step {max(st.step for st in newer)}")
        elif on_disk:
            box, st = max(on_disk, key=lambda b: b[1].step)
            self.violation("snapshot-lost", f"{node} bootstraps from {what} while {box}, up "
                           f"and running its job, holds a snapshot of step {st.step}")
        elif state.step < self.frontier or (state.digest == FRESH and self.frontier):
            self.count("total-loss")
            self.coverage["steps-lost"] += self.frontier - state.step
            self.note(f"{node} starts over from {what}: no reachable process holds a newer "
                      f"state ({self.frontier - state.step} steps behind the newest)")

    def restored(self, node: str, got: State) -> None:
        self.count("restored")
        if got.digest != FRESH and got.digest not in self.states:
            self.violation("bad-replica", f"{node} restored a state of step {got.step} that "
                           "was never committed")

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
