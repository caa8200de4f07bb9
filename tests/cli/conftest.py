"""Fixtures for driving the real ``chaosctl`` console script against a fake control socket.

The fake speaks the documented line protocol (docs/control-protocol.md) with canned answers:
a fake only at the seam, so the CLI's own socket code runs for real.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

# An answer is a response object, raw bytes sent as they are, None (hang up without a word),
# or a callable that builds one of those from the request.
Answer = dict[str, Any] | bytes | None
Responder = Answer | Callable[[dict[str, Any]], Answer]


def ok(data: Any) -> dict[str, Any]:
    """A successful v1 response."""
    return {"v": 1, "ok": True, "data": data}


def fail(error: str, code: str = "failed") -> dict[str, Any]:
    """An error v1 response."""
    return {"v": 1, "ok": False, "error": error, "code": code}


@dataclass
class FakeDaemon:
    """A Unix-socket server thread answering requests from ``answers`` by op."""

    path: Path
    answers: dict[str, Responder] = field(default_factory=dict)
    requests: list[dict[str, Any]] = field(default_factory=list)
    hang: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        self._server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._server.bind(str(self.path))
        self._server.listen(16)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._server.accept()
            except OSError:
                return
            threading.Thread(target=self._handle, args=(conn,), daemon=True).start()

    def _handle(self, conn: socket.socket) -> None:
        with conn, conn.makefile("rb") as lines:
            for line in lines:
                request = json.loads(line)
                self.requests.append(request)
                responder = self.answers.get(request["op"], fail("unknown op", "usage"))
                answer = responder(request) if callable(responder) else responder
                if self.hang.is_set():
                    self._stop.wait(30)
                    return
                if answer is None:
                    return
                raw = answer if isinstance(answer, bytes) else json.dumps(answer).encode() + b"\n"
                try:
                    conn.sendall(raw)
                except OSError:
                    return

    def close(self) -> None:
        """Stop accepting and release the socket."""
        self._stop.set()
        with contextlib.suppress(OSError):
            self._server.shutdown(socket.SHUT_RDWR)
        self._server.close()


@pytest.fixture
def sock_dir() -> Iterator[Path]:
    """A short temp dir: Unix socket paths must stay under 108 bytes."""
    path = Path(tempfile.mkdtemp(prefix="ctl-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def fake(sock_dir: Path) -> Iterator[FakeDaemon]:
    """A running fake daemon on ``<sock_dir>/chaosd.sock``."""
    daemon = FakeDaemon(sock_dir / "chaosd.sock")
    yield daemon
    daemon.close()


def chaosctl_argv() -> list[str]:
    """The installed console script, next to this interpreter when possible."""
    beside = Path(sys.executable).with_name("chaosctl")
    found = str(beside) if beside.exists() else shutil.which("chaosctl")
    if not found:
        pytest.skip("the chaosctl console script is not installed (pip install -e .)")
    return [found]


def ctl_env(socket_path: Path | None = None) -> dict[str, str]:
    """Environment for a chaosctl run: no colours, fixed width, chosen socket."""
    env = {k: v for k, v in os.environ.items() if k != "CHAOS_SOCKET"}
    env.update({"NO_COLOR": "1", "COLUMNS": "160", "TERM": "dumb"})
    if socket_path is not None:
        env["CHAOS_SOCKET"] = str(socket_path)
    return env


TEARDOWN_S = 60.0  # how long an interrupted chaosctl may take to tear down what it started


def run_ctl(*args: str, socket_path: Path | None = None,
            timeout: float = 30) -> subprocess.CompletedProcess[str]:
    """Run ``chaosctl ARGS`` to completion and capture its output.

    Interrupted (Ctrl-C, the test's timeout, or past ``timeout``), chaosctl gets a Ctrl-C of
    its own and TEARDOWN_S to take down what it started, as a user's Ctrl-C does:
    ``subprocess.run`` sends SIGKILL, and a bench killed so left its mosquitto running (stop
    48). A second Ctrl-C while it tears down is the user's to give: this returns at once, and
    chaosctl, which heard it too, handles it (benches and the demo leave nothing either way).
    """
    argv = [*chaosctl_argv(), *args]
    with subprocess.Popen(argv, env=ctl_env(socket_path), stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL) as proc:
        try:
            out, err = proc.communicate(timeout=timeout)
        except BaseException:
            interrupt(proc)
            raise
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)


def interrupt(proc: subprocess.Popen[str], grace: float = TEARDOWN_S) -> None:
    """Ctrl-C ``proc`` and wait ``grace`` seconds for it to tear down; then SIGKILL it."""
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGINT)
    try:
        proc.communicate(timeout=grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()


def run_ctl_here(*args: str, monkeypatch: pytest.MonkeyPatch,
                 socket_path: Path | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``chaosctl ARGS`` in this process: the same ``chaosctl.main.run`` the console script
    calls, with the same environment. For the long tables of bad values, each refused before
    anything starts: a process each cost the suite about 0.7 CPU-s of imports, 40 s in all.
    The console script itself keeps its own tests (:func:`run_ctl`)."""
    from chaosctl.main import run

    monkeypatch.delenv("CHAOS_SOCKET", raising=False)
    for key, value in ctl_env(socket_path).items():
        monkeypatch.setenv(key, value)
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = run(list(args))
    return subprocess.CompletedProcess(["chaosctl", *args], code, out.getvalue(),
                                      err.getvalue())


def assert_one_line_error(proc: subprocess.CompletedProcess[str], code: int) -> str:
    """Check exit code, a single ``chaosctl:`` line on stderr, and no traceback."""
    assert proc.returncode == code, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr + proc.stdout
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("chaosctl"), lines[0]
    return lines[0]
