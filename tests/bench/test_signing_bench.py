"""``chaosctl bench signing``: a quick run writes its tables and JSON, the signed round trip
holds for every message measured, and bad values are one line (exit 2)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from chaos_bench.signing import run as signing
from tests.cli.conftest import assert_one_line_error, run_ctl

pytestmark = pytest.mark.timeout(180)


def test_quick_run_writes_bytes_and_cpu_for_every_message(tmp_path: Path) -> None:
    proc = run_ctl("bench", "signing", "--quick", "--nodes", "3,12", "--out", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    doc = json.loads((tmp_path / "signing.json").read_text())
    names = [r["message"] for r in doc["rows"]]
    assert names == ["heartbeat", "leader claim", "replicate command",
                     "cluster state, 3 nodes", "cluster state, 12 nodes"]
    envelope = {r["bytes_signed"] - r["bytes_plain"] for r in doc["rows"]}
    assert len(envelope) == 1 and envelope.pop() > 64  # a timestamp and a MAC, whatever the body
    for r in doc["rows"]:
        assert all(r[k] > 0 for k in ("send_us_plain", "send_us_signed", "recv_us_plain",
                                      "recv_us_signed")), r
    load = {h["nodes"]: h for h in doc["heartbeat_load"]}
    assert sorted(load) == [1, 3, 12]
    # The scheduler opens every follower's heartbeat: its share grows with the cluster.
    assert load[12]["scheduler_cpu_pct_signed"] > load[3]["scheduler_cpu_pct_signed"]
    assert (tmp_path / "signing.md").read_text().startswith("| message |")
    assert "heartbeat" in proc.stdout


def test_every_measured_message_survives_seal_and_open() -> None:
    auth = signing.ControlAuth(signing.auth_key(), window_s=1e9)
    for case in signing.cases([4]):
        row = signing.measure(case, auth, repeats=1)  # raises if the round trip changed it
        assert row["bytes_signed"] > row["bytes_plain"]


@pytest.mark.parametrize(("args", "needle"), [
    (["--nodes", "many"], "--nodes must be comma-separated integers"),
    (["--nodes", "1"], "--nodes: each value must be between 2 and 5000"),
])
def test_bad_values_are_one_line(args: list[str], needle: str) -> None:
    line = assert_one_line_error(run_ctl("bench", "signing", *args), 2)
    assert needle in line, line
