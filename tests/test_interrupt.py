"""A test run killed with SIGTERM still runs its fixtures' finalizers (tests/conftest.py)."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(120)

ROOT = Path(__file__).resolve().parents[1]

_TEST = '''
import time
from pathlib import Path
import pytest

@pytest.fixture
def built(tmp_path_factory):
    marks = Path({out!r})
    (marks / f"up-{{__import__('os').getpid()}}").touch()
    yield
    (marks / f"down-{{__import__('os').getpid()}}").touch()

@pytest.mark.parametrize("i", range({n}))
def test_long(built, i):
    time.sleep(60)
'''


@pytest.mark.parametrize(("workers", "group"), [(0, False), (2, True)])
def test_sigterm_runs_the_finalizers(tmp_path: Path, workers: int, group: bool) -> None:
    """SIGTERM to the run (with -n 0), or to its whole process group (xdist's workers too):
    every fixture that was set up is torn down."""
    marks = tmp_path / "marks"
    marks.mkdir()
    n = max(workers, 1)
    (tmp_path / "test_victim.py").write_text(_TEST.format(out=str(marks), n=n))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "tests.conftest",
         "-n", str(workers), "--rootdir", str(tmp_path), "-c", os.devnull, str(tmp_path)],
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        start_new_session=True)
    try:
        deadline = time.monotonic() + 90
        while len(list(marks.glob("up-*"))) < n and time.monotonic() < deadline:
            time.sleep(0.1)
        assert len(list(marks.glob("up-*"))) == n, "the fixtures never came up"
        if group:
            os.killpg(proc.pid, signal.SIGTERM)
        else:
            proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    ups = sorted(p.name[3:] for p in marks.glob("up-*"))
    downs = sorted(p.name[5:] for p in marks.glob("down-*"))
    assert downs == ups
