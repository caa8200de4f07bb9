"""``chaosctl bench check``: the deterministic headline guards hold on this code against the
committed results (this is the CI guard), and a figure worse than committed fails the command.

The timing guard (``allreduce``) is not run here: a loaded CI box moves its ratio.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.cli.conftest import chaosctl_argv, ctl_env

pytestmark = pytest.mark.timeout(120)
RESULTS = Path(__file__).resolve().parents[2] / "bench" / "results"
DETERMINISTIC = "planner,simulate"


def check(results: Path, out: Path, only: str = DETERMINISTIC) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*chaosctl_argv(), "bench", "check", "--only", only, "--results",
                           str(results), "--out", str(out)], env=ctl_env(),
                          capture_output=True, text=True, timeout=100, stdin=subprocess.DEVNULL)


def committed_copy(tmp: Path) -> Path:
    """The committed files the deterministic guards read, copied so a test can doctor them."""
    for rel in ("planner/planner_bench.json", "simulate/simulate.json",
                "scaleout-testbed-stop3/scaleout.json"):
        (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(RESULTS / rel, tmp / rel)
    return tmp


def edit(path: Path, change: Any) -> None:
    doc = json.loads(path.read_text())
    change(doc)
    path.write_text(json.dumps(doc))


def test_the_deterministic_headlines_hold_against_the_committed_results(tmp_path: Path) -> None:
    proc = check(RESULTS, tmp_path / "out")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    doc = json.loads((tmp_path / "out" / "check.json").read_text())
    assert doc["regressed"] == [] and doc["guards"] == ["planner", "simulate"]
    verdicts = {v["headline"]: v for v in doc["verdicts"]}
    assert len(verdicts) == 4 and all(v["ok"] for v in verdicts.values())
    star = verdicts["star: Algorithms 1+2 makespan / chaos"]
    assert star["now"] == pytest.approx(star["committed"], rel=1e-9)  # deterministic
    bound = verdicts["every shape: worst chaos makespan / bound"]
    assert 0.99 < bound["now"] <= bound["floor"]


def test_a_figure_worse_than_committed_fails_the_command(tmp_path: Path) -> None:
    results = committed_copy(tmp_path / "results")

    def better_than_possible(doc: dict[str, Any]) -> None:
        doc["star"]["paper"]["makespan_s"] *= 2  # as if Chaos once beat Algorithms 1+2 by 3.5x

    edit(results / "planner" / "planner_bench.json", better_than_possible)

    def all_within(doc: dict[str, Any]) -> None:
        for row in doc["validation"]["summary"]:
            row["within"] = row["points"]

    edit(results / "simulate" / "simulate.json", all_within)
    proc = check(results, tmp_path / "out")
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    doc = json.loads((tmp_path / "out" / "check.json").read_text())
    assert sorted(doc["regressed"]) == sorted([
        "star: Algorithms 1+2 makespan / chaos",
        "network-strategy points within 15% of the testbed, of 108"])
    assert "regressed: " in proc.stderr and "REGRESSED" in proc.stdout


@pytest.mark.parametrize(("args", "message"), [
    (["--only", "planner,nope"],
     "--only: nope is not one of planner, simulate, allreduce, mesh, scaleout"),
    (["--tolerance", "2"], "--tolerance"),
])
def test_bad_options_get_one_line(tmp_path: Path, args: list[str], message: str) -> None:
    proc = subprocess.run([*chaosctl_argv(), "bench", "check", *args, "--out",
                           str(tmp_path / "out")], env=ctl_env(), capture_output=True, text=True,
                          timeout=60, stdin=subprocess.DEVNULL)
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr
    assert not (tmp_path / "out").exists()


def test_missing_committed_results_get_one_line(tmp_path: Path) -> None:
    proc = check(tmp_path / "nowhere", tmp_path / "out")
    assert proc.returncode != 0
    lines = [x for x in proc.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and "no committed results at" in lines[0], proc.stderr
    (tmp_path / "empty").mkdir()
    for guard in ("allreduce", "mesh", "scaleout"):  # before any builds anything
        proc = check(tmp_path / "empty", tmp_path / "out", guard)
        assert proc.returncode != 0 and "no committed result" in proc.stderr, proc.stderr
