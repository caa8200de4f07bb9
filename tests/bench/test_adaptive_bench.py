"""``chaosctl bench adaptive``: bad values are one line (exit 2) before anything starts, every
policy's chaosd.toml is one chaosd accepts, and the report's arithmetic (time to target,
step rate per phase, each switch's predicted against measured step time, the goals) on a
fixed set of runs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from chaos_bench.adaptive import report
from chaos_bench.adaptive import run as bench
from daemon.contracts.config import load_config
from tests.cli.conftest import assert_one_line_error, run_ctl

pytestmark = pytest.mark.timeout(120)


def test_help() -> None:
    proc = run_ctl("bench", "adaptive", "--help")
    assert proc.returncode == 0, proc.stderr
    assert "Usage: chaosctl bench adaptive" in proc.stdout


@pytest.mark.parametrize(("args", "needle"), [
    (["--phases", "fast"], "is not RATE[/EDGE_RATE][+SLOW_MS]xSECONDS"),
    (["--phases", "1000x3"], "a phase lasts 5 to 3600 s"),
    (["--phases", "0x30"], "a rate must be 0.1 to 10000"),
    (["--phases", " , "], "no phase given"),
    (["--policies", "every-step,ddp"], "ddp is not one of"),
    (["--seeds", "a"], "--seeds must be comma-separated integers"),
    (["--fragments", "3"], "--fragments (3) must divide --inner-steps (20)"),
    (["--nodes", "1"], "--nodes"),
])
def test_bad_values_are_one_line(args: list[str], needle: str) -> None:
    line = assert_one_line_error(run_ctl("bench", "adaptive", *args), 2)
    assert needle in line, line


def test_the_phases_spec() -> None:
    assert bench.parse_phases("1000x30, 200/5x20,1000+150x12.5") == (
        bench.Phase(30, 1000), bench.Phase(20, 200, 5.0), bench.Phase(12.5, 1000, None, 150))
    assert bench.parse_phases("20/5+40x10")[0].label() == \
        "20 Mbit/s, last node 5, last node +40 ms/step"


@pytest.mark.parametrize("policy", bench.POLICIES)
def test_every_policy_is_a_config_chaosd_takes(policy: str, tmp_path: Path) -> None:
    path = tmp_path / "chaosd.toml"
    path.write_text(f'secret = "{"ab" * 32}"\n' + bench.config_of(policy, bench.Options()))
    cfg = load_config(path)
    assert cfg.adaptive.enabled == (policy == "adaptive")
    assert cfg.probe.bandwidth_period_s == 5.0  # probes run alike in every run
    expect = {"every-step": ("every-step", "fp32"), "every-step int8": ("every-step", "int8"),
              "diloco": ("diloco", "int8"), "streaming": ("streaming", "int8"),
              "adaptive": ("every-step", "fp32")}[policy]
    assert (cfg.training.sync, cfg.training.wire) == expect
    if policy == "streaming":
        assert (cfg.training.inner_steps, cfg.training.fragments) == (20, 5)


PHASES = [{"seconds": 10.0, "mbit": 1000.0, "edge_mbit": None, "slow_ms": 0.0,
           "t0": 0.0, "t1": 10.0},
          {"seconds": 10.0, "mbit": 20.0, "edge_mbit": None, "slow_ms": 0.0,
           "t0": 10.0, "t1": 20.0}]


def _run(policy: str, seed: int, rates: tuple[float, float], losses: list[float],
         events: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """A run of 20 s at ``rates`` steps a second in the two phases; a snapshot every 5 s."""
    steps, t, s = [], 0.0, 100
    for rate, end in zip(rates, (10.0, 20.0), strict=True):
        while t + 1 / rate <= end + 1e-9:
            t += 1 / rate
            s += 1
            steps.append([s, round(t, 6)])
    evals = [{"step": 0, "t": 5.0 * i, "final": i == len(losses) - 1, "val_loss": v,
              "val_acc": 0.5} for i, v in enumerate(losses)]
    node = {"steps": steps, "modes": [[101, "every-step"]]}
    return {"policy": policy, "seed": seed, "start": 100, "phases": PHASES, "evals": evals,
            "events": events or [], "nodes": {"n1": node, "n2": node}}


def test_report_time_to_target_rates_switches_and_goals() -> None:
    # The adaptive run switches at step 200 (t = 10 s at 10 steps/s), to a policy the model
    # says takes 40 ms a step; it runs at 20 steps a second: measured 50 ms, 20 % under.
    switch = {"kind": "policy-changed", "seq": 7, "t": 9.5, "policy": "diloco H=20/int8",
              "previous": "every-step/fp32", "effective_step": 200, "sync": "diloco",
              "inner_steps": 20, "fragments": 1, "predicted_step_ms": 40.0,
              "previous_chosen_ms": None, "previous_measured_ms": 100.0, "gain": 0.5, "reason": "r"}
    late = {**switch, "seq": 9, "effective_step": 395, "predicted_step_ms": 10.0}  # 5 steps
    runs = []
    for seed in (0, 1):
        runs += [_run("adaptive", seed, (10, 20), [3.0, 2.5, 2.1, 2.0, 1.9],
                      [switch, late] if seed == 0 else [switch]),
                 _run("every-step", seed, (10, 2), [3.0, 2.4, 2.3, 2.25, 2.25]),
                 _run("diloco", seed, (8, 20), [3.0, 2.6, 2.3, 2.15, 2.05])]
    doc = report.analyse(runs, 2.2)
    rows = {(r["policy"], r["seed"]): r for r in doc["rows"]}
    ad = rows[("adaptive", 0)]
    assert ad["to_target_s"] == 10.0 and ad["final_val_loss"] == 1.9
    assert rows[("every-step", 0)]["to_target_s"] is None
    assert rows[("diloco", 1)]["to_target_s"] == 15.0
    assert ad["phase_steps_per_s"] == pytest.approx([1.0 * 10, 20.0], rel=0.06)
    first, second = ad["switches"]
    assert first["measured_step_ms"] == pytest.approx(50.0, rel=0.01)
    assert first["error"] == pytest.approx(-0.2, abs=0.01)
    assert second["error"] is None  # 5 steps to the end: too short a window to check
    assert doc["prediction"]["checked"] == 2 and doc["prediction"]["switches"] == 3
    assert doc["prediction"]["median_abs_error"] == pytest.approx(0.2, abs=0.01)
    assert doc["prediction"]["met"]
    summary = {s["policy"]: s for s in doc["summary"]}
    assert summary["every-step"]["reached"] == 0 and summary["adaptive"]["reached"] == 2
    goals = doc["goals"]
    assert goals["first_to_target"] == "adaptive" and goals["adaptive_first"]
    assert [p["best_fixed"] for p in goals["phases"]] == ["every-step", "diloco"]
    assert goals["every_phase_within_10pct"]
    text = report.table(doc)
    assert "| adaptive | 2/2 | 10.0 (10.0..10.0) | 1.900 (1.900..1.900) |" in text
    assert "every-step/fp32 -> diloco H=20/int8, predicted 40.0 ms; measured 50.0 ms (-20 %)" \
        in text
    assert "first to the target: adaptive (met)" in text
    # Against the fixed policy first to the target in every seed (diloco, 15 s): 0.67x.
    assert goals["to_target"]["best_fixed"] == "diloco"
    assert goals["to_target"]["ratio"] == pytest.approx(10.0 / 15.0) and goals["to_target"]["met"]
    assert goals["final_val_loss"] == {"lowest_fixed": "diloco", "adaptive": 1.9, "lowest": 2.05}
    assert "time to the target: adaptive at 0.67x that of diloco, the best fixed policy " \
        "(met: within 10 %)" in text
    assert "final validation loss: adaptive 1.900, the lowest fixed 2.050 (diloco)" in text


def test_a_switch_out_of_diloco_is_measured_from_the_round_it_lands_on() -> None:
    """Into DiLoCo H=20 at step 120, out to every-step effective at 205: the members finish
    the round in flight, so every-step takes over at 220, and its step time is measured from
    there (bench seed 7 measured the rest of a DiLoCo round as every-step: +654 %)."""
    into = {"kind": "policy-changed", "seq": 3, "t": 1.0, "policy": "diloco H=20/int8",
            "previous": "every-step/fp32", "effective_step": 120, "sync": "diloco",
            "inner_steps": 20, "fragments": 1, "predicted_step_ms": 100.0, "reason": "r"}
    out = {**into, "seq": 5, "t": 10.0, "policy": "every-step/int8", "effective_step": 205,
           "previous": "diloco H=20/int8",
           "sync": "every-step", "inner_steps": 1, "predicted_step_ms": 50.0}
    doc = report.analyse([_run("adaptive", 0, (10, 20), [3.0, 2.0], [into, out])], 2.2)
    first, second = doc["rows"][0]["switches"]
    assert (first["takes_over_at"], second["takes_over_at"]) == (120, 220)
    assert second["effective_step"] == 205 and second["window_steps"] == 180
    assert second["measured_step_ms"] == pytest.approx(50.0, rel=0.01)
    assert first["window_steps"] == 80  # to the end of its phase, step 200
    assert first["measured_step_ms"] == pytest.approx(100.0, rel=0.01)
    assert "step 205 (lands at 220): diloco H=20/int8 -> every-step/int8" in report.table(doc)


def test_report_says_where_the_controller_loses() -> None:
    runs = [_run("adaptive", 0, (5, 5), [3.0, 2.5, 2.4, 2.3, 2.3]),
            _run("every-step", 0, (10, 10), [3.0, 2.4, 2.1, 2.0, 1.9])]
    doc = report.analyse(runs, 2.2)
    assert doc["goals"]["first_to_target"] == "every-step"
    assert not doc["goals"]["adaptive_first"] and not doc["goals"]["every_phase_within_10pct"]
    assert not doc["prediction"]["met"]  # nothing to check is not a pass
    assert "first to the target: every-step (NOT met)" in report.table(doc)
    assert not doc["goals"]["to_target"]["met"]  # it never reached 2.2: within nothing
    assert "time to the target: adaptive at - that of every-step" in report.table(doc)
    # Reaching it 20 % later than the best fixed policy, in every seed: not within 10 %.
    late = [_run("adaptive", 0, (5, 5), [3.0, 2.4, 2.3, 2.15]),
            _run("every-step", 0, (10, 10), [3.0, 2.4, 2.3, 2.15])]
    late[0]["evals"][-1]["t"] = 18.0
    tt = report.analyse(late, 2.2)["goals"]["to_target"]
    assert tt["ratio"] == pytest.approx(1.2) and not tt["met"]
    nobody = report.analyse(runs, 1.0)["goals"]
    assert nobody["first_to_target"] is None and not nobody["adaptive_first"]
    assert "first to the target: none reached it (NOT met)" in report.table(
        report.analyse(runs, 1.0))


def test_the_time_to_every_loss_level_and_a_report_again_from_the_raw_runs(
        tmp_path: Path) -> None:
    runs = [_run("adaptive", 0, (10, 20), [3.0, 2.5, 2.1, 2.0, 1.9]),
            _run("diloco", 0, (8, 20), [3.0, 2.6, 2.3, 2.15, 2.05])]
    doc = report.analyse(runs, 2.2)
    levels = {s["policy"]: s["to_levels_s"] for s in doc["summary"]}
    assert list(levels["adaptive"]) == ["3.0", "2.9", "2.8", "2.7", "2.6", "2.5", "2.4", "2.3",
                                        "2.2", "2.1", "2.0", "1.9"]  # down to the best reached
    assert levels["adaptive"]["2.0"]["mean"] == 15.0 and levels["diloco"]["2.0"] is None
    report.write(doc, tmp_path / "first", lambda _line: None)
    proc = run_ctl("bench", "adaptive", "--from", str(tmp_path / "first" / "adaptive.json"),
                   "--target-loss", "2.0", "--out", str(tmp_path / "again"))
    assert proc.returncode == 0, proc.stderr
    assert "seeds reaching 2 " in proc.stdout and "| adaptive | 1/1 | 15.0 |" in proc.stdout
    again = (tmp_path / "again" / "adaptive.md").read_text()
    assert "| diloco | 0/1 | - |" in again
    (tmp_path / "bad.json").write_text("{}")
    line = assert_one_line_error(run_ctl("bench", "adaptive", "--from",
                                         str(tmp_path / "bad.json")), 2)
    assert "not an adaptive.json with its runs" in line


def test_a_straggler_set_aside_counts_the_samples_not_the_steps() -> None:
    """The adaptive run sets n3 aside at t = 10 s and steps twice as fast with two members:
    as many samples a second as the fixed policy's three, so the phase goal is met on samples,
    though its step rate is 1.5x the fixed one's; the events are listed."""
    events = [{"kind": "scale-in", "seq": 3, "t": 9.8, "node": "n3", "reason": "straggler",
               "effective_step": 200},
              {"kind": "straggler", "seq": 4, "t": 9.8, "action": "set-aside", "node": "n3",
               "cause": "compute", "predicted_gain": 0.4, "predicted_step_ms_without": 60.0},
              {"kind": "straggler", "seq": 5, "t": 25.0, "action": "measured", "node": "n3",
               "cause": "compute", "predicted_gain": 0.4, "measured_gain": 0.33}]
    ad = _run("adaptive", 0, (10, 15), [3.0, 2.0], events)
    n1 = ad["nodes"]["n1"]
    ad["nodes"]["n3"] = {"steps": [[s, t] for s, t in n1["steps"] if t < 10.0],
                         "modes": n1["modes"]}
    fixed = _run("every-step", 0, (10, 10), [3.0, 2.5])
    fixed["nodes"]["n3"] = fixed["nodes"]["n1"]
    doc = report.analyse([ad, fixed], 2.2)
    rows = {r["policy"]: r for r in doc["rows"]}
    assert rows["adaptive"]["phase_steps_per_s"] == pytest.approx([10, 15], rel=0.07)
    assert rows["adaptive"]["phase_samples_per_s"] == pytest.approx([30, 30], rel=0.07)
    assert rows["every-step"]["phase_samples_per_s"] == pytest.approx([30, 30], rel=0.07)
    assert [s["action"] for s in rows["adaptive"]["stragglers"]] == ["set-aside", "measured"]
    assert doc["goals"]["every_phase_within_10pct"]
    text = report.table(doc)
    # Its model check: 60 ms a step predicted without n3, 66.7 measured from step 200 on.
    aside = rows["adaptive"]["stragglers"][0]
    assert aside["measured_step_ms"] == pytest.approx(66.7, rel=0.01)
    assert aside["error"] == pytest.approx(-0.1, abs=0.01)
    assert doc["prediction"]["stragglers"]["checked"] == 1
    assert ("- seed 0, t=9.8 s: n3 set aside for its compute, +40% samples/s predicted; "
            "60.0 ms a step predicted without, measured 66.7 ms (-10 %)") in text
    assert "stragglers: 1 set aside, 1 checked" in text
    assert "- seed 0, t=25.0 s: n3 measured +33%, +40% samples/s predicted" in text
    assert "samples a second in each phase" in text


def test_a_switch_is_measured_only_until_the_members_change() -> None:
    """A prediction is for the members of its moment. In stop 60's runs a switch landed 6
    and 9 steps before a straggler was set aside, and its window ran on without it: "measured"
    3-4x faster than predicted. A scale-in or scale-out ends the window."""
    switch = {"kind": "policy-changed", "seq": 3, "t": 1.0, "policy": "every-step/int8",
              "previous": "every-step/fp32", "effective_step": 120, "sync": "every-step",
              "inner_steps": 1, "fragments": 1, "predicted_step_ms": 100.0, "reason": "r"}
    alone = report.analyse([_run("adaptive", 0, (10, 20), [3.0, 2.0], [switch])], 2.2)
    assert alone["rows"][0]["switches"][0]["error"] == pytest.approx(0.0, abs=0.01)
    for at, checked in ((126, False), (160, True)):
        aside = {"kind": "scale-in", "seq": 4, "t": 2.0, "node": "n3", "reason": "straggler",
                 "effective_step": at}
        row = report.analyse([_run("adaptive", 0, (10, 20), [3.0, 2.0], [switch, aside])],
                             2.2)["rows"][0]["switches"][0]
        assert row["window_steps"] == at - 120
        assert (row["error"] is not None) == checked


def test_a_switch_the_members_changed_before_is_not_measured() -> None:
    """Stop 61, seed 15: n3 was set aside 2 s after a switch was decided, effective 45 steps
    before the switch landed; the two members left were "measured" 439 % faster than the
    three the prediction was for. A change decided after the switch and landing first
    leaves nothing to check; one decided before it was in the prediction's input."""
    switch = {"kind": "policy-changed", "seq": 3, "t": 5.0, "policy": "every-step/int8",
              "previous": "every-step/fp32", "effective_step": 120, "sync": "every-step",
              "inner_steps": 1, "fragments": 1, "predicted_step_ms": 100.0, "reason": "r"}
    for decided, checked in ((6.0, False), (4.0, True)):
        aside = {"kind": "scale-in", "seq": 4, "t": decided, "node": "n3",
                 "reason": "straggler", "effective_step": 110}
        doc = report.analyse([_run("adaptive", 0, (10, 20), [3.0, 2.0], [switch, aside])], 2.2)
        row = doc["rows"][0]["switches"][0]
        assert row["members_changed_first"] is not checked
        assert (row["error"] is not None) == checked
        assert ("members changed before it landed" in report.table(doc)) is not checked
