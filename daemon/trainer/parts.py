"""What the Trainer's mixins (joining, serving, timing) share: its parts, declared once."""

from __future__ import annotations

from typing import Any

import torch

from daemon.contracts.clock import Clock
from daemon.trainer.objects import Registry
from daemon.trainer.session import Session
from daemon.trainer.stepper import Stepper


class TrainerParts:
    """The attributes :class:`~daemon.trainer.api.Trainer` sets up, for the mixins' types."""

    _s: Session
    _clock: Clock
    _objects: Registry
    _stepper: Stepper
    _pending: Any  # the uncertain result of round step + 1
    _pending_version: int
    _version: int
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    node_id: str
    step: int

    def _poll(self) -> None:
        """Take in what the poller fetched, at a step boundary (the Trainer's)."""
        raise NotImplementedError
