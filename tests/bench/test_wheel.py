"""The installed package stands alone: a wheel in a fresh venv runs ``chaosctl bench planner``.

The wheel is built from a copy of the checkout (so the build writes nothing into the shared
tree) and installed with ``--no-deps`` into a venv outside the checkout that sees the running
interpreter's torch/numpy (``--system-site-packages``, and the running venv's packages when the
suite runs in one). Everything runs from a temp directory; the test checks
that every module of ours and the packaged model table come from the venv, so no ``../shared``
and no checkout file is read at run time.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import venv
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(400)

ROOT = Path(__file__).resolve().parents[2]
TOP_LEVEL_SKIP = {".git", "bench", "tests", "build", "dist", ".venv"}

# Run inside the venv: import what the bench uses, then name every module of ours (and the
# model table) that does not come from the venv.
PROBE = """
import json, sys
from importlib import resources
import chaosctl.main, chaos_bench.cli, chaos_bench.planner.run, chaos_bench.models as m
m.paper_models()
ours = {n: getattr(mod, "__file__", None) or "" for n, mod in list(sys.modules.items())
        if n.split(".")[0] in ("chaos_edge", "chaosctl", "daemon", "netprobe", "chaos_bench")}
data = str(resources.files("chaos_bench") / "data" / "paper_models.json")
print(json.dumps({"prefix": sys.prefix, "modules": ours, "data": data}))
"""


def _ignore(folder: str, names: list[str]) -> set[str]:
    top = TOP_LEVEL_SKIP if Path(folder) == ROOT else set()
    return {n for n in names if n in top or n == "__pycache__" or n.endswith(
        ("_cache", ".egg-info")) or n == ".hypothesis"}


def _env() -> dict[str, str]:
    # No PYTHONPATH that could point back at the checkout.
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update({"NO_COLOR": "1", "COLUMNS": "160", "TERM": "dumb", "MPLBACKEND": "Agg"})
    return env


def _run(argv: list[str], cwd: Path, timeout: float) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(argv, cwd=cwd, env=_env(), capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, (argv, proc.stdout[-2000:], proc.stderr[-4000:])
    return proc


def _see_running_packages(env_dir: Path) -> None:
    """Run from a venv (as a user installs), the suite's own packages (typer, torch, pip) are
    in that venv, not in the system's site-packages that ``--system-site-packages`` adds: a
    ``.pth`` puts them after the new venv's own, so the wheel installed there still comes
    first. (Directories a ``.pth`` adds have their own ``.pth`` files skipped, so an
    editable install of the checkout in the running venv stays out.)"""
    if sys.prefix == sys.base_prefix:
        return  # system-wide: --system-site-packages already sees them
    (site,) = env_dir.glob("lib/python*/site-packages")
    paths = dict.fromkeys([sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]])
    (site / "running-venv.pth").write_text("".join(f"{p}\n" for p in paths))


def test_wheel_runs_the_planner_bench_outside_the_checkout(tmp_path: Path) -> None:
    src, wheels, env_dir, work = (tmp_path / d for d in ("src", "wheels", "venv", "work"))
    shutil.copytree(ROOT, src, ignore=_ignore)
    work.mkdir()
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
          "--no-index", "-q", "-w", str(wheels), str(src)], work, 240)
    (wheel,) = wheels.glob("chaos_edge-*.whl")
    shutil.rmtree(src)  # from here on, only the wheel exists outside the checkout

    # No pip of its own (slow to set up): the system's pip, run by the venv's interpreter,
    # installs into the venv.
    venv.EnvBuilder(system_site_packages=True, with_pip=False).create(env_dir)
    python = env_dir / "bin" / "python"
    _see_running_packages(env_dir)
    _run([str(python), "-m", "pip", "install", "-q", "--no-deps", "--no-index", str(wheel)],
         work, 120)

    probe = json.loads(_run([str(python), "-c", PROBE], work, 60).stdout)
    assert Path(probe["prefix"]) == env_dir
    # (a namespace package has no file; none of ours is one)
    stray = {n: f for n, f in probe["modules"].items() if not Path(f).is_relative_to(env_dir)}
    assert stray == {}
    assert Path(probe["data"]).is_relative_to(env_dir)
    assert "chaosctl" in probe["modules"] and "chaos_bench" in probe["modules"]

    out = work / "out"
    proc = _run([str(env_dir / "bin" / "chaosctl"), "bench", "planner", "--quick",
                 "--models", "vgg11", "--out", str(out)], work, 240)
    rows = [line for line in proc.stdout.splitlines() if line.startswith("| vgg11 |")]
    assert len(rows) == 3, proc.stdout  # 2, 8 and 64 neighbours in quick mode
    doc = json.loads((out / "planner_bench.json").read_text())
    assert "vgg11" in {r["state"] for r in doc["runtime"]}
    assert doc["models"] == ["vgg11"]
