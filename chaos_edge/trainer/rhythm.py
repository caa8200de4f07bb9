"""Where a run's rounds fall, and how the data plane numbers them, across sync-mode switches.

Under a sync mode (:class:`~daemon.contracts.policy.SyncMode`) a round ends every ``period``
steps: every step, every H (DiLoCo), or every H / fragments (streaming DiLoCo). The data plane
counts rounds, not steps, so that members one round apart agree on what "one behind" means
(``chaos_edge.trainer.epochs``). A run that starts in one mode numbers round ``k`` at step
``k * period``; the policy controller may switch the mode (or H) during the run, and then the
rounds go on from the step and round number of the switch: the *anchor*.

The switch itself is part of the state every member holds alike: the mode changes when a round
run under a policy of another mode commits (:meth:`Replica.commit
<chaos_edge.trainer.replica.Replica.commit>`), so a member that learned of the new policy
late switches at the same step as the rest, and a joiner receives the anchor with the state.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from daemon.contracts.policy import EVERY_STEP, SyncMode


@dataclass(frozen=True)
class Rhythm:
    """The sync mode in force and where its rounds fall.

    Attributes:
        mode: The sync mode the member's rounds follow (set by the last switch).
        anchor_step: The step the mode took over at (a round boundary; 0 for a run's start).
        anchor_round: The data plane's round number of that step.
    """

    mode: SyncMode = EVERY_STEP
    anchor_step: int = 0
    anchor_round: int = 0

    @property
    def period(self) -> int:
        """Steps between two rounds."""
        return self.mode.period

    def ends_round(self, step: int) -> bool:
        """Whether step ``step`` ends with a round."""
        return (step - self.anchor_step) % self.period == 0

    def index(self, step: int) -> int:
        """Rounds of this mode up to ``step`` (streaming's fragment rotation counts them)."""
        return (step - self.anchor_step) // self.period

    def round_at(self, step: int) -> int:
        """The data plane's number of the last round at or before ``step``."""
        return self.anchor_round + self.index(step)

    def last_round_step(self, step: int) -> int:
        """The step of the last round at or before ``step``."""
        return self.anchor_step + self.index(step) * self.period

    def first_round_from(self, step: int) -> int:
        """The number of the first round at or after ``step`` (what a policy effective at
        ``step`` governs first); a step before the anchor maps at or before its round."""
        return self.anchor_round - (self.anchor_step - step) // self.period

    def takes_over_at(self, effective: int) -> int:
        """The step where a policy of another mode effective at ``effective`` takes over:
        the first round at or after it (a DiLoCo round is never cut short)."""
        return self.anchor_step + (self.first_round_from(effective) - self.anchor_round) \
            * self.period

    def fence(self, effective: int, committed: int, pending: Iterable[int] = ()) -> int:
        """The round number to fence a policy effective at step ``effective`` from, for the
        data plane (a phase of an older policy for a round at or past it aborts).

        Under the mode in force that is :meth:`first_round_from`. While a switch is pending
        (policies of other modes, whose periods are ``pending``), rounds after the next one
        may come faster, and the policy's first round may have a larger number: the fence
        is then an upper bound, counting every step past the next round as a round of the
        shortest period. Too early, a fence would abort the rounds of the policy before it
        for good; too late, it only leaves such a round to end by its timeout.

        Args:
            effective: The policy's effective step.
            committed: This member's last committed step.
            pending: Periods of the modes of known policies not yet in force.
        """
        exact = self.first_round_from(effective)
        shortest = min([*pending, self.period])
        nxt = self.last_round_step(committed) + self.period  # a switch lands there first
        if shortest >= self.period or effective <= nxt:
            return exact
        return max(exact, self.round_at(nxt) - (nxt - effective) // shortest)

    def same_rounds(self, mode: SyncMode) -> bool:
        """Whether ``mode`` puts its rounds where this one does and carries the same state
        (the outer optimizer's settings and the merge weight may change freely)."""
        a, b = self.mode, mode
        return (a.mode, a.inner_steps, a.fragments) == (b.mode, b.inner_steps, b.fragments)

    def switched(self, mode: SyncMode, step: int) -> Rhythm:
        """The rhythm of ``mode`` taking over at round boundary ``step``."""
        return Rhythm(mode, step, self.round_at(step))

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (a snapshot's runtime carries it)."""
        return {"mode": self.mode.to_dict(), "anchor_step": self.anchor_step,
                "anchor_round": self.anchor_round}

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> Rhythm:
        """Parse :meth:`to_dict`'s form (raises PolicyError for a bad mode, ValueError or
        TypeError for bad numbers)."""
        return cls(SyncMode.from_dict(doc.get("mode")), int(doc["anchor_step"]),
                   int(doc["anchor_round"]))

    @classmethod
    def legacy(cls, outer: Mapping[str, Any] | None) -> Rhythm:
        """The rhythm of a snapshot written before switches existed: its mode from the
        start (``outer``: a diloco mode's dict without its name, or None: every-step)."""
        return cls(SyncMode.from_dict({"mode": "diloco", **outer}) if outer else EVERY_STEP)
