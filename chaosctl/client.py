"""Client for chaosd's control socket (protocol v1, see docs/control-protocol.md).

One request per line, one response per line, both JSON objects. Every failure is raised as a
subclass of :class:`CtlError`, whose ``exit_code`` is what ``chaosctl`` exits with, so the CLI
catches exactly one base class and prints one line.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
from pathlib import Path
from types import TracebackType
from typing import Any

# The daemon exports the same default from daemon/config.py; chaosctl keeps its own copy so that
# it never imports daemon internals (imports go netprobe -> daemon -> chaosctl, over the socket).
DEFAULT_SOCKET = "/run/chaos/chaosd.sock"
SOCKET_ENV = "CHAOS_SOCKET"
PROTOCOL_VERSION = 1
DEFAULT_TIMEOUT_S = 5.0
# A response bigger than this is a broken daemon, not a big cluster (200 events are ~50 KiB).
MAX_RESPONSE_BYTES = 32 * 1024 * 1024


class CtlError(Exception):
    """Base of every error chaosctl reports; ``exit_code`` is the process exit status."""

    exit_code: int = 1


class OperationFailed(CtlError):
    """The daemon answered ``ok: false`` with ``code: failed`` (or an unknown code)."""

    exit_code = 1


class CtlUsageError(CtlError):
    """Bad arguments: rejected by chaosctl itself or by the daemon (``code: usage``)."""

    exit_code = 2


class ProtocolError(CtlError):
    """The daemon's answer was not a valid v1 response (garbage, cut short, wrong shape)."""

    exit_code = 1


class DaemonUnreachable(CtlError):
    """The control socket could not be reached, or the daemon did not answer in time."""

    exit_code = 3


def resolve_socket(path: str | Path | None) -> Path:
    """Return the socket path: explicit argument, else ``$CHAOS_SOCKET``, else the default."""
    if path:
        return Path(path)
    return Path(os.environ.get(SOCKET_ENV) or DEFAULT_SOCKET)


def unreachable_message(path: Path, reason: str | None = None) -> str:
    """Build the one-line hint printed when chaosd cannot be reached at ``path``."""
    if reason:
        return f"cannot reach chaosd at {path}: {reason}"
    return (
        f"cannot reach chaosd at {path} (is it running? start it with 'chaosd' or "
        "'systemctl start chaosd')"
    )


class ControlClient:
    """A connection to one daemon's control socket that carries requests in turn.

    The connection is opened lazily and kept for later calls (``--watch`` polls every second).
    After any error it is dropped, and the next call reconnects.

    Args:
        path: The Unix socket path.
        timeout: Default seconds to wait for connecting and for each answer.
    """

    def __init__(self, path: str | Path, timeout: float = DEFAULT_TIMEOUT_S) -> None:
        self.path = Path(path)
        self.timeout = timeout
        self._sock: socket.socket | None = None
        self._buf = b""

    def __enter__(self) -> ControlClient:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        """Close the connection if one is open."""
        if self._sock is not None:
            with contextlib.suppress(OSError):
                self._sock.close()
        self._sock = None
        self._buf = b""

    def _connect(self) -> socket.socket:
        if self._sock is not None:
            return self._sock
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(str(self.path))
        except (FileNotFoundError, ConnectionRefusedError, NotADirectoryError):
            sock.close()
            raise DaemonUnreachable(unreachable_message(self.path)) from None
        except PermissionError:
            sock.close()
            raise DaemonUnreachable(
                unreachable_message(self.path, "permission denied (try again as root)")
            ) from None
        except TimeoutError:
            sock.close()
            raise DaemonUnreachable(
                unreachable_message(self.path, f"no answer within {self.timeout:g}s")
            ) from None
        except OSError as exc:
            sock.close()
            raise DaemonUnreachable(
                unreachable_message(self.path, exc.strerror or str(exc))
            ) from None
        self._sock = sock
        return sock

    def call(
        self, op: str, args: dict[str, Any] | None = None, timeout: float | None = None
    ) -> Any:
        """Send one request and return the response's ``data``.

        Args:
            op: The operation name, e.g. ``"status"``.
            args: The operation's arguments.
            timeout: Seconds to wait for the answer; defaults to the client's timeout.

        Returns:
            The ``data`` member of an ``ok: true`` response.

        Raises:
            DaemonUnreachable: The socket is missing, refuses, or the daemon did not answer.
            CtlUsageError: The daemon answered ``code: usage``.
            OperationFailed: The daemon answered ``code: failed``.
            ProtocolError: The answer was not a valid response.
        """
        request = {"v": PROTOCOL_VERSION, "op": op, "args": args or {}}
        line = json.dumps(request, separators=(",", ":")).encode() + b"\n"
        sock = self._connect()
        wait = self.timeout if timeout is None else timeout
        try:
            sock.settimeout(wait)
            sock.sendall(line)
            raw = self._read_line(sock, op)
        except TimeoutError:
            self.close()
            raise DaemonUnreachable(
                f"chaosd at {self.path} did not answer '{op}' within {wait:g}s "
                "(is it stopped or overloaded?)"
            ) from None
        except OSError as exc:
            self.close()
            raise DaemonUnreachable(
                unreachable_message(self.path, f"connection lost ({exc.strerror or exc})")
            ) from None
        except CtlError:
            self.close()
            raise
        return self._decode(raw, op)

    def _read_line(self, sock: socket.socket, op: str) -> bytes:
        while b"\n" not in self._buf:
            if len(self._buf) > MAX_RESPONSE_BYTES:
                raise ProtocolError(f"chaosd's answer to '{op}' is larger than 32 MiB")
            chunk = sock.recv(65536)
            if not chunk:
                raise ProtocolError(f"chaosd closed the connection without answering '{op}'")
            self._buf += chunk
        raw, _, self._buf = self._buf.partition(b"\n")
        return raw

    def _decode(self, raw: bytes, op: str) -> Any:
        try:
            msg = json.loads(raw)
        except (UnicodeDecodeError, json.JSONDecodeError):
            self.close()  # The stream can't be trusted after garbage.
            raise ProtocolError(f"chaosd sent an answer to '{op}' that is not JSON") from None
        if not isinstance(msg, dict) or not isinstance(msg.get("ok"), bool):
            self.close()
            raise ProtocolError(f"chaosd sent a malformed answer to '{op}' (no 'ok' field)")
        if msg.get("v") != PROTOCOL_VERSION:
            raise ProtocolError(
                f"chaosd speaks control protocol v{msg.get('v')}, chaosctl speaks "
                f"v{PROTOCOL_VERSION} (install matching versions)"
            )
        if msg["ok"]:
            if "data" not in msg:
                raise ProtocolError(f"chaosd's answer to '{op}' has no 'data'")
            return msg["data"]
        error = " ".join(str(msg.get("error") or "operation failed").split())
        if msg.get("code") == "usage":
            raise CtlUsageError(error)
        raise OperationFailed(error)


def call_once(path: str | Path, op: str, args: dict[str, Any] | None = None,
              timeout: float = DEFAULT_TIMEOUT_S) -> Any:
    """Open a connection, make one request, close it, and return the ``data``."""
    with ControlClient(path, timeout) as client:
        return client.call(op, args)
