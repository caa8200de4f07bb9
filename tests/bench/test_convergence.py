"""``chaosctl bench convergence --short`` end to end: a real cluster, real workers, real models.

One run of the CI mode (static 2 and 3 nodes, a 2->3 scale-out and a 3->2 scale-in, in
consistent mode, on a tiny CNN on scikit-learn's digits). The test asserts only what holds
however the box is loaded: the command succeeds, the JSON has its keys, the loss falls, and,
read back from the workers' own records: every member holds the same state digest at every
step it shares with others, and the step accounting is exact (steps 1..N, each committed
once by each member, the members changing only at the planned join and leave). No timing.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import pytest

from tests.cli.conftest import run_ctl

pytestmark = [
    pytest.mark.xdist_group("bench"),  # CPU-bound: never beside another bench
    pytest.mark.timeout(300),  # about 65 s on a quiet 2-core box
    pytest.mark.skipif(importlib.util.find_spec("sklearn") is None,
                       reason="the CNN's digits need scikit-learn"),
]
RUNS = {"static-2": (2, 2), "static-3": (3, 3), "2->3": (2, 3), "3->2": (3, 2)}


def rows(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def check_records(run_dir: Path, start: int, end: int) -> None:
    """Digests and step accounting, straight from the workers' JSON lines."""
    recs = {p.stem: rows(p) for p in sorted(run_dir.glob("node-*.jsonl"))}
    assert sorted(recs) == [f"node-{i}" for i in range(1, max(start, end) + 1)]
    by_step: dict[int, dict[str, dict[str, Any]]] = {}
    for node, rs in recs.items():
        steps = [r["step"] for r in rs if r["kind"] == "step"]
        assert steps == list(range(steps[0], steps[0] + len(steps))), f"{node}: gaps or twice"
        assert sum(r["kind"] == "start" for r in rs) == 1, f"{node}'s worker restarted"
        assert rs[-1]["kind"] in ("done", "exit"), f"{node} did not finish"
        for r in rs:
            if r["kind"] == "step":
                by_step.setdefault(r["step"], {})[node] = r
    assert sorted(by_step) == list(range(1, max(by_step) + 1))
    for step, got in by_step.items():
        assert len({r["digest"] for r in got.values()}) == 1, f"step {step} diverged"
    # Members while training: who committed each step, plus a leaver's last rounds (without
    # samples, inside its leave: after its "leave" record, up to its "exit" record).
    drain = {n: range(next(r["step"] for r in rs if r["kind"] == "leave") + 1,
                      next(r["step"] for r in rs if r["kind"] == "exit") + 1)
             for n, rs in recs.items() if rs[-1]["kind"] == "exit"}
    seen: list[set[str]] = []
    for step, got in by_step.items():
        if next(iter(got.values()))["phase"] != "train":
            continue
        members = set(got) | {n for n, d in drain.items() if step in d}
        if not seen or seen[-1] != members:
            seen.append(members)
    ids = [f"node-{i}" for i in range(1, max(start, end) + 1)]
    assert seen == [set(ids[:start])] + ([set(ids[:end])] if end != start else [])


def test_short_convergence_bench(tmp_path: Path) -> None:
    out, keep = tmp_path / "out", tmp_path / "keep"
    proc = run_ctl("bench", "convergence", "--short", "--out", str(out), "--keep", str(keep),
                   timeout=280)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "mean |loss - static|" in proc.stdout
    doc = json.loads((out / "convergence.json").read_text())
    assert {"bench", "short", "nodes", "modes", "seed", "models"} <= set(doc)
    model = doc["models"]["cnn"]
    assert {"plan", "runs"} <= set(model)
    assert set(model["runs"]) == {f"{name}/consistent" for name in RUNS}
    for key, res in model["runs"].items():
        assert {"final", "change", "epochs", "evals", "steps", "delta", "problems",
                "stale_shard_steps", "wall_s"} <= set(res), key
        assert res["problems"] == [], (key, res["problems"])
        evals = res["evals"]
        assert evals[0]["epoch"] == 0 and evals[-1]["epoch"] == model["plan"]["epochs"]
        assert evals[-1]["val_loss"] < evals[0]["val_loss"], key
        first, last = res["epochs"][0]["train_loss"], res["epochs"][-1]["train_loss"]
        assert last < first, key
        start, end = RUNS[res["name"]]
        assert (res["change"] is None) == (start == end)
        assert (res["delta"] is None) == (start == end)
        if res["delta"] is not None:
            assert res["delta"]["baseline"] == f"static-{start}/consistent"
            assert res["delta"]["train_loss"] >= 0
        name = res["name"].replace(">", "")
        check_records(keep / f"cnn-{name}-consistent", start, end)
    assert (out / "convergence-cnn.png").exists() or "plots skipped" in proc.stdout


@pytest.mark.timeout(300)  # two short runs
def test_short_convergence_in_a_compressed_wire_format(tmp_path: Path) -> None:
    """The static runs on the int8 wire: they train and keep every member identical. Their
    fp32 twins are the runs above, so they are not run again here (the comparison with a
    twin is checked on made-up curves, tests/bench/test_convergence_bands.py)."""
    out, keep = tmp_path / "out", tmp_path / "keep"
    proc = run_ctl("bench", "convergence", "--short", "--static-only", "--wire", "int8",
                   "--out", str(out), "--keep", str(keep), timeout=280)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    doc = json.loads((out / "convergence.json").read_text())
    assert doc["wires"] == ["int8"]
    runs = doc["models"]["cnn"]["runs"]
    assert set(runs) == {"static-2/consistent/int8", "static-3/consistent/int8"}
    for key, res in runs.items():
        assert res["problems"] == [], (key, res["problems"])
        assert res["wire"] == "int8" and res["vs_fp32"] is None, key  # no twin in this run
        assert res["evals"][-1]["val_loss"] < res["evals"][0]["val_loss"], key
        n = res["start"]
        check_records(keep / f"cnn-static-{n}-consistent-int8", n, n)
