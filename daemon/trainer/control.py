"""The worker's side of the control socket (docs/training-protocol.md), and its errors.

A small blocking JSON-lines client: the training loop calls ``worker.poll`` at every step, so
one persistent connection is kept and every call has its own timeout. Any failure is raised
as :class:`DaemonUnreachable`; the daemon answering ``ok: false`` is :class:`TrainerError`.
"""

from __future__ import annotations

import json
import os
import socket
import threading
from pathlib import Path
from typing import Any

from daemon.contracts.config import DEFAULT_SOCKET
from daemon.contracts.errors import ChaosError

SOCKET_ENV = "CHAOS_SOCKET"
CALL_TIMEOUT_S = 5.0
MAX_LINE = 32 * 1024 * 1024  # a poll carrying a replication plan can be large, not unbounded


class TrainerError(ChaosError):
    """The Trainer cannot go on; the message says what to do."""


class DaemonUnreachable(TrainerError):
    """The local chaosd's control socket could not be reached or did not answer."""


class StateDiverged(TrainerError):
    """This node's state cannot be reconciled with the cluster's; it must be re-replicated.

    The worker should exit non-zero: chaosd restarts it and it rejoins through scale-out.
    """


class DaemonClient:
    """One persistent, thread-safe connection to chaosd's control socket.

    Args:
        path: Socket path; else ``$CHAOS_SOCKET``; else the default.
        timeout: Seconds each call may take.
    """

    def __init__(self, path: str | os.PathLike[str] | None = None, timeout: float = CALL_TIMEOUT_S):
        self.path = Path(path or os.environ.get(SOCKET_ENV) or DEFAULT_SOCKET)
        self.timeout = timeout
        self._sock: socket.socket | None = None
        self._buf = b""
        self._lock = threading.Lock()

    def call(
        self, op: str, args: dict[str, Any] | None = None, timeout: float | None = None
    ) -> Any:
        """Send one request and return its ``data``.

        Raises:
            DaemonUnreachable: The socket failed or timed out (the connection is dropped and
                the next call reconnects).
            TrainerError: The daemon refused the request.
        """
        line = json.dumps({"v": 1, "op": op, "args": args or {}}).encode() + b"\n"
        with self._lock:
            try:
                sock = self._connect()
                sock.settimeout(self.timeout if timeout is None else timeout)
                sock.sendall(line)
                reply = self._readline(sock)
            except OSError as exc:
                self._drop()
                raise DaemonUnreachable(
                    f"cannot reach chaosd at {self.path} ({op}): {exc}; is chaosd running? "
                    f"set {SOCKET_ENV} or pass socket="
                ) from None
        try:
            doc = json.loads(reply)
        except ValueError:
            raise TrainerError(f"chaosd sent a malformed reply to {op}") from None
        if not isinstance(doc, dict) or not doc.get("ok"):
            err = doc.get("error") if isinstance(doc, dict) else None
            raise TrainerError(f"chaosd refused {op}: {err or 'malformed reply'}")
        return doc.get("data")

    def close(self) -> None:
        """Close the connection."""
        with self._lock:
            self._drop()

    def _connect(self) -> socket.socket:
        if self._sock is None:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.settimeout(self.timeout)
            try:
                sock.connect(str(self.path))
            except OSError:
                sock.close()
                raise
            self._sock, self._buf = sock, b""
        return self._sock

    def _readline(self, sock: socket.socket) -> bytes:
        while b"\n" not in self._buf:
            data = sock.recv(1 << 16)
            if not data:
                raise ConnectionError("chaosd closed the control connection")
            self._buf += data
            if len(self._buf) > MAX_LINE:
                raise ConnectionError("reply over the size limit")
        line, _, self._buf = self._buf.partition(b"\n")
        return line

    def _drop(self) -> None:
        if self._sock is not None:
            self._sock.close()
        self._sock, self._buf = None, b""
