"""The worker-side training library: ``Trainer`` and the calls a training script makes.

Runs inside the user's training process, with threads (peer-link readers, snapshot servers,
fetchers), never asyncio. It reaches the local chaosd only through the control socket, and
its peers through :mod:`chaos_edge.dataplane` and :mod:`chaos_edge.replication`. Of chaosd's
package it imports only :mod:`daemon.contracts`. Scripts import it as :mod:`chaos_edge`.

- :mod:`~chaos_edge.trainer.api`: ``Trainer`` (``update``, ``check_state_replication``,
  ``request_node_exit``) and ``capture_exit_event``; it owns the objects below and is made of
  none of them (they call back only through the callbacks their constructors document).
- :mod:`~chaos_edge.trainer.replica`: ``Replica``, this member's state (model, optimizer,
  registered objects, step, held result, diloco's outer state) and what a round does to it.
- :mod:`~chaos_edge.trainer.epochs`: ``Epochs``, the agreements, the divergence guard, reruns.
- :mod:`~chaos_edge.trainer.membership`: ``Membership``, the worker's states (joining, active,
  leaving), rejoining when dropped, and the graceful leave.
- :mod:`~chaos_edge.trainer.scaleout`: the join and serve state machines (no I/O).
- :mod:`~chaos_edge.trainer.joiner`: ``Joiner``, the new node's side of scale-out (offers,
  plan, pull, restore).
- :mod:`~chaos_edge.trainer.source`: ``Source``, a source's side (when to snapshot, serving).
- :mod:`~chaos_edge.trainer.rendezvous`: ``StateTransfer``, the STATE_* exchange on the peer
  links that both sides use, and the memory guard.
- :mod:`~chaos_edge.trainer.session`: the worker's session with chaosd (polling, commands, links).
- :mod:`~chaos_edge.trainer.poller`: the thread that polls chaosd, even while a round blocks.
- :mod:`~chaos_edge.trainer.policy`: the policies a worker holds and which governs a round.
- :mod:`~chaos_edge.trainer.stepper`: what a round reduces (gradients, buffers) and the step
  that applies it (unscale, transform, clip, scaler).
- :mod:`~chaos_edge.trainer.outer`: diloco's outer loop (synced parameters, outer optimizer).
- :mod:`~chaos_edge.trainer.objects`: the registered objects (schedulers, scaler, EMA, counters).
- :mod:`~chaos_edge.trainer.shares`: each member's shard of the global batch (``Shares``).
- :mod:`~chaos_edge.trainer.timing`: ``StallMeter``, where each ``update()`` spent its time.
- :mod:`~chaos_edge.trainer.control`: the worker's errors over the control client.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from chaos_edge.trainer.api import (
        Shard,
        StateDiverged,
        StateMismatch,
        StepTiming,
        Trainer,
        TrainerError,
        UnserialisableState,
        capture_exit_event,
    )
    from daemon.contracts.errors import ChaosError, DaemonUnreachable

__all__ = ["ChaosError", "DaemonUnreachable", "Shard", "StateDiverged", "StateMismatch",
           "StepTiming", "Trainer", "TrainerError", "UnserialisableState", "capture_exit_event"]


def __getattr__(name: str) -> Any:
    """The names load on first use: a process that needs only a torch-free part (the DST's
    workers read :mod:`~chaos_edge.trainer.policy`) does not pay 1.5 s to import torch."""
    if name not in __all__:
        raise AttributeError(f"module 'chaos_edge.trainer' has no attribute {name!r}")
    import chaos_edge.trainer.api as api
    from daemon.contracts import errors

    for each in __all__:
        globals()[each] = getattr(errors if each in ("ChaosError", "DaemonUnreachable") else api,
                                  each)
    return globals()[name]


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
