"""The control socket: newline-delimited JSON over a Unix stream socket.

See docs/control-protocol.md. Garbage, oversized lines and unknown ops are answered with an
error response and one log line; a misbehaving client can only hurt its own connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import socket
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from daemon.contracts.errors import ChaosError, ControlError

log = logging.getLogger("chaosd.control")
MAX_REQUEST = 64 * 1024
CLIENT_IDLE_S = 300.0
Handler = Callable[[dict[str, Any]], Awaitable[Any]]


def _reply(ok: bool, **body: Any) -> bytes:
    return json.dumps({"v": 1, "ok": ok, **body}, separators=(",", ":")).encode() + b"\n"


def socket_in_use(path: str) -> bool:
    """Is something already accepting connections on ``path``?"""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(0.5)
        try:
            s.connect(path)
        except OSError:
            return False
    return True


class ControlServer:
    """Serves ``handlers[op](args)`` on a Unix socket."""

    def __init__(self, path: str, handlers: dict[str, Handler]) -> None:
        self.path = path
        self._handlers = handlers
        self._server: asyncio.AbstractServer | None = None
        self._clients: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        if socket_in_use(self.path):
            raise ControlError(f"control socket {self.path} is in use by another chaosd; "
                               "give this one its own --socket", code="failed")
        Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)  # a stale file from a crashed daemon
        self._server = await asyncio.start_unix_server(self._serve, path=self.path,
                                                       limit=MAX_REQUEST)
        os.chmod(self.path, 0o660)

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            for task in list(self._clients):
                task.cancel()
            await asyncio.gather(*self._clients, return_exceptions=True)
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._server.wait_closed(), timeout=2)
            self._server = None
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._clients.add(task)
        try:
            while True:
                try:
                    line = await asyncio.wait_for(reader.readline(), timeout=CLIENT_IDLE_S)
                except (ValueError, asyncio.LimitOverrunError):
                    log.warning("control: request over %d bytes; closing", MAX_REQUEST)
                    writer.write(_reply(False, error=f"request over {MAX_REQUEST} bytes",
                                        code="usage"))
                    break
                if not line:
                    break
                writer.write(await self._answer(line))
                await writer.drain()
        except (asyncio.TimeoutError, ConnectionError):
            pass
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()
            if task is not None:
                self._clients.discard(task)

    async def _answer(self, line: bytes) -> bytes:
        try:
            req = json.loads(line)
            if not isinstance(req, dict) or not isinstance(req.get("op"), str):
                raise ControlError("request must be a JSON object with a string 'op'")
            if req.get("v", 1) != 1:
                raise ControlError(f"unsupported protocol version {req.get('v')!r}")
            args = req.get("args") or {}
            if not isinstance(args, dict):
                raise ControlError("'args' must be a JSON object")
            handler = self._handlers.get(req["op"])
            if handler is None:
                raise ControlError(f"unknown op {req['op'][:40]!r}")
            return _reply(True, data=await handler(args))
        except (ValueError, UnicodeDecodeError, RecursionError):
            log.warning("control: request is not JSON; rejected")
            return _reply(False, error="request is not JSON", code="usage")
        except ControlError as exc:
            log.warning("control: %s", exc)
            return _reply(False, error=str(exc), code=exc.code)
        except ChaosError as exc:
            return _reply(False, error=str(exc), code="failed")
        except Exception as exc:  # a handler bug must cost one answer, not the daemon
            log.exception("control: request failed")
            return _reply(False, error=f"internal error: {type(exc).__name__}", code="failed")
