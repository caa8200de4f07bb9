"""The control-socket protocol (docs/control-protocol.md) and its one blocking client.

One request per line, one response per line, both JSON objects:
``{"v": 1, "op": ..., "args": {...}}`` and ``{"v": 1, "ok": true, "data": ...}`` or
``{"v": 1, "ok": false, "code": "usage"|"failed", "error": "..."}``. chaosctl and the training
worker both use :class:`ControlClient`; chaosd's server is :mod:`daemon.agent.control`.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
from pathlib import Path
from types import TracebackType
from typing import Any

from daemon.contracts.errors import (
    ControlFailure,
    ControlProtocolError,
    ControlRefused,
    DaemonUnreachable,
)
from daemon.contracts.kinds import ControlOp

DEFAULT_SOCKET = "/run/chaos/chaosd.sock"
SOCKET_ENV = "CHAOS_SOCKET"
PROTOCOL_VERSION = 1
DEFAULT_TIMEOUT_S = 5.0
# A worker's poll can carry a replication plan, and 200 events are ~50 KiB: anything bigger
# than this is a broken daemon, not a big cluster.
MAX_RESPONSE_BYTES = 32 * 1024 * 1024


def resolve_socket(path: str | os.PathLike[str] | None) -> Path:
    """The socket path: ``path`` if given, else ``$CHAOS_SOCKET``, else the default."""
    return Path(path or os.environ.get(SOCKET_ENV) or DEFAULT_SOCKET)


def unreachable_message(path: Path, reason: str | None = None) -> str:
    """The one-line hint for a daemon that cannot be reached at ``path``."""
    if reason:
        return f"cannot reach chaosd at {path}: {reason}"
    return (f"cannot reach chaosd at {path} (is it running? start it with 'chaosd' or "
            "'systemctl start chaosd')")


def encode_request(op: ControlOp | str, args: dict[str, Any] | None = None) -> bytes:
    """One request line (``op`` is a :data:`ControlOp`; tests send others on purpose)."""
    return json.dumps({"v": PROTOCOL_VERSION, "op": op, "args": args or {}},
                      separators=(",", ":")).encode() + b"\n"


def decode_response(raw: bytes, op: str) -> Any:
    """The ``data`` of one response line.

    Raises:
        ControlProtocolError: Not a valid v1 response.
        ControlRefused: The daemon answered ``ok: false``.
    """
    try:
        msg = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise ControlProtocolError(f"chaosd sent an answer to '{op}' that is not JSON") from None
    if not isinstance(msg, dict) or not isinstance(msg.get("ok"), bool):
        raise ControlProtocolError(f"chaosd sent a malformed answer to '{op}' (no 'ok' field)")
    if msg.get("v") != PROTOCOL_VERSION:
        raise ControlProtocolError(
            f"chaosd speaks control protocol v{msg.get('v')}, this client speaks "
            f"v{PROTOCOL_VERSION} (install matching versions)")
    if msg["ok"]:
        if "data" not in msg:
            raise ControlProtocolError(f"chaosd's answer to '{op}' has no 'data'")
        return msg["data"]
    error = " ".join(str(msg.get("error") or "operation failed").split())
    raise ControlRefused(error, "usage" if msg.get("code") == "usage" else "failed")


class ControlClient:
    """A persistent, thread-safe connection to one daemon's control socket.

    The connection is opened lazily and kept (the worker polls several times a second,
    ``--watch`` every second); after any error it is dropped and the next call reconnects.

    Args:
        path: The socket path; else ``$CHAOS_SOCKET``; else the default.
        timeout: Default seconds for connecting and for each answer.
    """

    def __init__(self, path: str | os.PathLike[str] | None = None,
                 timeout: float = DEFAULT_TIMEOUT_S) -> None:
        self.path = resolve_socket(path)
        self.timeout = timeout
        self._sock: socket.socket | None = None
        self._buf = b""
        self._lock = threading.Lock()

    def __enter__(self) -> ControlClient:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def close(self) -> None:
        """Close the connection if one is open."""
        with self._lock:
            self._drop()

    def call(self, op: ControlOp | str, args: dict[str, Any] | None = None,
             timeout: float | None = None) -> Any:
        """Send one request and return the response's ``data``.

        Raises:
            DaemonUnreachable: The socket is missing, refuses, or the daemon did not answer.
            ControlRefused: The daemon answered ``ok: false`` (``code`` says which kind).
            ControlProtocolError: The answer was not a valid response.
        """
        wait = self.timeout if timeout is None else timeout
        with self._lock:
            try:
                sock = self._connect()
                sock.settimeout(wait)
                sock.sendall(encode_request(op, args))
                raw = self._read_line(sock, op)
                return decode_response(raw, op)
            except TimeoutError:
                self._drop()
                raise DaemonUnreachable(f"chaosd at {self.path} did not answer '{op}' within "
                                        f"{wait:g}s (is it stopped or overloaded?)") from None
            except OSError as exc:
                self._drop()
                raise DaemonUnreachable(unreachable_message(
                    self.path, f"connection lost ({exc.strerror or exc})")) from None
            except ControlRefused:
                raise  # the stream is still in step: keep the connection
            except ControlFailure:
                self._drop()  # the stream cannot be trusted after garbage
                raise

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
            raise DaemonUnreachable(unreachable_message(
                self.path, "permission denied (try again as root)")) from None
        except TimeoutError:
            sock.close()
            raise DaemonUnreachable(unreachable_message(
                self.path, f"no answer within {self.timeout:g}s")) from None
        except OSError as exc:
            sock.close()
            raise DaemonUnreachable(unreachable_message(
                self.path, exc.strerror or str(exc))) from None
        self._sock, self._buf = sock, b""
        return sock

    def _read_line(self, sock: socket.socket, op: str) -> bytes:
        while b"\n" not in self._buf:
            if len(self._buf) > MAX_RESPONSE_BYTES:
                raise ControlProtocolError(f"chaosd's answer to '{op}' is larger than 32 MiB")
            chunk = sock.recv(1 << 16)
            if not chunk:
                raise ControlProtocolError(
                    f"chaosd closed the connection without answering '{op}'")
            self._buf += chunk
        raw, _, self._buf = self._buf.partition(b"\n")
        return raw

    def _drop(self) -> None:
        if self._sock is not None:
            with contextlib.suppress(OSError):
                self._sock.close()
        self._sock, self._buf = None, b""


def call_once(path: str | os.PathLike[str] | None, op: ControlOp | str,
              args: dict[str, Any] | None = None, timeout: float = DEFAULT_TIMEOUT_S) -> Any:
    """Open a connection, make one request, close it, and return the ``data``."""
    with ControlClient(path, timeout) as client:
        return client.call(op, args)
