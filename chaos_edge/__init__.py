"""chaos_edge: the public Python API of Chaos for training scripts.

    from chaos_edge import Trainer, capture_exit_event

    trainer = Trainer(model, optimizer)      # attaches to the local chaosd; joins (scale-out)
    while trainer.step < total_steps:        # the cluster's global step
        loss = loss_fn(model(x), y); loss.backward()
        trainer.update()                     # all-reduce under the current sync policy
        trainer.check_state_replication()    # serve a new node's state if a plan names us
        if capture_exit_event():             # Ctrl-C, SIGTERM or `chaosctl leave`
            trainer.request_node_exit()      # graceful scale-in
            break

- :class:`Trainer`: ``step``, ``update()``, ``check_state_replication()``,
  ``request_node_exit()``, ``close()``, ``node_id``, ``policy_version``, ``state_digest()``,
  ``state`` (the registered objects), ``shard`` (this member's part of the next step).
- :class:`Shard`: the members, this member's index, the global batch and its slice.
- :class:`UnserialisableState`, :class:`StateMismatch`: a registered object that cannot be
  replicated (raised by ``Trainer()``), a joiner whose state does not fit the cluster's.
- :func:`capture_exit_event`: True once this process should leave.
- :class:`TrainerError` (its subclass :class:`StateDiverged`): what the Trainer raises when it
  cannot go on; :class:`DaemonUnreachable`: chaosd's control socket does not answer. Both are
  :class:`ChaosError`, the one class a script catches.
- :class:`StepTiming`: where one ``update()`` spent its time.
- :class:`DaemonPackageClash`: an ImportError, raised on first use when ``daemon`` is not
  Chaos's package (python-daemon has the same import name).
- :mod:`chaos_edge.ddp`: a torch ``DistributedDataParallel`` script made elastic with four
  lines changed (``ddp.DistributedDataParallel`` and ``ddp.elastic``); the round runs in DDP's
  communication hook, overlapped with the backward pass.
- :mod:`chaos_edge.lightning` (``ChaosStrategy``) and :mod:`chaos_edge.hf` (``ChaosCallback``):
  a Lightning module or a Hugging Face ``Trainer`` made elastic with one change (the
  ``lightning`` and ``hf`` extras).
- ``python -m chaos_edge.examples.digits``, ``...examples.cnn`` (BatchNorm, AdamW, one-cycle
  LR, clipping, a GradScaler, resharding on resize) and ``...examples.chartf`` (a small
  character-level transformer): complete training scripts (need the ``examples`` extra);
  ``...examples.ddp_mlp``, ``...examples.lightning_mlp`` and ``...examples.hf_chartf``: the
  same kind of script kept in its framework.

The library that runs inside the training process lives here, in subpackages:
:mod:`chaos_edge.trainer` (the ``Trainer``), :mod:`chaos_edge.dataplane` (peer links and the
all-reduce) and :mod:`chaos_edge.replication` (scale-out planning and transfer). It shares only
the contracts (:mod:`daemon.contracts`) with chaosd. The names load on first use, after the
clash check: so ``import chaos_edge.cli`` (the ``chaosd`` entry point) neither loads torch nor
fails before it can print its one line.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from chaos_edge._guard import DaemonPackageClash, ensure_own_daemon_package

if TYPE_CHECKING:
    from chaos_edge.trainer import (
        ChaosError,
        DaemonUnreachable,
        Shard,
        StateDiverged,
        StateMismatch,
        StepTiming,
        Trainer,
        TrainerError,
        UnserialisableState,
        capture_exit_event,
    )

__all__ = ["ChaosError", "DaemonPackageClash", "DaemonUnreachable", "Shard", "StateDiverged",
           "StateMismatch", "StepTiming", "Trainer", "TrainerError", "UnserialisableState",
           "capture_exit_event"]
_TRAINER_NAMES = ("ChaosError", "DaemonUnreachable", "Shard", "StateDiverged", "StateMismatch",
                  "StepTiming", "Trainer", "TrainerError", "UnserialisableState",
                  "capture_exit_event")


def __getattr__(name: str) -> Any:
    """Load the Trainer's names from :mod:`chaos_edge.trainer` once the clash check passes."""
    if name not in _TRAINER_NAMES:
        raise AttributeError(f"module 'chaos_edge' has no attribute {name!r}")
    ensure_own_daemon_package()  # raises DaemonPackageClash, an ImportError, in one line
    import chaos_edge.trainer as impl

    for each in _TRAINER_NAMES:
        globals()[each] = getattr(impl, each)
    return globals()[name]


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
