"""A box on a slow link, on a real testbed (issue 24): tc makes n3's links 5 Mbit/s while the
others' stay at 1 Gbit/s, the probes measure it, and the scheduler sets n3 aside for its link;
when its links are fast again, newer tests say so and it rejoins. Every scenario invariant
holds throughout (same step, same state; no step lost or repeated; the loss falls; one
scheduler)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.testbed.conftest import run_scenario
from tests.training._run import PINNED_POLICY

pytestmark = [pytest.mark.timeout(240), pytest.mark.netns, pytest.mark.xdist_group("bench")]
WORKER = Path(__file__).resolve().parents[1] / "training" / "_worker.py"

# n3's two links slow at 12 s, fast again at 32 s.
EVENTS = "".join(f'[[events]]\nat = {at}\naction = "shape"\na = "{a}"\nb = "n3"\nmbit = {mbit}\n'
                 for at, mbit in ((12, 5), (32, 1000)) for a in ("n1", "n2"))
# An MLP of 90k parameters (8 -> 8192 -> 2): 360 kB of fp32 a round, 3 ms at 1 Gbit/s and
# 0.6 s at 5 Mbit/s, against about 25 ms of compute a step (and a rest of 0.1 s: CPU the
# judge does not need; with 0.02 s this test took 70 CPU-s, its three workers busy).
SCENARIO = f'''
name = "ci-straggler-link"
duration_s = 50
[testbed]
nodes = 3
topology = "full"
bw = "1000"
seed = 1
config = """{PINNED_POLICY}"""
[training]
command = ["python", "{WORKER}", "--out", "{{out}}", "--steps", "1000000", "--sleep", "0.1",
           "--width", "8192"]
start = ["n1", "n2", "n3"]
{EVENTS}'''


def test_a_box_on_a_slow_link_is_set_aside_and_rejoins_when_its_links_recover(
        tmp_path: Path) -> None:
    report = run_scenario(tmp_path, SCENARIO)
    events = sorted(report["events"], key=lambda e: e["seq"])
    judged = [e for e in events if e["kind"] == "straggler"]
    asides = [e for e in judged if e["action"] == "set-aside"]
    assert asides, [e["kind"] for e in events]
    assert {(e["node"], e["cause"]) for e in asides} == {("n3", "link")}
    # The slow links' round (0.6 s at 5 Mbit/s) in the prediction: a difference, since a loaded
    # box stretches the compute in both (CI: 967 against 240 ms, 25 ms of compute unloaded).
    assert asides[0]["predicted_step_ms_with"] - asides[0]["predicted_step_ms_without"] > 300
    # Back as a member: let back when its links' tests recovered (within its 60 s before a
    # trial, so no other cause), or, had its daemon been failed on the slow link meanwhile,
    # by an ordinary join; either way through a scale-out.
    back = [e for e in judged if e["action"] == "rejoin" and e["seq"] > asides[0]["seq"]]
    assert all(e["cause"] == "links-recovered" for e in back), judged
    assert [e for e in events if e["kind"] == "scale-out" and e["node"] == "n3"
            and e["seq"] > asides[0]["seq"]], [(e["kind"], e.get("node")) for e in events]
