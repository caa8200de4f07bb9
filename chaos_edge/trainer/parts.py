"""What the Trainer's mixins (joining, serving, timing) share: its parts, declared once."""

from __future__ import annotations

from typing import Any

import torch

from chaos_edge.replication.state import StateSpace
from chaos_edge.trainer.objects import Registry
from chaos_edge.trainer.session import Session
from chaos_edge.trainer.stepper import Stepper
from daemon.contracts.clock import Clock


class TrainerParts:
    """The attributes :class:`~chaos_edge.trainer.api.Trainer` sets up, for the mixins' types."""

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

    # Provided by LocalSteps (chaos_edge/trainer/local.py): what differs in diloco mode.
    def _last_round_step(self) -> int:
        raise NotImplementedError

    def _snapshot(self, runtime: dict[str, Any], tensors: list[tuple[str, torch.Tensor]]
                  ) -> StateSpace:  # fmt: skip
        raise NotImplementedError

    def _restore_outer(self, runtime: dict[str, Any], extra: dict[str, torch.Tensor]) -> None:
        raise NotImplementedError
