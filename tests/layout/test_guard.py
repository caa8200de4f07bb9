"""The python-daemon guard, for real: a foreign ``daemon`` package first on the path.

python-daemon installs a top-level ``daemon`` too. Each case builds one on disk, puts it first
on ``PYTHONPATH`` (the checkout after it, so that ``chaos_edge`` is ours either way) and runs
``chaosd`` and a training script's import in subprocesses, from a directory that is not the
checkout (``python -c`` puts the working directory first on ``sys.path``).
"""

from __future__ import annotations

import importlib.metadata
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from chaos_edge._guard import ensure_own_daemon_package

pytestmark = pytest.mark.timeout(120)

ROOT = Path(__file__).resolve().parents[2]
# What python-daemon's files look like, reduced to their imports and names.
PY_DAEMON = {
    "__init__.py": ('"""Library to implement a well-behaved Unix daemon process."""\n'
                    "from .daemon import DaemonContext\n__all__ = ['DaemonContext']\n"),
    "daemon.py": "class DaemonContext:\n    pass\n",
    "runner.py": "from . import pidfile\nfrom .daemon import DaemonContext\n"
                 "class DaemonRunner:\n    pass\n",
    "pidfile.py": "class TimeoutPIDLockFile:\n    pass\n",
}
CHAOSD_VIA_PYTHON = "import sys; from chaos_edge.cli import chaosd; sys.exit(chaosd())"


def _write(pkg: Path, files: dict[str, str]) -> None:
    pkg.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (pkg / name).write_text(text)


def shadowed(root: Path) -> Path:
    """python-daemon alone, first on the path."""
    _write(root / "daemon", PY_DAEMON)
    return root


def overlaid(root: Path) -> Path:
    """Chaos's package with python-daemon's modules unpacked into it (our marker kept)."""
    shutil.copytree(ROOT / "daemon", root / "daemon",
                    ignore=shutil.ignore_patterns("__pycache__"))
    _write(root / "daemon", {k: v for k, v in PY_DAEMON.items() if k != "__init__.py"})
    return root


def broken(root: Path) -> Path:
    """python-daemon whose own import fails (its dependency lockfile is missing)."""
    _write(root / "daemon", {**PY_DAEMON, "__init__.py": "import lockfile_not_here\n"})
    return root


LAYOUTS = [shadowed, overlaid, broken]


def run(argv: list[str], first: Path | None, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CHAOS_")}
    env["PYTHONPATH"] = os.pathsep.join([*([str(first)] if first else []), str(ROOT)])
    return subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True, timeout=90,
                          stdin=subprocess.DEVNULL)


def chaosd_argv(how: str) -> list[str]:
    if how == "python":
        return [sys.executable, "-c", CHAOSD_VIA_PYTHON]
    beside = Path(sys.executable).with_name("chaosd")
    found = str(beside) if beside.exists() else shutil.which("chaosd")
    if not found:
        pytest.skip("the chaosd console script is not installed (pip install -e .)")
    return [found]


def assert_names_problem_and_fix(line: str, where: Path) -> None:
    assert "python-daemon" in line, line
    assert "virtual environment" in line and "pip uninstall python-daemon" in line, line
    assert "pip install --force-reinstall chaos-edge" in line, line
    assert str(where / "daemon") in line or "cannot import" in line, line


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("how", ["script", "python"])
def test_chaosd_stops_with_one_line(layout: Callable[[Path], Path], how: str,
                                    tmp_path: Path) -> None:
    first = layout(tmp_path / "site")
    proc = run([*chaosd_argv(how), "--help"], first, tmp_path)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stdout == ""  # stopped before the daemon's own argument parser ran
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("chaosd: "), lines[0]
    assert_names_problem_and_fix(lines[0], first)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_training_script_gets_one_line_import_error(layout: Callable[[Path], Path],
                                                    tmp_path: Path) -> None:
    """A script's ``from chaos_edge import Trainer`` raises an ImportError whose message is
    the one line; the library never exits the user's process by itself."""
    first = layout(tmp_path / "site")
    caught = run([sys.executable, "-c",
                  "import chaos_edge\n"
                  "try:\n    from chaos_edge import Trainer\n"
                  "except ImportError as exc:\n"
                  "    print(isinstance(exc, chaos_edge.DaemonPackageClash)); print(exc)\n"],
                 first, tmp_path)
    assert caught.returncode == 0, caught.stderr
    kind, message = caught.stdout.splitlines()
    assert kind == "True"
    assert_names_problem_and_fix(message, first)

    raw = run([sys.executable, "-c", "from chaos_edge import Trainer"], first, tmp_path)
    assert raw.returncode == 1
    assert raw.stderr.splitlines()[-1] == f"chaos_edge._guard.DaemonPackageClash: {message}"
    assert "During handling" not in raw.stderr  # raised from None: one cause, not a chain


def test_no_clash_here() -> None:
    """This environment has no python-daemon: ``daemon`` is ours, alone."""
    ensure_own_daemon_package()
    with pytest.raises(importlib.metadata.PackageNotFoundError):  # what `pip show` reads
        importlib.metadata.distribution("python-daemon")


def test_chaosd_and_the_api_without_a_clash(tmp_path: Path) -> None:
    """The guard passes quietly; ``chaosd`` (whose import is checked here too) and
    ``import chaos_edge`` load no torch; the documented names are there."""
    proc = run([*chaosd_argv("script"), "--help"], None, tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "--node-id" in proc.stdout
    code = ("import sys, chaos_edge.cli, chaos_edge; assert 'torch' not in sys.modules\n"
            "from chaos_edge import Trainer, capture_exit_event, TrainerError, StateDiverged\n"
            "from chaos_edge.trainer import Trainer as Impl\n"
            "assert Trainer is Impl and issubclass(StateDiverged, TrainerError)\n"
            "for name in ('update', 'check_state_replication', 'request_node_exit', 'close'):\n"
            "    assert callable(getattr(Trainer, name)), name\n"
            "assert capture_exit_event() is False\n"
            "print('ok')\n")
    api = run([sys.executable, "-c", code], None, tmp_path)
    assert api.returncode == 0 and api.stdout.strip() == "ok", api.stderr


def test_chaosd_script_passes_the_exit_status_on(tmp_path: Path) -> None:
    """A bad value stops chaosd with exit 2 (chaosd(8)); the entry point must not drop it."""
    proc = run([*chaosd_argv("script"), "--node-id", "not/valid"], None, tmp_path)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.startswith("chaosd: ") and "node_id" in proc.stderr
