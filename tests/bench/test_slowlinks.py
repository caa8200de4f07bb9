"""``chaosctl bench slowlinks``: bad values are one line (exit 2) before anything starts, and
the report's arithmetic and goal verdicts on a fixed set of runs."""

from __future__ import annotations

from typing import Any

import pytest

from chaos_bench.slowlinks import report as slowlinks_report
from chaos_bench.slowlinks import run as slowlinks
from tests.cli.conftest import assert_one_line_error, run_ctl

pytestmark = pytest.mark.timeout(120)


def test_help() -> None:
    proc = run_ctl("bench", "slowlinks", "--help")
    assert proc.returncode == 0, proc.stderr
    assert "Usage: chaosctl bench slowlinks" in proc.stdout


@pytest.mark.parametrize(("args", "needle"), [
    (["--rates", "fast"], "--rates must be numbers"),
    (["--rates", "0"], "--rates must be Mbit/s"),
    (["--inner-steps", "1"], "--inner-steps"),
    (["--steps", "90", "--inner-steps", "20"], "multiple of every H"),
    (["--outer-momentum", "1.5"], "--outer-momentum"),
])
def test_bad_values_are_one_line(args: list[str], needle: str) -> None:
    line = assert_one_line_error(run_ctl("bench", "slowlinks", *args), 2)
    assert needle in line, line


def _run(rate: float, h: int, wall: float, tx: int, acc: float, loss: float) -> dict[str, Any]:
    evals = [{"step": 0, "t": 0.0, "tx": 0, "loss": 2.3, "acc": 0.1},
             {"step": 300, "t": wall, "tx": tx, "loss": loss, "acc": acc}]
    nodes = {n: {"node": n, "start": 100, "began": 100, "steps": 300, "inner_steps": h,
                 "wall_s": wall, "tx_bytes": tx, "evals": evals if n == "n1" else []}
             for n in ("n1", "n2", "n3")}
    return {"rate_mbps": rate, "mode": "every-step" if h == 1 else f"diloco H={h}",
            "inner_steps": h, "start": 100, "nodes": nodes}


def test_report_ratios_and_goal() -> None:
    runs = [_run(50, 1, 70.0, 280_000_000, 0.964, 0.089),
            _run(50, 20, 6.0, 14_000_000, 0.958, 0.5),    # 20x fewer bytes, -0.6 pt: met
            _run(50, 50, 3.0, 5_600_000, 0.947, 0.35),    # -1.7 pt, loss worse: quality fails
            _run(20, 20, 12.0, 14_000_000, 0.958, 0.5)]   # no every-step at 20: no ratios
    doc = slowlinks_report.analyse(runs, 0.95)
    rows = {(r["rate_mbps"], r["inner_steps"]): r for r in doc["rows"]}
    h20 = rows[(50, 20)]
    assert h20["bytes_x_fewer"] == pytest.approx(20.0)
    assert h20["time_x_faster"] == pytest.approx(70 / 6)
    assert h20["acc_pts_vs_every_step"] == pytest.approx(-0.6)
    assert h20["to_target_s"] == 6.0 and rows[(50, 50)]["to_target_s"] is None
    assert "bytes_x_fewer" not in rows[(20, 20)]
    goal = {g["mode"]: g for g in doc["goal_at_50mbps"]}
    assert goal["diloco H=20"]["met"]
    assert not goal["diloco H=50"]["met"] and not goal["diloco H=50"]["quality"]
    text = slowlinks_report.table(doc)
    assert "goal at 50 Mbit/s, diloco H=50: NOT met (quality)" in text


def test_config_of_each_mode() -> None:
    opts = slowlinks.Options(outer_momentum=0.5)
    assert "[training]" not in slowlinks.config_of(1, opts)
    text = slowlinks.config_of(20, opts)
    assert 'sync = "diloco"' in text and "inner_steps = 20" in text
    assert "outer_momentum = 0.5" in text and "bandwidth_period_s" in text
    assert [m for m, _ in slowlinks.modes(opts)] == ["every-step", "diloco H=20", "diloco H=50"]
