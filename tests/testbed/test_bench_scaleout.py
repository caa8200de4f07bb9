"""``chaosctl bench scaleout`` end to end on a real testbed, in its smallest configuration.

One size (3 -> 4), a 4 MiB synthetic state, one repeat: every strategy and the plain-sockets
baseline run inside the namespaces, the JSON has them all with positive delays and verified
bytes beside the three bounds (links measured all at once, one at a time, configured), and
nothing is left behind (namespaces, processes, the temp work directory).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from chaos_bench.scaleout import report as scaleout_report
from chaos_bench.scaleout import run as bench_scaleout
from netprobe import netns
from tests.testbed.conftest import leftovers, need_root, run_id

pytestmark = [pytest.mark.netns, pytest.mark.timeout(120), pytest.mark.xdist_group("bench")]
RUNS = set(scaleout_report.RUNS)


def test_smallest_scaleout_bench(tmp_path: Path) -> None:
    need_root()
    rid = run_id()
    out, work = tmp_path / "out", tmp_path / "work"
    work.mkdir()
    lines: list[str] = []
    doc = bench_scaleout.run([3], ["synth-4"], 1, (200.0, 400.0), out, lines.append,
                             degree=2, iperf_s=1.0, workdir=work, run_id=rid)

    saved = json.loads((out / "scaleout.json").read_text())
    assert saved["rows"] == json.loads(json.dumps(doc["rows"]))
    assert (out / "scaleout.md").read_text().count("| 3->4 | synth-4 |") == 1
    (row,) = saved["rows"]
    assert set(row["delay_s"]) == RUNS
    assert all(d > 0 for d in row["delay_s"].values())
    assert row["verified"] and row["lb_measured_s"] > 0 and row["lb_achievable_s"] > 0
    assert row["chaos_over_lb_measured"] > 0 and row["chaos_over_lb_achievable"] > 0
    assert row["chaos_over_plain"] > 0
    (inst,) = saved["instances"]
    res = inst["models"]["synth-4"]
    assert set(res) == RUNS
    assert all(r["verified"] for r in res.values())
    # chaos pulled from the new node's neighbours only, and every byte verified on arrival.
    chaos_bytes = {s: v[2] for s, v in res["chaos"]["sources"].items() if v[2]}
    assert set(chaos_bytes) <= set(inst["neighbours"])
    assert sum(chaos_bytes.values()) >= 4 << 20
    assert res["chaos"]["refetched_blocks"] == 0
    assert set(inst["measured_mbps"]) == set(inst["neighbours"])
    assert set(inst["concurrent_mbps"]) == set(inst["neighbours"])
    assert all(v > 0 for v in inst["concurrent_mbps"].values())
    # The plain baseline pulled each neighbour's water-filling share once.
    assert sum(v[2] for v in res["plain"]["sources"].values()) == 4 << 20
    assert any("iperf3" in line for line in lines)

    # Nothing left: no namespace of this run, no process from the work dir, no temp state.
    assert netns.list_netns(f"{netns.ROOT_PREFIX}{rid}") == []
    assert leftovers(work) == []
    assert list(work.iterdir()) == []


def test_star_scaleout_bench(tmp_path: Path) -> None:
    """``--star``: the new node n1 at the centre, one neighbour per rate, links shaped to them."""
    need_root()
    rid = run_id()
    out, work = tmp_path / "out", tmp_path / "work"
    work.mkdir()
    doc = bench_scaleout.run([6], ["synth-4"], 1, (100.0, 1000.0), out, lambda _line: None,
                             iperf_s=1.0, workdir=work, run_id=rid, star=[150.0, 300.0])
    (inst,) = doc["instances"]
    assert inst["new"] == "n1" and inst["neighbours"] == ["n2", "n3"]
    assert inst["configured_mbps"] == {"n1-n2": 150.0, "n1-n3": 300.0}
    assert doc["meta"]["star_mbps"] == [150.0, 300.0] and doc["meta"]["sizes"] == [2]
    (row,) = doc["rows"]
    assert row["verified"] and row["size"] == 2
    res = inst["models"]["synth-4"]
    assert {s for s, v in res["chaos"]["sources"].items() if v[2]} <= {"n2", "n3"}
    assert "a star" in (out / "scaleout.md").read_text()
    assert netns.list_netns(f"{netns.ROOT_PREFIX}{rid}") == []
    assert leftovers(work) == []

