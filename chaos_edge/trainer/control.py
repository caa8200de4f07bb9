"""The Trainer's exception family.

The worker reaches chaosd through the one control client of :mod:`daemon.contracts.control`,
whose failures are :class:`~daemon.contracts.errors.ControlFailure` (``DaemonUnreachable``
among them). What the Trainer itself cannot get past is a :class:`TrainerError`. Both derive
from :class:`~daemon.contracts.errors.ChaosError`, the one class a training script catches.
"""

from __future__ import annotations

from daemon.contracts.errors import ChaosError


class TrainerError(ChaosError):
    """The Trainer cannot go on; the message says what to do."""


class StateDiverged(TrainerError):
    """This node's state cannot be reconciled with the cluster's; it must be re-replicated.

    The worker should exit non-zero: chaosd restarts it and it rejoins through scale-out.
    """


class UnserialisableState(TrainerError, TypeError):
    """An object handed to ``Trainer(state=...)`` cannot be replicated (raised by ``Trainer()``,
    naming the object and the path inside its state)."""


class StateMismatch(TrainerError):
    """A joiner's model, optimizer or registered objects do not fit the cluster's state.

    Nothing was loaded. The message says what differs: fix the script and start it again.
    """
