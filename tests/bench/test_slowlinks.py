"""``chaosctl bench slowlinks``: bad values are one line (exit 2) before anything starts, and
the report's arithmetic and goal verdicts on a fixed set of runs."""

from __future__ import annotations

from pathlib import Path
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
    (["--rates", "0"], "--rates: each value must be between 0.1"),
    (["--seeds", "x"], "--seeds must be comma-separated integers"),
    (["--wires", "fp64"], "fp64 is not one of"),
    (["--wires", "int8,fp32"], "--wires must begin with fp32"),
    (["--chunks", "1001"], "multiple of 4"),
    (["--outer-lr", "0.5,abc"], "--outer-lr must be numbers"),
    (["--inner-steps", "1"], "--inner-steps"),
    (["--steps", "90", "--inner-steps", "20"], "multiple of every H"),
    (["--outer-momentum", "0.5,1.5"], "--outer-momentum: each value must be between"),
    (["--fragments", "3", "--inner-steps", "20,50"], "--fragments: no value divides"),
    (["--fragments", "1"], "--fragments"),
    (["--outer-wire", "fp64"], "fp64 is not one of"),
    (["--task", "mnist"], "--task: mnist is not one of digits, chartf"),
])
def test_bad_values_are_one_line(args: list[str], needle: str) -> None:
    line = assert_one_line_error(run_ctl("bench", "slowlinks", *args), 2)
    assert needle in line, line


def _run(rate: float, mode: str, h: int, wall: float, tx: int, acc: float, loss: float,
         seed: int = 0) -> dict[str, Any]:
    evals = [{"step": 0, "t": 0.0, "tx": 0, "loss": 2.3, "acc": 0.1},
             {"step": 300, "t": wall, "tx": tx, "loss": loss, "acc": acc,
              "val_loss": loss * 1.1, "val_acc": acc}]
    nodes = {n: {"node": n, "start": 100, "began": 100, "steps": 300, "inner_steps": h,
                 "wall_s": wall, "tx_bytes": tx, "evals": evals if n == "n1" else []}
             for n in ("n1", "n2", "n3")}
    return {"rate_mbps": rate, "mode": mode, "inner_steps": h, "seed": seed,
            "start": 100, "nodes": nodes}


def test_report_ratios_spread_and_goal() -> None:
    runs = []
    for seed, jitter in ((0, 0.0), (1, 2.0), (2, -2.0)):
        runs += [
            _run(50, "every-step", 1, 40.0 + jitter, 280_000_000, 0.964, 0.100, seed),
            _run(50, "every-step int8", 1, 20.0, 75_000_000, 0.964, 0.101, seed),
            # 20x fewer bytes, -0.6 pt, loss +1 %: met; faster than int8 every-step too
            _run(50, "diloco H=20", 20, 6.0, 14_000_000, 0.958, 0.101, seed),
            # accuracy within a point, loss 30 % worse: the loss verdict fails alone
            _run(50, "diloco H=50", 50, 3.0, 5_600_000, 0.960, 0.130, seed),
            _run(20, "diloco H=20", 20, 12.0, 14_000_000, 0.958, 0.5, seed)]  # no baseline
    doc = slowlinks_report.analyse(runs, 0.95)
    rows = {(r["rate_mbps"], r["mode"], r["seed"]): r for r in doc["rows"]}
    h20 = rows[(50, "diloco H=20", 1)]
    assert h20["bytes_x_fewer"] == pytest.approx(20.0)
    assert h20["time_x_faster"] == pytest.approx(42 / 6)
    assert h20["time_x_best"] == pytest.approx(20 / 6)  # against int8, the fastest
    assert h20["acc_pts_vs_every_step"] == pytest.approx(-0.6)
    assert h20["loss_pct_vs_every_step"] == pytest.approx(1.0)
    assert h20["to_target_s"] == 6.0
    assert "bytes_x_fewer" not in rows[(20, "diloco H=20", 0)]
    summary = {(s["rate_mbps"], s["mode"]): s for s in doc["summary"]}
    wall = summary[(50, "every-step")]["wall_s"]
    assert (wall["median"], wall["min"], wall["max"], wall["n"]) == (40.0, 38.0, 42.0, 3)
    assert summary[(50, "diloco H=20")]["seeds"] == [0, 1, 2]
    goal = {g["mode"]: g for g in doc["goal_at_50mbps"]}
    assert goal["diloco H=20"]["met"]
    assert goal["diloco H=50"]["accuracy"] and not goal["diloco H=50"]["loss"]
    assert not goal["diloco H=50"]["met"]
    text = slowlinks_report.table(doc)
    assert "goal at 50 Mbit/s, diloco H=50: NOT met (loss)" in text
    assert "40.0 (38.0..42.0)" in text


def test_the_streaming_goal_compares_bytes_loss_and_the_peak() -> None:
    """At 20 Mbit/s a streaming mode must send 100x fewer bytes than the fastest every-step
    run, end within 1 % of its validation loss, and carry less in one round than DiLoCo at
    the same H; each verdict is reported on its own."""
    def with_peak(run: dict[str, Any], peak: int) -> dict[str, Any]:
        for d in run["nodes"].values():
            d["rounds"] = {"n": 6, "bytes_max": peak, "bytes_median": peak, "s_max": 0.3,
                           "s_median": 0.2}
        return run

    runs = []
    for seed in (0, 1, 2):
        runs += [with_peak(_run(20, "every-step", 1, 100.0, 280_000_000, 0.97, 0.10, seed),
                           1_000_000),
                 with_peak(_run(20, "every-step int8", 1, 30.0, 70_000_000, 0.97, 0.10,
                                seed), 250_000),
                 with_peak(_run(20, "diloco H=50", 50, 5.0, 600_000, 0.97, 0.10, seed),
                           700_000),
                 with_peak(_run(20, "streaming H=50 P=5", 50, 5.0, 600_000, 0.97, 0.1005,
                                seed), 150_000),
                 with_peak(_run(20, "streaming H=50 P=2", 50, 5.0, 1_000_000, 0.97, 0.102,
                                seed), 400_000),
                with_peak(_run(20, "streaming H=50 P=5 overlap", 50, 4.0, 600_000, 0.97,
                               0.1005, seed), 150_000)]
    doc = slowlinks_report.analyse(runs, 0.95)
    verdicts = {g["mode"]: g for g in doc["streaming_goal_at_20mbps"]}
    assert set(verdicts) == {"streaming H=50 P=5", "streaming H=50 P=2",
                             "streaming H=50 P=5 overlap"}
    assert verdicts["streaming H=50 P=5"]["met"] and verdicts["streaming H=50 P=5 overlap"]["met"]
    p2 = verdicts["streaming H=50 P=2"]
    assert not p2["bytes_100x"] and not p2["val_loss_1pct"] and p2["peak_below_diloco"]
    row = next(r for r in doc["rows"] if r["mode"] == "streaming H=50 P=5")
    assert row["bytes_x_fewer_best"] == pytest.approx(70 / 0.6)  # against int8, the fastest
    assert row["round_mb_max"] == pytest.approx(0.15)
    text = slowlinks_report.table(doc)
    assert "streaming goal at 20 Mbit/s, streaming H=50 P=2: NOT met (bytes_100x, " \
        "val_loss_1pct)" in text


def test_modes_and_their_config(tmp_path: Path) -> None:
    opts = slowlinks.Options(wires=("fp32", "int8"), outer_lrs=(0.7,), outer_momenta=(0.5,))
    ms = slowlinks.modes(opts, chunk=32768, outer={50: (1.0, 0.0)})
    assert [m.name for m in ms] == ["every-step", "every-step int8", "diloco H=20",
                                    "diloco H=50"]
    assert [m.chunk for m in ms] == [32768, 32768, 0, 0]
    fp32, int8, h20, h50 = (slowlinks.config_of(m) for m in ms)
    assert "wire" not in fp32 and "sync" not in fp32 and 'wire = "int8"' in int8
    assert 'sync = "diloco"' in h20 and "inner_steps = 20" in h20
    assert "outer_momentum = 0.5" in h20  # no tuned value for H=20: the first of the grid
    assert "outer_lr = 1.0" in h50 and "outer_momentum = 0.0" in h50
    assert all("bandwidth_period_s" in t for t in (fp32, int8, h20, h50))
    # Streaming runs at every H its fragment count divides, on DiLoCo's tuned outer step,
    # and the pseudo-gradients of both take --outer-wire.
    opts = slowlinks.Options(fragments=(4, 5), outer_wire="int8", overlap=True)
    ms = slowlinks.modes(opts, outer={50: (1.0, 0.0)})
    assert [m.name for m in ms][1:] == [
        "diloco H=20 int8", "streaming H=20 P=4 int8", "streaming H=20 P=4 int8 overlap",
        "streaming H=20 P=5 int8", "streaming H=20 P=5 int8 overlap",
        "diloco H=50 int8", "streaming H=50 P=5 int8", "streaming H=50 P=5 int8 overlap"]
    text = slowlinks.config_of(ms[-1])
    for line in ('sync = "streaming"', "inner_steps = 50", "fragments = 5", 'wire = "int8"',
                 "outer_lr = 1.0", "overlap = true"):
        assert line in text
    from daemon.contracts.config import load_config

    for m in ms:  # every mode's chaosd.toml loads
        path = tmp_path / "c.toml"
        path.write_text('insecure = true\n' + slowlinks.config_of(m))
        assert load_config(path).training.sync_mode().fragments == m.fragments


def test_tuning_runs_the_packages_outer_step_and_picks_the_least_validation_loss() -> None:
    from chaos_bench.slowlinks import tune
    from chaos_bench.slowlinks.task import Digits

    data = Digits.load()
    assert not set(data.val.tolist()) & set(data.test.tolist())
    assert not set(data.train.tolist()) & (set(data.val.tolist()) | set(data.test.tolist()))
    kw = {"steps": 8, "nodes": 2, "batch": 8, "lr": 1e-3, "data": data}
    a = tune.simulate(4, 0.7, 0.5, 100, **kw)
    assert a == tune.simulate(4, 0.7, 0.5, 100, **kw)  # deterministic: a sweep can compare
    assert a != tune.simulate(4, 0.0, 0.5, 100, **kw)  # outer lr 0: the synced model stays
    pts = [tune.Point(20, 0.7, 0.9, [0.5, 0.7], [0.9, 0.9]),
           tune.Point(20, 0.5, 0.5, [0.2, 0.3], [0.95, 0.96]),
           tune.Point(20, 1.0, 0.0, [0.1, 0.9], [0.97, 0.9])]
    assert tune.choose(pts).outer_lr == 0.5


def test_the_char_transformer_task_splits_its_held_out_text_and_tunes_alike() -> None:
    """The chartf task: validation and test are the two halves of the text the example holds
    out, never trained on; the tuning's in-process DiLoCo runs on it, deterministically."""
    import torch

    from chaos_bench.slowlinks import tune
    from chaos_bench.slowlinks.task import CharText, batch_generator, load

    data = load("chartf")
    assert isinstance(data, CharText)
    held = data.data.val
    assert torch.equal(torch.cat([data.val, data.test]), held)
    assert len(data.val) > 10 * data.data.context and len(data.test) > 10 * data.data.context
    x, y = data.batch(batch_generator(0, 1), 4)
    assert x.shape == y.shape == (4, data.data.context)
    assert torch.equal(x[:, 1:], y[:, :-1])  # the targets are the next characters
    m = data.model(3)
    val, test = data.evaluate(m, "val"), data.evaluate(m, "test")
    assert val != test and all(0 < v[0] < 10 and 0 <= v[1] <= 1 for v in (val, test))
    assert m.training  # evaluation leaves the model training (dropout on)
    kw = {"steps": 4, "nodes": 2, "batch": 4, "lr": 1e-3, "data": data}
    a = tune.simulate(2, 0.7, 0.5, 100, **kw)
    assert a == tune.simulate(2, 0.7, 0.5, 100, **kw)
    assert a != tune.simulate(2, 0.0, 0.5, 100, **kw)
