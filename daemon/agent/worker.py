"""The node's training worker: its supervision and its session with the daemon.

``chaosctl join -- CMD`` makes chaosd start CMD as a child it can kill (STYLE.md 3: keep the
fragile part in a child). A worker that exits non-zero is restarted with capped backoff and
rejoins through scale-out; one that exits 0 is finished. The worker talks to the daemon over
the control socket (docs/training-protocol.md); :class:`WorkerSession` holds that side.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from netprobe.procs import kill_with_parent

log = logging.getLogger("chaosd.worker")
RESTART_MIN_S = 1.0
RESTART_MAX_S = 30.0
STOP_GRACE_S = 10.0
# A worker that stops polling for this long is treated as gone (hung or killed elsewhere).
POLL_SILENCE_S = 60.0


@dataclass
class WorkerSession:
    """What the daemon knows of its attached worker."""

    pid: int = 0
    data_addr: str = ""
    step: int = 0
    state: str = "standby"
    neighbors: list[str] = field(default_factory=list)
    leave_requested: bool = False
    attached_at: float = 0.0
    last_poll: float = 0.0
    commands: deque[dict[str, Any]] = field(default_factory=lambda: deque(maxlen=1000))
    _seq: int = 0

    @property
    def attached(self) -> bool:
        return bool(self.pid)

    def push(self, op: str, args: dict[str, Any]) -> None:
        """Queue a scheduler command for the worker's next poll."""
        self._seq += 1
        self.commands.append({"seq": self._seq, "op": op, "args": args})

    def drain(self) -> list[dict[str, Any]]:
        out = list(self.commands)
        self.commands.clear()
        return out

    def detach(self) -> None:
        self.pid = 0
        self.data_addr = ""
        self.state = "standby"
        self.leave_requested = False
        self.commands.clear()


class WorkerSupervisor:
    """Starts the worker command, restarts it on failure, stops it on request."""

    def __init__(self, log_dir: str, env: dict[str, str]) -> None:
        self._log_dir = Path(log_dir)
        self._env = env
        self._argv: list[str] = []
        self._proc: asyncio.subprocess.Process | None = None
        self._task: asyncio.Task[None] | None = None
        self._stopping = False
        self.restarts = 0
        self.last_exit: int | None = None
        self.on_exit: list[Any] = []  # callbacks(returncode) run after each exit

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.returncode is None

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self.running and self._proc else None

    def start(self, argv: list[str]) -> None:
        """Start supervising ``argv`` (replacing any finished worker)."""
        if self.running:
            raise RuntimeError("a worker is already running")
        self._argv = list(argv)
        self._stopping = False
        self._task = asyncio.create_task(self._supervise(), name="worker")

    async def _spawn(self) -> asyncio.subprocess.Process:
        self._log_dir.mkdir(parents=True, exist_ok=True)
        out = open(self._log_dir / "worker.log", "ab")  # noqa: SIM115 - handed to the child
        try:
            return await asyncio.create_subprocess_exec(
                *self._argv, stdin=asyncio.subprocess.DEVNULL, stdout=out, stderr=out,
                env={**os.environ, **self._env}, start_new_session=True,
                # A daemon killed (or stopped hard) must not leave its worker training alone;
                # SIGKILL, because the worker turns SIGTERM into a graceful leave via chaosd.
                preexec_fn=kill_with_parent)
        finally:
            out.close()

    async def _supervise(self) -> None:
        backoff = RESTART_MIN_S
        while not self._stopping:
            try:
                self._proc = await self._spawn()
            except OSError as exc:
                log.error("cannot start worker %s: %s", self._argv[0], exc)
                self.last_exit = 127
                for cb in self.on_exit:
                    cb(127)
                return
            log.info("worker started: pid %d: %s", self._proc.pid, " ".join(self._argv))
            code = await self._proc.wait()
            self.last_exit = code
            for cb in self.on_exit:
                cb(code)
            if self._stopping or code == 0:
                log.info("worker exited with %d", code)
                return
            self.restarts += 1
            log.warning("worker exited with %d; restarting in %.0f s", code, backoff)
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, RESTART_MAX_S)

    async def stop(self, grace: float = STOP_GRACE_S) -> None:
        """SIGTERM the worker's process group, then SIGKILL after ``grace``."""
        self._stopping = True
        proc = self._proc
        if proc is not None and proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                await asyncio.wait_for(proc.wait(), timeout=grace)
            except asyncio.TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                await proc.wait()
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
