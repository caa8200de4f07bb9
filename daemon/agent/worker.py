"""The node's training worker: its supervision and its session with the daemon.

``chaosctl join -- CMD`` makes chaosd start CMD as a child it can kill (STYLE.md 3: keep the
fragile part in a child), in the caller's working directory and environment. A worker that
exits non-zero is restarted with capped backoff and rejoins through scale-out; one that exits
0 is finished. The job is remembered in the data dir (:class:`~daemon.agent.memory.JobMemory`)
until the operator says ``leave`` or the script ends on its own, so a box that reboots starts
it again (:meth:`WorkerSupervisor.resume`); a remembered command that cannot start any more
fails once, is forgotten, and is not retried. The worker talks to the daemon over
the control socket (docs/training-protocol.md); :class:`WorkerSession` holds that side.

Liveness: the worker polls every 20-50 ms, even inside long steps, so a worker silent for
``[worker] poll_silence_s`` is hung (deadlock, stuck I/O, swapping, SIGSTOP). The node agent
asks :func:`unresponsive_for` every tick; on a verdict it reports the worker gone (the
scheduler drops it from the rounds at once) and :meth:`WorkerSupervisor.kill` SIGKILLs it,
the one signal a stopped process obeys. Its sockets close, so its peers see the links drop,
and the supervision loop restarts it as after a crash: it rejoins through scale-out.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from daemon.agent.memory import Job, JobMemory
from daemon.contracts.clock import Clock
from daemon.contracts.protocol import Bootstrap, Replicate, WorkerCommand
from netprobe.procs import kill_with_parent

log = logging.getLogger("chaosd.worker")
RESTART_MIN_S = 1.0
RESTART_MAX_S = 30.0
STOP_GRACE_S = 10.0


@dataclass
class WorkerSession:
    """What the daemon knows of its attached worker."""

    pid: int = 0
    data_addr: str = ""
    step: int = 0
    version: int = -1  # the policy its last committed round ran under (worker.poll)
    compute_ms: float = -1.0  # a step's own compute, averaged (-1: not said yet)
    elements: int = -1  # elements of the vector its rounds all-reduce (-1: not said yet)
    cannot_diloco: str = ""  # why it cannot run DiLoCo's local steps ("": it can)
    state: str = "standby"
    neighbors: list[str] = field(default_factory=list)
    leave_requested: bool = False
    attached_at: float = 0.0
    last_poll: float = 0.0
    asked_at: float = 0.0  # when its join request last went to the scheduler
    # The replicate or bootstrap naming it that came since it asked to join (None: none yet).
    answer: Replicate | Bootstrap | None = None
    commands: deque[tuple[int, WorkerCommand]] = field(default_factory=lambda: deque(maxlen=1000))
    _seq: int = 0
    _serving: int = 0  # the worker's requests the daemon is still working on

    @property
    def attached(self) -> bool:
        return bool(self.pid)

    @property
    def answered(self) -> bool:
        return self.answer is not None

    def push(self, cmd: WorkerCommand) -> None:
        """Queue a scheduler command for the worker's next poll."""
        self._seq += 1
        if len(self.commands) == self.commands.maxlen:
            # Only a worker that has not polled for many seconds lets this fill up; it is
            # about to be found hung and restarted, which re-replicates it anyway.
            log.warning("worker command queue full: dropping the oldest (%s)",
                        self.commands[0][1].OP)
        self.commands.append((self._seq, cmd))

    def drain(self) -> list[dict[str, Any]]:
        """The queued commands in their wire form (``worker.poll``), each once."""
        out = [{"seq": seq, "op": cmd.OP, "args": cmd.to_args()} for seq, cmd in self.commands]
        self.commands.clear()
        return out

    @property
    def busy(self) -> bool:
        """The daemon is still working on a request of the worker's."""
        return self._serving > 0

    @contextlib.contextmanager
    def serving(self, clock: Clock) -> Iterator[None]:
        """Around a slow request of the worker's (attach, probe): the worker waits on us
        meanwhile, so no silence counts, and the answer counts as a poll."""
        self._serving += 1
        try:
            yield
        finally:
            self._serving -= 1
            self.last_poll = max(self.last_poll, clock.monotonic())

    def forgive(self, now: float) -> None:
        """Judge silence from ``now``: the daemon itself was frozen, so nobody could poll."""
        self.last_poll = max(self.last_poll, now)

    def detach(self) -> None:
        self.pid = 0
        self.version = -1
        self.data_addr = ""
        self.state = "standby"
        self.leave_requested = False
        self.commands.clear()


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` exists (another user's counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def unresponsive_for(w: WorkerSession, now: float, limit_s: float) -> float | None:
    """Seconds the attached worker has not polled, once that reaches ``limit_s``; else None.

    A worker that is not attached yet (starting, importing torch) is exempt: it has no
    session to keep alive and holds up nobody's round. ``limit_s`` 0 turns the check off.
    """
    if not w.attached or limit_s <= 0 or w.busy:
        return None
    silent = now - w.last_poll
    return silent if silent >= limit_s else None


class WorkerSupervisor:
    """Starts the worker command, restarts it on failure, stops it on request."""

    def __init__(self, log_dir: str, env: dict[str, str], nice: int = 0) -> None:
        self._log_dir = Path(log_dir)
        self._env = env
        self._nice = nice  # added to chaosd's niceness in the child (``[worker] nice``)
        self._job = Job(argv=[])
        self._memory = JobMemory(log_dir)
        self._proc: asyncio.subprocess.Process | None = None
        self._task: asyncio.Task[None] | None = None
        self._stopping = False
        self._leaving = False  # the operator said leave: an exit is not restarted
        self._killed = False  # the last exit was our SIGKILL of a hung worker
        self.restarts = 0
        #: Why the cluster refused the worker's state (``refuse``); such a worker is not
        #: restarted until the next ``start`` (a fixed script, or ``chaosctl join`` again).
        self.refused: str | None = None
        self.last_exit: int | None = None
        self.start_error: str | None = None  # why the command could not start (then: 127)
        self.on_exit: list[Any] = []  # callbacks(returncode) run after each exit

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.returncode is None

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self.running and self._proc else None

    @property
    def supervising(self) -> bool:
        """A worker runs, or waits out its restart backoff."""
        return self._task is not None and not self._task.done()

    def owns(self, pid: int) -> bool:
        """Whether ``pid`` runs in the worker's process group (the command or its child)."""
        if not self.running or self._proc is None:
            return False
        try:
            return os.getpgid(pid) == self._proc.pid
        except ProcessLookupError:
            return False

    @property
    def job(self) -> Job:
        """The job supervised last (its ``argv`` is empty before the first)."""
        return self._job

    def start(self, job: Job) -> None:
        """Start supervising ``job`` (replacing any finished worker), and remember it."""
        if self.supervising:
            # One waiting out its backoff too: a second loop would run two workers.
            raise RuntimeError("a worker is already running or restarting")
        self._job = job
        self._stopping, self.refused, self.start_error = False, None, None
        self._leaving = False
        self._memory.save(job)
        self._task = asyncio.create_task(self._supervise(), name="worker")

    def resume(self) -> Job | None:
        """At chaosd's start: start the job an earlier run supervised, if one is remembered
        (the box rebooted, or chaosd crashed or was restarted, mid-job)."""
        job = self._memory.load()
        if job is not None and not self.supervising:
            log.info("starting the job remembered from the last run: %s", " ".join(job.argv))
            self.start(job)
        return job

    def forget(self) -> None:
        """The operator said leave: nothing starts the worker again, neither after a reboot
        nor when it exits while it leaves. A worker that crashed mid-leave was restarted,
        its new session knew nothing of the leave, and it trained on for 14 minutes (the
        soak's hour in stop 36, n1 left at t=29 s)."""
        self._memory.forget()
        self._leaving = True

    async def _spawn(self) -> asyncio.subprocess.Process:
        self._log_dir.mkdir(parents=True, exist_ok=True)
        out = open(self._log_dir / "worker.log", "ab")  # noqa: SIM115 - handed to the child
        try:
            job = self._job
            return await asyncio.create_subprocess_exec(
                *job.argv, stdin=asyncio.subprocess.DEVNULL, stdout=out, stderr=out,
                env={**(job.env or os.environ), **self._env}, cwd=job.cwd or None,
                start_new_session=True, preexec_fn=self._prepare_child)
        finally:
            out.close()

    def _prepare_child(self) -> None:
        """In the child, before exec: die with chaosd, and run ``[worker] nice`` below it.

        A daemon killed (or stopped hard) must not leave its worker training alone; SIGKILL,
        because the worker turns SIGTERM into a graceful leave via chaosd.
        """
        kill_with_parent()
        if self._nice:
            os.nice(self._nice)

    def refuse(self, reason: str) -> None:
        """The worker's state does not fit the cluster's: let it exit, do not restart it
        (after a reboot neither: the same script would not fit)."""
        self.refused = reason
        self._memory.forget()

    def kill(self) -> bool:
        """SIGKILL the worker's process group now; the loop restarts it as after a crash.

        For a hung worker: SIGKILL is the one signal a stopped (SIGSTOP) or wedged process
        obeys, and the kernel then closes its sockets. False if no worker was running.
        """
        proc = self._proc
        if proc is None or proc.returncode is not None or self._stopping:
            return False
        self._killed = True
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        return True

    async def _supervise(self) -> None:
        loop = asyncio.get_running_loop()
        backoff = RESTART_MIN_S
        while not self._stopping:
            try:
                self._proc = await self._spawn()
            except OSError as exc:
                # Not retried, and forgotten: a command that is gone (a venv removed, a
                # script renamed) would otherwise fail on every restart of chaosd.
                self.start_error = f"cannot start worker {self._job.argv[0]}: {exc}"
                log.error("%s; not retried", self.start_error)
                self._memory.forget()
                self.last_exit = 127
                for cb in self.on_exit:
                    cb(127)
                return
            log.info("worker started: pid %d: %s", self._proc.pid, " ".join(self._job.argv))
            started = loop.time()
            code = await self._proc.wait()
            killed, self._killed = self._killed, False
            self.last_exit = code
            for cb in self.on_exit:
                cb(code)
            if self._stopping or (code == 0 and not killed):
                log.info("worker exited with %d", code)
                if not self._stopping:  # the script is done (or left): nothing to resume
                    self._memory.forget()
                return
            if self.refused is not None:
                log.error("worker exited with %d and is not restarted: %s", code, self.refused)
                return
            if self._leaving:
                log.warning("worker exited with %d while it left; not restarted", code)
                return
            self.restarts += 1
            if loop.time() - started >= RESTART_MAX_S:
                backoff = RESTART_MIN_S  # it ran well: this is a new failure, not a crash loop
            # A kill of ours was logged (as a warning) when the hang was found.
            log.log(logging.INFO if killed else logging.WARNING,
                    "worker exited with %d; restarting in %.0f s", code, backoff)
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, RESTART_MAX_S)

    async def stop(self, grace: float = STOP_GRACE_S) -> None:
        """SIGTERM the worker's process group, then SIGKILL after ``grace``."""
        self._stopping = True
        proc = self._proc
        if proc is not None and proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
                os.killpg(proc.pid, signal.SIGCONT)  # a stopped worker handles its TERM too
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
