"""A supervised, long-running ``iperf3 -s`` child process.

The server runs in text mode with ``--forceflush`` rather than ``--json``: in JSON mode iperf3
prints nothing until the first test ends, so there would be no way to see that it is listening
(or that the port was taken). Clients use ``--json``, and a client's report already carries both
ends' figures, so nothing is lost.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
from collections import deque
from collections.abc import Sequence
from types import TracebackType

from netprobe.errors import IperfError, IperfMissing
from netprobe.procs import die_with_parent

log = logging.getLogger(__name__)

_READY_MARKER = b"Server listening on"
_RESTART_BACKOFF_FIRST_S = 0.2
_RESTART_BACKOFF_MAX_S = 5.0
_STOP_GRACE_S = 3.0


class IperfServer:
    """Runs ``iperf3 -s -p PORT -B HOST`` and restarts it if it dies.

    Args:
        host: Address to bind (``-B``); None binds every address.
        port: TCP port; iperf3 cannot pick a free port itself, so choose one.
        binary: The iperf3 executable.
        exec_prefix: Command prepended to the argv, e.g. ``("ip", "netns", "exec", "ns1")``.
        restart: Restart the server when it exits on its own.
        rcv_timeout_s: Server-side idle timeout (``--rcv-timeout``). A client killed mid-test
            leaves the server "busy" until this expires; iperf3's default is 120 s.
        ready_timeout_s: How long :meth:`start` waits for the server to listen.

    Attributes:
        restarts: How many times the server was restarted after dying.
    """

    def __init__(
        self,
        host: str | None = "0.0.0.0",
        port: int = 5201,
        *,
        binary: str = "iperf3",
        exec_prefix: Sequence[str] = (),
        restart: bool = True,
        rcv_timeout_s: float = 10.0,
        ready_timeout_s: float = 5.0,
    ) -> None:
        self.host = host
        self.port = port
        self.binary = binary
        self.exec_prefix = tuple(exec_prefix)
        self.restart = restart
        self.rcv_timeout_s = rcv_timeout_s
        self.ready_timeout_s = ready_timeout_s
        self.restarts = 0
        self._proc: asyncio.subprocess.Process | None = None
        self._drain: asyncio.Task[None] | None = None
        self._supervisor: asyncio.Task[None] | None = None
        self._tail: deque[str] = deque(maxlen=20)
        self._stopping = False

    @property
    def pid(self) -> int | None:
        """The current child's pid, or None when no server is running."""
        proc = self._proc
        return proc.pid if proc is not None and proc.returncode is None else None

    @property
    def running(self) -> bool:
        """Whether a server process is alive right now."""
        return self.pid is not None

    def _argv(self) -> list[str]:
        path = shutil.which(self.binary)
        if path is None:
            raise IperfMissing(self.binary)
        argv = [*self.exec_prefix, path, "-s", "-p", str(self.port), "--forceflush"]
        argv += ["--rcv-timeout", str(max(1, int(self.rcv_timeout_s * 1000)))]
        if self.host:
            argv += ["-B", self.host]
        return argv

    async def start(self) -> None:
        """Start the server and wait until it listens.

        Raises:
            IperfMissing: The binary is not installed.
            IperfError: The server exited or did not listen within ``ready_timeout_s``
                (typically: the port is in use).
        """
        if self.running:
            raise RuntimeError(f"iperf3 server on port {self.port} is already running")
        self._stopping = False
        await self._spawn()
        if self.restart:
            self._supervisor = asyncio.create_task(self._supervise(), name="iperf3-supervisor")

    async def _spawn(self) -> None:
        argv = self._argv()
        self._tail.clear()
        proc = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=die_with_parent,
        )
        self._proc = proc
        assert proc.stdout is not None
        try:
            await asyncio.wait_for(self._wait_ready(proc.stdout), timeout=self.ready_timeout_s)
        except (asyncio.TimeoutError, EOFError):
            await self._kill(proc)
            # The reason comes before iperf3's closing "iperf3: exiting".
            said = [t for t in self._tail if t and t != "iperf3: exiting"]
            detail = said[-1] if said else (self._tail[-1] if self._tail else "no output")
            raise IperfError(
                f"iperf3 server on port {self.port} did not start: {detail}; "
                "pick another port or stop whatever holds it"
            ) from None
        # Keep reading, or the pipe fills and iperf3 blocks on its next report.
        self._drain = asyncio.create_task(self._drain_output(proc.stdout), name="iperf3-drain")

    async def _wait_ready(self, stream: asyncio.StreamReader) -> None:
        while True:
            line = await stream.readline()
            if not line:
                raise EOFError
            self._tail.append(line.decode(errors="replace").strip())
            if _READY_MARKER in line:
                return

    async def _drain_output(self, stream: asyncio.StreamReader) -> None:
        while line := await stream.readline():
            text = line.decode(errors="replace").strip()
            if text:
                self._tail.append(text)

    async def _supervise(self) -> None:
        backoff = _RESTART_BACKOFF_FIRST_S
        while not self._stopping:
            proc = self._proc
            if proc is not None:
                rc = await proc.wait()
                if self._stopping:
                    return
                await self._finish_drain()
                last = self._tail[-1] if self._tail else "no output"
                log.warning(
                    "iperf3 server on port %d exited (rc=%s: %s); restarting", self.port, rc, last
                )
            await asyncio.sleep(backoff)
            try:
                await self._spawn()
                self.restarts += 1
                backoff = _RESTART_BACKOFF_FIRST_S
            except IperfError as exc:
                self._proc = None
                log.warning("%s; retrying in %.1fs", exc, backoff)
                backoff = min(backoff * 2, _RESTART_BACKOFF_MAX_S)

    async def _finish_drain(self) -> None:
        # The child is gone, so its pipe reaches EOF promptly; bound the wait anyway.
        task, self._drain = self._drain, None
        if task is not None:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(task, timeout=1.0)

    async def stop(self) -> None:
        """Stop the server: SIGTERM, then SIGKILL after a grace period. Safe to call twice."""
        self._stopping = True
        for task in (self._supervisor, self._drain):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        self._supervisor = self._drain = None
        if self._proc is not None:
            await self._kill(self._proc)
            self._proc = None

    @staticmethod
    async def _kill(proc: asyncio.subprocess.Process) -> None:
        if proc.returncode is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            proc.terminate()
        try:
            await asyncio.wait_for(proc.wait(), timeout=_STOP_GRACE_S)
        except asyncio.TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()

    async def __aenter__(self) -> IperfServer:
        await self.start()
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()
