"""A scenario end to end on a real testbed: 4 chaosd train under tc while a link is cut and
healed, a node joins and one is killed, and the links go from 5 Mbit/s to 10 Gbit/s. Every
invariant is checked (same step, same state; no step lost or repeated; the loss falls; one
scheduler), and the policy controller (issue 24) switches the wire twice on what the probes
measure: to int8 on the slow links, back to fp32 on the fast ones, the join, the cut and the
kill in between."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.testbed.conftest import run_scenario

pytestmark = [pytest.mark.timeout(240), pytest.mark.netns, pytest.mark.xdist_group("bench")]
WORKER = Path(__file__).resolve().parents[1] / "training" / "_worker.py"
PAIRS = [("n1", "n2"), ("n1", "n3"), ("n1", "n4"), ("n2", "n3"), ("n2", "n4"), ("n3", "n4")]


def shape_all(at: float, mbit: float) -> str:
    return "".join(f'[[events]]\nat = {at}\naction = "shape"\na = "{a}"\nb = "{b}"\n'
                   f"mbit = {mbit}\n" for a, b in PAIRS)


# The tiny MLP's gradient is 712 bytes: at 5 Mbit/s int8 saves about 2 % of a step; on the
# fast links fp32 is ahead by int8's quality prior (1 %): a hysteresis of 0.5 % sees both.
# The sync mode stays every-step: on 5 Mbit/s the controller would otherwise pick DiLoCo,
# and this scenario is about the wire (test_diloco_e2e switches the mode). No straggler is
# set aside either (test_straggler_link tests that): in CI the judge set n3 aside for its
# link on links all shaped alike (57 ms a step predicted with it, 25 without), which moved
# the rest of this scenario's events.
SCENARIO = f'''
name = "ci-cut-heal-join-kill-adapt"
duration_s = 36
[testbed]
nodes = 4
topology = "full"
bw = "5"
seed = 1
config = """
[probe]
bandwidth_period_s = 2.0
[adaptive]
enabled = true
syncs = ["every-step"]
hysteresis = 0.005
dwell = 2
min_interval_s = 0.0
stragglers = false
"""
[training]
command = ["python", "{WORKER}", "--out", "{{out}}", "--steps", "1000000", "--sleep", "0.02"]
start = ["n1", "n2", "n3"]
[[events]]
at = 3
action = "cut"
a = "n1"
b = "n2"
[[events]]
at = 10
action = "join"
node = "n4"
[[events]]
at = 12
action = "heal"
a = "n1"
b = "n2"
[[events]]
at = 15
action = "kill9"
node = "n3"
{shape_all(19, 10000)}
'''


def test_cut_heal_join_kill_and_two_wire_switches_keep_every_invariant(tmp_path: Path) -> None:
    report = run_scenario(tmp_path, SCENARIO)
    events = report["events"]
    kinds = [e["kind"] for e in events]
    assert "link-failed" in kinds and "disconnect-link" in kinds  # the cut was noticed
    assert "connect-link" in kinds  # and the healed link came back (probe recovery)
    joined = [e for e in events if e["kind"] == "scale-out" and e["node"] == "n4"]
    failed = [e for e in events if e["kind"] == "node-failed" and e["node"] == "n3"]
    assert joined and failed
    survivors = ("n1", "n2", "n4")
    assert all(report["steps"][n] for n in survivors)
    assert min(report["steps"][n][1] for n in survivors) > report["steps"]["n3"][1] + 20
    changed = [e for e in events if e["kind"] == "policy-changed"]
    assert [e["policy"] for e in changed][:1] == ["every-step/int8"], changed
    assert changed[-1]["policy"] == "every-step/fp32", changed
    # The join and the kill fell between the two switches, and each switch says what was
    # predicted for the policy it leaves when that one was chosen.
    assert changed[0]["seq"] < joined[-1]["seq"] and failed[-1]["seq"] < changed[-1]["seq"]
    assert changed[-1]["previous_chosen_ms"] == changed[-2]["predicted_step_ms"]
