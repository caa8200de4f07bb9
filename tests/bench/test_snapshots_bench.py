"""``chaosctl bench snapshots``: a quick run writes its tables and every timed value, the MLP
path works at a narrow width, the default schedule's arithmetic, and a bad model is one line
(exit 2). No wall-clock assertions: the timings are whatever this machine gives."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from chaos_bench.snapshots import run as snapshots
from tests.cli.conftest import assert_one_line_error, run_ctl

pytestmark = pytest.mark.timeout(180)


def _check_model(m: dict, plan: snapshots.Plan) -> None:
    assert m["params"] > 0 and m["snapshot_bytes"] > m["state_bytes"] > 0  # + the header
    assert len(m["step"]["times_s"]) == plan.steps and m["step"]["median_s"] > 0
    assert len(m["capture"]["times_s"]) == plan.captures and m["capture"]["median_s"] > 0
    bg = m["background"]
    for key in ("hash_s", "write_s", "total_s", "cpu_s", "bytes"):
        assert len(bg[key]) == plan.writes, key
    assert all(b == m["snapshot_bytes"] for b in bg["bytes"])
    assert bg["median_s"] > 0 and bg["median_cpu_s"] > 0
    e = m["end_to_end"]
    assert len(e["pairs"]) == plan.pairs
    assert [p["first"] for p in e["pairs"]][:2] == ["with", "without"]  # alternating
    for p in e["pairs"]:
        w, wo = p["with"], p["without"]
        assert w["with_snapshots"] and not wo["with_snapshots"]
        assert len(w["steps_s"]) == len(wo["steps_s"]) == plan.run_steps
        assert w["captures"] >= 1 and len(w["capture_s"]) == w["captures"]
        assert wo["captures"] == 0 and wo["committed_s"] == 0
        assert w["failed"] is None and p["ratio"] > 0
    assert e["ratio"]["min"] <= e["ratio"]["median"] <= e["ratio"]["max"]
    d = m["defaults"]
    assert d["interval_steps"] % 100 == 0 and d["interval_s"] >= 10
    assert d["snapshots_per_hour"] > 0 and d["disk_bytes_per_hour"] > 0
    assert 0 < d["step_path_share"] < 1 and d["network_bytes_per_hour"] == 0
    assert m["peak_rss_bytes"] > 0


def test_quick_run_writes_every_timed_value(tmp_path: Path) -> None:
    proc = run_ctl("bench", "snapshots", "--quick", "--out", str(tmp_path), timeout=150)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads((tmp_path / "snapshots.json").read_text())
    assert doc["quick"] and doc["torch_threads"] == 1
    assert doc["settings_default"] == {"every_steps": 100, "every_s": 10.0, "keep": 3}
    assert [m["model"] for m in doc["models"]] == ["cnn"]
    _check_model(doc["models"][0], snapshots.QUICK_PLANS["cnn"])
    assert (tmp_path / "snapshots.md").read_text().startswith("| model |")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["snapshots.json", "snapshots.md"]
    assert "| cnn |" in proc.stdout


def test_the_mlp_path_at_a_narrow_width(tmp_path: Path) -> None:
    plan = snapshots.Plan("mlp100m", 8, steps=2, captures=2, writes=2, run_steps=6,
                          every_steps=2, pairs=2, warmup=1, width=64, layers=2)
    lines: list[str] = []
    doc = snapshots.run(False, ["mlp100m"], tmp_path, lines.append, {"mlp100m": plan})
    m = doc["models"][0]
    assert m["params"] == 2 * (64 * 64 + 64) + 64 * 10 + 10
    _check_model(m, plan)
    assert "| mlp100m |" in snapshots.table(doc)
    assert any("end-to-end pair 2/2" in line for line in lines)


@pytest.mark.parametrize(("step_s", "background_s", "steps"), [
    (0.05, 0.1, 200),  # 100 steps last 5 s: the every_s rule waits for the next multiple
    (0.2, 1.0, 100),  # 100 steps last 20 s: every 100 steps
    (0.2, 25.0, 200),  # the writer is still busy at step 100: the next multiple
])
def test_default_schedule(step_s: float, background_s: float, steps: int) -> None:
    d = snapshots.at_defaults(step_s, 0.01, background_s, background_s, 1000, None)
    assert d["interval_steps"] == steps
    assert d["interval_s"] == pytest.approx(steps * step_s)
    assert d["snapshots_per_hour"] == pytest.approx(3600 / (steps * step_s), rel=1e-3)
    assert d["disk_bytes_per_hour"] == round(3600 / (steps * step_s) * 1000)
    assert d["step_path_share"] == pytest.approx(0.01 / (steps * step_s), rel=1e-3)
    assert d["disk_bytes_held"] == 4000 and d["network_bytes_per_hour"] == 0


def test_an_unknown_model_is_one_line() -> None:
    line = assert_one_line_error(run_ctl("bench", "snapshots", "--models", "cnn,resnet"), 2)
    assert "--models: resnet is not one of cnn, mlp100m" in line, line
