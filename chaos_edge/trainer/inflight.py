"""A streaming round in flight while the next step computes (``[training] overlap``).

With ``overlap`` on, a streaming DiLoCo round whose epoch is already agreed (no agreement, no
guard comparison and no new node before it: the common round) does not block ``update()``:
its all-reduce runs on a thread of its own while the script computes the next step, and its
result *lands* at the start of the next ``update()`` (the paper's delay tau = 1; "Streaming
DiLoCo with overlapping communication"). Until then ``trainer.step`` already counts the step,
the replica has not committed the round, and nothing that reads the shared state runs: no
snapshot is served or written, and ``state_digest()`` lands the round first. A round whose
all-reduce aborted reruns on the training thread at landing, exactly as a round that aborted
in ``update()`` does.

:class:`InFlight` owns the thread and what the round ran under; the Trainer decides when one
may start and lands it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from daemon.contracts.policy import SyncPolicy


class InFlight:
    """One round's all-reduce on a daemon thread, started now.

    Args:
        pub: The policy the round runs under.
        n: This member's samples behind its input.
        run: The all-reduce (returns the ``ReduceResult``).
    """

    def __init__(self, pub: SyncPolicy, n: int, run: Callable[[], Any]) -> None:
        self.pub, self.n = pub, n
        self.result: Any = None
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(run,), daemon=True,
                                        name="chaos-streaming-round")
        self._thread.start()

    def _run(self, run: Callable[[], Any]) -> None:
        try:
            self.result = run()
        except BaseException as exc:  # handed to the training thread at landing
            self.error = exc

    def wait(self) -> None:
        """Until the all-reduce has returned or raised."""
        self._thread.join()
