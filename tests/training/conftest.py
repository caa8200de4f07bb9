"""Fixtures of the training tests: worker processes that are always killed at the end."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Iterator

import pytest


@pytest.fixture
def procs() -> Iterator[list[subprocess.Popen[bytes]]]:
    """A list to register child processes in; each is killed with its group on teardown."""
    made: list[subprocess.Popen[bytes]] = []
    yield made
    for p in made:
        if p.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            p.wait(5)
