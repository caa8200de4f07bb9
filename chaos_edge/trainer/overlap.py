"""A round beside the backward pass: :meth:`Trainer.update` on a thread of its own, fed the
gradients as backward finishes them (:class:`~chaos_edge.trainer.stepper.GradFeed`).

Backward produces the gradients last parameter first, and the round vector lays them out in
that order, so the data plane can send the front of the vector while the rest is computed.
Both ways of training use it: ``Trainer(overlap=True)`` feeds each parameter from its
post-accumulate-grad hook, and :mod:`chaos_edge.ddp` feeds DDP's buckets. While backward still
writes gradients, nothing writes the model: a commit, a rejoin's restored state and a diloco
inner step wait for the feed to be complete (:attr:`Replica.settled`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from chaos_edge.trainer.stepper import GradFeed


class BackgroundRound:
    """``run(feed)`` on a daemon thread, started now; :meth:`join` completes the feed,
    waits, and raises what the round raised, on the caller's thread.

    Args:
        feed: The gradients' feed the round reads.
        run: The round (``lambda feed: trainer.update(feed=feed)``).
    """

    def __init__(self, feed: GradFeed, run: Callable[[GradFeed], None]) -> None:
        self.feed = feed
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(run,), daemon=True,
                                        name="chaos-round")
        self._thread.start()

    def _run(self, run: Callable[[GradFeed], None]) -> None:
        try:
            run(self.feed)
        except BaseException as exc:  # raised again on the training thread
            self.error = exc

    def join(self) -> None:
        """Every gradient is final: finish the feed, wait for the round, raise its error."""
        self.feed.finish()
        self._thread.join()
        if self.error is not None:
            raise self.error
