"""The daemon layer's one exception family.

Everything the daemon raises on purpose derives from :class:`ChaosError`, so callers at the
boundary (``main``, the control socket) catch one class and print one line.
"""

from __future__ import annotations


class ChaosError(Exception):
    """Base of every error chaosd raises on purpose."""


class ConfigError(ChaosError):
    """A configuration key or value is invalid; the message names the key."""


class MessageError(ChaosError):
    """An MQTT payload failed validation (malformed, oversized, wrong version)."""


class BusError(ChaosError):
    """The MQTT bus could not be reached or used."""


class ControlError(ChaosError):
    """A control-socket request was invalid. ``code`` is ``usage`` or ``failed``."""

    def __init__(self, message: str, code: str = "usage") -> None:
        super().__init__(message)
        self.code = code


class PolicyError(ChaosError):
    """A sync policy is inconsistent (not a tree, unknown root, node not a member)."""


class ControlFailure(ChaosError):
    """A call over the control socket failed (client side).

    ``exit_code`` is what a command-line tool exits with (DESIGN.md: 1 failed, 2 usage,
    3 daemon not reachable), so ``chaosctl`` maps every failure with one ``except``.
    """

    exit_code: int = 1


class DaemonUnreachable(ControlFailure):
    """The control socket could not be reached, or the daemon did not answer in time."""

    exit_code = 3


class ControlRefused(ControlFailure):
    """The daemon answered ``ok: false``; ``code`` is ``usage`` (bad arguments) or ``failed``."""

    def __init__(self, message: str, code: str = "failed") -> None:
        super().__init__(message)
        self.code = code
        self.exit_code = 2 if code == "usage" else 1


class ControlProtocolError(ControlFailure):
    """The daemon's answer was not a valid response (garbage, cut short, wrong version)."""
