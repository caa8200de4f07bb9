"""chaosctl's side of chaosd's control socket, and chaosctl's exception family.

The client itself is the one every process uses (:mod:`daemon.contracts.control`); this module
adds chaosctl's own errors. Every failure chaosctl reports is a :class:`ControlFailure` whose
``exit_code`` is what ``chaosctl`` exits with (DESIGN.md: 1 failed, 2 usage, 3 unreachable),
so the CLI catches exactly one base class and prints one line.
"""

from __future__ import annotations

from daemon.contracts.control import (
    DEFAULT_SOCKET,
    DEFAULT_TIMEOUT_S,
    SOCKET_ENV,
    ControlClient,
    call_once,
    resolve_socket,
    unreachable_message,
)
from daemon.contracts.errors import (
    ControlFailure,
    ControlProtocolError,
    ControlRefused,
    DaemonUnreachable,
)

__all__ = [
    "DEFAULT_SOCKET", "DEFAULT_TIMEOUT_S", "SOCKET_ENV", "ControlClient", "ControlFailure",
    "ControlProtocolError", "ControlRefused", "CtlError", "CtlUsageError", "DaemonUnreachable",
    "OperationFailed", "call_once", "resolve_socket", "unreachable_message",
]


class CtlError(ControlFailure):
    """A failure chaosctl finds itself (not an answer of the daemon's)."""

    exit_code: int = 1


class OperationFailed(CtlError):
    """An operation chaosctl drives could not be carried out."""

    exit_code = 1


class CtlUsageError(CtlError):
    """Bad arguments, rejected by chaosctl itself."""

    exit_code = 2
