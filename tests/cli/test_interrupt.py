"""The tests' own runner of chaosctl: interrupted, it lets the command tear down (a Ctrl-C)
instead of killing it, which left a bench's mosquitto running once."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.cli.conftest import interrupt

pytestmark = pytest.mark.timeout(30)

# Stands in for a bench: on Ctrl-C it "tears down" (writes a file), then exits as chaosctl does.
TEARS_DOWN = """
import signal, sys, time
from pathlib import Path
def down(*_):
    Path(sys.argv[1]).write_text("torn down")
    sys.exit(130)
signal.signal(signal.SIGINT, down)
print("up", flush=True)
time.sleep(60)
"""
IGNORES = "import signal, time; signal.signal(signal.SIGINT, signal.SIG_IGN); " \
          "print('up', flush=True); time.sleep(60)"


def started(code: str, *args: str) -> subprocess.Popen[str]:
    proc = subprocess.Popen([sys.executable, "-c", code, *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL)
    assert proc.stdout is not None and proc.stdout.readline() == "up\n"
    return proc


def test_an_interrupted_command_gets_a_ctrl_c_and_time_to_tear_down(tmp_path: Path) -> None:
    marker = tmp_path / "down"
    proc = started(TEARS_DOWN, str(marker))
    interrupt(proc, grace=20)
    assert proc.returncode == 130 and marker.read_text() == "torn down"


def test_a_command_that_ignores_the_ctrl_c_is_killed_after_the_grace() -> None:
    proc = started(IGNORES)
    interrupt(proc, grace=0.5)
    assert proc.returncode == -9
