"""What the Trainer's mixins (timing, epochs, leaving) share: its parts, declared once."""

from __future__ import annotations

import torch

from chaos_edge.trainer.objects import Registry
from chaos_edge.trainer.replica import Replica
from chaos_edge.trainer.session import Session
from chaos_edge.trainer.stepper import Stepper
from daemon.contracts.clock import Clock


class TrainerParts:
    """The attributes :class:`~chaos_edge.trainer.api.Trainer` sets up, for the mixins' types."""

    _s: Session
    _clock: Clock
    _objects: Registry
    _stepper: Stepper
    _replica: Replica  # the step, the held result, diloco's outer state
    _version: int
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    node_id: str

    def _poll(self) -> None:
        """Take in what the poller fetched, at a step boundary (the Trainer's)."""
        raise NotImplementedError
