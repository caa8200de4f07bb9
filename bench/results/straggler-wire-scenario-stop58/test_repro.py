"""test_scenario_run.py's scenario with the straggler judge on; copy into tests/testbed to run.
It writes the membership and straggler events to /tmp/repro/events.json."""

import json
from pathlib import Path

import pytest

from chaosctl.testbed.scenario import Runner, load
from tests.testbed.conftest import need_root, run_id
from tests.testbed.test_scenario_run import SCENARIO

pytestmark = [pytest.mark.timeout(300)]
KINDS = ("straggler", "scale-in", "policy-changed", "scale-out", "link-failed", "node-failed",
         "connect-link", "disconnect-link")


def test_repro(tmp_path: Path) -> None:
    need_root()
    text = SCENARIO.replace("stragglers = false\n", "")
    assert "stragglers" not in text
    path = tmp_path / "s.toml"
    path.write_text(text)
    report = Runner(load(path), tmp_path / "run", lambda _line: None, run_id=run_id()).run()
    out = [e for e in sorted(report["events"], key=lambda e: e["seq"]) if e["kind"] in KINDS]
    Path("/tmp/repro/events.json").write_text(json.dumps(
        {"events": out, "steps": report["steps"], "failures": report["failures"]}, indent=1))
