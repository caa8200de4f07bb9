"""Exceptions of the replication core, all under the daemon's :class:`ChaosError` family."""

from __future__ import annotations

from daemon.contracts.errors import ChaosError


class ReplicationError(ChaosError):
    """Base of every error the replication core raises on purpose."""


class ManifestError(ReplicationError):
    """A state manifest is malformed or does not match its buffer."""


class CorruptStateError(ReplicationError):
    """Some checksum blocks of a state buffer are corrupt or missing.

    Attributes:
        bad_blocks: Indices of the blocks to fetch again.
    """

    def __init__(self, message: str, bad_blocks: list[int]) -> None:
        super().__init__(message)
        self.bad_blocks = bad_blocks


class PlanError(ReplicationError):
    """A planner input is invalid, or a plan cannot be made from it."""
