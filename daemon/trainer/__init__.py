"""The worker-side training library: ``Trainer`` and the calls a training script makes.

Runs inside the user's training process, with threads (peer-link readers, snapshot servers,
fetchers), never asyncio. It reaches the local chaosd only through the control socket, and
its peers through :mod:`daemon.dataplane` and :mod:`daemon.replication`. It never imports
:mod:`daemon.agent`. Scripts import it as :mod:`chaos_edge`.

- :mod:`~daemon.trainer.api`: ``Trainer`` (``update``, ``check_state_replication``,
  ``request_node_exit``) and ``capture_exit_event``.
- :mod:`~daemon.trainer.session`: the worker's session with chaosd (polling, commands, links).
- :mod:`~daemon.trainer.poller`: the thread that polls chaosd, even while a round blocks.
- :mod:`~daemon.trainer.policy`: the policies a worker holds and which governs a round.
- :mod:`~daemon.trainer.join`: the new node's side of scale-out (offers, plan, pull).
- :mod:`~daemon.trainer.transfer`: the sources' side of scale-out (snapshot and serve).
- :mod:`~daemon.trainer.stepper`: what a round reduces (gradients, buffers) and the step
  that applies it (unscale, transform, clip, scaler).
- :mod:`~daemon.trainer.objects`: the registered objects (schedulers, scaler, EMA, counters).
- :mod:`~daemon.trainer.shares`: each member's shard of the global batch.
- :mod:`~daemon.trainer.serving`: when a source snapshots, and serving it.
- :mod:`~daemon.trainer.control`: the worker's errors over the control client.
"""

from daemon.contracts.errors import ChaosError, DaemonUnreachable
from daemon.trainer.api import (
    Shard,
    StateDiverged,
    StateMismatch,
    StepTiming,
    Trainer,
    TrainerError,
    UnserialisableState,
    capture_exit_event,
)

__all__ = ["ChaosError", "DaemonUnreachable", "Shard", "StateDiverged", "StateMismatch",
           "StepTiming", "Trainer", "TrainerError", "UnserialisableState", "capture_exit_event"]
