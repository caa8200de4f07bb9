"""Scripted chaos: scenario files are validated with one clear line, and invariants hold."""

from __future__ import annotations

from pathlib import Path

import pytest

from chaosctl.testbed.scenario import ScenarioError, check, load

pytestmark = pytest.mark.timeout(30)
GOOD = '''
name = "t"
duration_s = 10
[testbed]
nodes = 3
[training]
command = ["python", "w.py", "--out", "{out}"]
start = ["n1", "n2"]
[[events]]
at = 2
action = "cut"
a = "n1"
b = "n2"
[[events]]
at = 1
action = "join"
node = "n3"
'''


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "s.toml"
    path.write_text(text)
    return path


def test_a_good_scenario_loads_in_time_order(tmp_path: Path) -> None:
    sc = load(write(tmp_path, GOOD))
    assert [e.action for e in sc.events] == ["join", "cut"]
    assert sc.start == ["n1", "n2"] and sc.duration_s == 10


@pytest.mark.parametrize(("change", "needle"), [
    (("nodes = 3", "nodes = 2"), "'events[1].node' 'n3' is not a node"),
    (('action = "cut"', 'action = "explode"'), "'events[0].action'"),
    (("at = 2", "at = 99"), "[0, duration_s]"),
    (('start = ["n1", "n2"]', 'start = ["n9"]'), "training.start"),
    (("duration_s = 10", ""), "missing 'duration_s'"),
    (('command = ["python", "w.py", "--out", "{out}"]', "command = 3"), "training.command"),
    (("nodes = 3", "nodes = 3\nconfig = 5"), "'testbed.config' must be a string"),
])
def test_bad_scenarios_name_the_key(tmp_path: Path, change: tuple[str, str],
                                    needle: str) -> None:
    with pytest.raises(ScenarioError) as err:
        load(write(tmp_path, GOOD.replace(*change)))
    assert needle in str(err.value) and "\n" not in str(err.value)


def rows(steps: range, digest: str = "d", loss0: float = 1.0) -> list[dict[str, object]]:
    return [{"step": s, "digest": f"{digest}{s}", "loss": loss0 / (1 + s)} for s in steps]


def test_invariants_pass_on_a_consistent_run() -> None:
    assert check({"n1": rows(range(1, 50)), "n2": rows(range(10, 50))}) == []


def test_invariants_catch_divergence_lost_and_repeated_steps() -> None:
    bad = rows(range(10, 50))
    bad[5] = {**bad[5], "digest": "other"}
    assert any("diverged" in f for f in check({"n1": rows(range(1, 50)), "n2": bad}))
    gap = rows(range(1, 20)) + rows(range(25, 50))
    assert any("committed by no node" in f for f in check({"n1": gap}))
    again = rows(range(1, 30)) + rows(range(29, 50))
    assert any("again" in f for f in check({"n1": again}))
    rising = [{"step": s, "digest": f"d{s}", "loss": float(s)} for s in range(1, 50)]
    assert any("did not fall" in f for f in check({"n1": rising}))


@pytest.mark.parametrize("path", sorted((Path(__file__).resolve().parents[2] / "scenarios")
                                        .glob("*.toml")), ids=lambda p: p.stem)
def test_the_shipped_scenarios_load(path: Path) -> None:
    sc = load(path)
    assert sc.events and sc.start
