"""A scenario end to end on a real testbed: training under tc, a link cut and healed, a node
killed, and every invariant checked (same step, same state; no step lost or repeated; the
loss falls; one scheduler)."""

from __future__ import annotations

from pathlib import Path

import pytest

from chaosctl.testbed.scenario import Runner, load
from tests.testbed.conftest import need_root, run_id

pytestmark = [pytest.mark.timeout(180), pytest.mark.netns, pytest.mark.xdist_group("bench")]
WORKER = Path(__file__).resolve().parents[1] / "training" / "_worker.py"
SCENARIO = f'''
name = "ci-cut-heal-kill"
duration_s = 24
[testbed]
nodes = 4
topology = "ring"
bw = "100-400"
seed = 3
[training]
command = ["python", "{WORKER}", "--out", "{{out}}", "--steps", "1000000", "--sleep", "0.02"]
start = ["n1", "n2", "n3", "n4"]
[[events]]
at = 3
action = "cut"
a = "n1"
b = "n2"
[[events]]
at = 10
action = "heal"
a = "n1"
b = "n2"
[[events]]
at = 16
action = "kill9"
node = "n4"
'''


def test_cut_heal_kill_scenario_keeps_every_invariant(tmp_path: Path) -> None:
    need_root()
    path = tmp_path / "s.toml"
    path.write_text(SCENARIO)
    report = Runner(load(path), tmp_path / "run", lambda _line: None, run_id=run_id()).run()
    assert report["failures"] == [], report["failures"]
    assert all(entry["ok"] for entry in report["timeline"]), report["timeline"]
    kinds = [e["kind"] for e in report["events"]]
    assert "link-failed" in kinds and "disconnect-link" in kinds  # the cut was noticed
    assert "connect-link" in kinds  # and the healed link came back (probe recovery)
    assert any(e["kind"] == "node-failed" and e["node"] == "n4" for e in report["events"])
    survivors = [n for n in ("n1", "n2", "n3") if report["steps"][n]]
    assert len(survivors) == 3
    last = {n: report["steps"][n][1] for n in survivors}
    assert min(last.values()) > report["steps"]["n4"][1] + 20  # they kept going after it
