"""``chaosctl bench scaleout`` end to end on a real testbed, in its smallest configuration.

One size (3 -> 4), a 4 MiB synthetic state, one repeat: every strategy runs inside the
namespaces, the JSON has all four with positive delays and verified bytes, and nothing is left
behind (namespaces, processes, the temp work directory).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from chaosctl.bench import scaleout as bench_scaleout
from netprobe import netns
from tests.testbed.conftest import leftovers, need_root, run_id

pytestmark = [pytest.mark.netns, pytest.mark.timeout(120)]
STRATEGIES = set(bench_scaleout.STRATEGIES)


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
    assert set(row["delay_s"]) == STRATEGIES
    assert all(d > 0 for d in row["delay_s"].values())
    assert row["verified"] and row["lb_measured_s"] > 0
    assert row["chaos_over_lb_measured"] > 0
    (inst,) = saved["instances"]
    res = inst["models"]["synth-4"]
    assert set(res) == STRATEGIES
    assert all(r["verified"] for r in res.values())
    # chaos pulled from the new node's neighbours only, and every byte verified on arrival.
    chaos_bytes = {s: v[2] for s, v in res["chaos"]["sources"].items() if v[2]}
    assert set(chaos_bytes) <= set(inst["neighbours"])
    assert sum(chaos_bytes.values()) >= 4 << 20
    assert res["chaos"]["refetched_blocks"] == 0
    assert set(inst["measured_mbps"]) == set(inst["neighbours"])
    assert any("iperf3" in line for line in lines)

    # Nothing left: no namespace of this run, no process from the work dir, no temp state.
    assert netns.list_netns(f"{netns.ROOT_PREFIX}{rid}") == []
    assert leftovers(work) == []
    assert list(work.iterdir()) == []
