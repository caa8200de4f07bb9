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
