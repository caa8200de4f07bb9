"""``chaosctl bench throughput`` end to end, small: every arm (torch DDP over gloo, the Trainer
with and without overlap, and chaos_edge.ddp) trains the CNN on 2 real members, and the
results are what the report says. No timing is asserted: speed is the bench's, not the
test's."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.cli.conftest import run_ctl

pytestmark = [pytest.mark.xdist_group("bench"), pytest.mark.timeout(300)]


def test_every_arm_runs_the_same_steps_and_is_reported(tmp_path: Path) -> None:
    out = tmp_path / "out"
    proc = run_ctl("bench", "throughput", "--model", "cnn", "--nodes", "2", "--repeats", "1",
                   "--warmup", "3", "--steps", "5", "--batch", "32", "--out", str(out),
                   timeout=280)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "| chaos-ddp |" in proc.stdout
    doc = json.loads((out / "throughput.json").read_text())
    assert doc["arms"] == ["ddp", "chaos", "chaos-overlap", "chaos-ddp"]
    assert len(doc["repeats"]) == 1
    for arm, res in doc["repeats"][0].items():
        workers = res["workers"]
        assert sorted(w["member"] for w in workers) == ([0, 1] if arm == "ddp" else [1, 2])
        for w in workers:
            assert w["arm"] == arm and w["steps"] == 5 and len(w["step_s"]) == 5
            assert w["short_steps"] == [] and w["members"] == 2
            assert all(b <= s for b, s in zip(w["to_backward_end_s"], w["step_s"], strict=True))
        assert res["steps_per_s"] > 0
    assert set(doc["summary"]["chaos"]) == {"steps_per_s", "vs_ddp"}
    assert "vs_ddp" not in doc["summary"]["ddp"]
    assert (out / "throughput.md").read_text().startswith("Throughput: cnn")


@pytest.mark.netns
def test_on_the_testbed_every_arm_trains_over_shaped_links_and_nothing_is_left(
        tmp_path: Path) -> None:
    from chaos_bench.throughput import run as bench_throughput
    from netprobe import netns
    from tests.testbed.conftest import need_root, run_id

    need_root()
    rid = run_id()
    doc = bench_throughput.run("cnn", 2, 16, 2, 3, 1, ["ddp", "chaos-ddp"], tmp_path / "out",
                               None, print, mbit=100.0, run_id=rid, mbit_max=300.0,
                               wire="int8")
    assert doc["network"] == "netns" and (doc["mbit"], doc["mbit_max"]) == (100.0, 300.0)
    # One link, at the rate seed 1 draws in the range: both arms ran on that testbed.
    (link, rate), = doc["links_mbit"].items()
    assert link == "n1-n2" and 100.0 <= rate <= 300.0
    for arm in ("ddp", "chaos-ddp"):
        workers = doc["repeats"][0][arm]["workers"]
        assert len(workers) == 2 and all(len(w["step_s"]) == 3 for w in workers)
    # The Chaos arm's rounds ran on the int8 wire; DDP's have no policy.
    policies = [w["policy"] for w in doc["repeats"][0]["chaos-ddp"]["workers"]]
    assert all(p["wire"] == "int8" for p in policies), policies
    assert all(w["policy"] is None for w in doc["repeats"][0]["ddp"]["workers"])
    md = (tmp_path / "out" / "throughput.md").read_text()
    assert f"netns full mesh of links at n1-n2 {rate:g} Mbit/s" in md and "int8 wire" in md
    prefix = f"{netns.ROOT_PREFIX}{rid}"
    assert netns.list_netns(prefix) == [] and netns.list_links(prefix) == []
