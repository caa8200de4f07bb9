"""ruff and mypy over the whole tree, so `pytest` alone is the CI gate."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.timeout(300)


def run(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", *argv], cwd=ROOT, capture_output=True,
                          text=True, timeout=280)


@pytest.mark.skipif(shutil.which("ruff") is None,
                    reason="ruff not installed (pip install -e '.[test]')")
def test_ruff() -> None:
    proc = run("ruff", "check", ".")
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_mypy() -> None:
    pytest.importorskip("mypy", reason="mypy not installed (pip install -e '.[test]')")
    proc = run("mypy")
    assert proc.returncode == 0, proc.stdout + proc.stderr
