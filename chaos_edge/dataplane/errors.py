"""The data plane's exception family.

Everything the data plane raises to its callers derives from :class:`DataPlaneError`, so a
Trainer can catch one base class. Background threads never raise: they turn failures into link
state and log lines (see ``links.py``).
"""

from __future__ import annotations

from typing import Any

from daemon.contracts.errors import ChaosError, PolicyError

__all__ = ["AuthError", "DataPlaneError", "FrameError", "PeerGone", "PolicyError",
           "RoundAborted"]


class DataPlaneError(ChaosError):
    """Base class of every error raised by ``chaos_edge.dataplane``."""


class FrameError(DataPlaneError):
    """A frame is malformed: bad magic, version, kind, or a length over the limit."""


class AuthError(DataPlaneError):
    """The peer failed the HMAC handshake, is not a member, or is not an allowed neighbour."""


class PeerGone(DataPlaneError):
    """There is no usable connection to a peer (never connected, closed, or lost).

    Attributes:
        peer_id: The peer whose link is missing.
    """

    def __init__(self, peer_id: str, reason: str) -> None:
        super().__init__(f"link to peer {peer_id!r} is gone: {reason}")
        self.peer_id = peer_id
        self.reason = reason




class RoundAborted(DataPlaneError):
    """An all-reduce round was aborted on this node; its output must not be used.

    The caller reruns the same step under a newer policy version (a rerun under the same tag is
    refused, so stale frames of the aborted round can never be mistaken for new ones).

    Attributes:
        step: Training step of the aborted round.
        policy_version: Sync policy version of the aborted round.
        reason: Human-readable cause (timeout, lost link, version mismatch, peer abort).
        peer_id: The peer involved, if the abort is attributable to one.
        result: The complete result when this node held it but missed the COMMIT (it is
            *uncertain*: the round may have committed elsewhere). Keep it for the agreement
            that opens the next epoch; never apply it before that agreement says so.
    """

    def __init__(
        self,
        step: int,
        policy_version: int,
        reason: str,
        peer_id: str | None = None,
        result: Any = None,
    ) -> None:
        super().__init__(
            f"all-reduce of step {step} under policy v{policy_version} aborted: {reason}; "
            "rerun the step under a newer policy version"
        )
        self.step = step
        self.policy_version = policy_version
        self.reason = reason
        self.peer_id = peer_id
        self.result = result
