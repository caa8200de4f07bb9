"""``chaosctl bench allreduce`` in its smallest configurations: both implementations run in the
same worker processes (and gloo again in processes of its own), every round's new input is
averaged right; the mesh leaves nothing behind.

Only correctness is checked (the bench itself refuses a wrong result); no timings. The
harness's own checks are tested too: a stale or wrong result is refused.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from chaos_bench.allreduce import procs, worker
from chaos_bench.allreduce import run as bench_allreduce
from chaosctl.client import CtlError
from netprobe import netns
from tests.testbed.conftest import need_root, run_id


def _opts(**kw: object) -> dict[str, object]:
    opts: dict[str, object] = {
        "networks": ["loopback"], "mb": 4, "nodes": 3, "repeats": 1, "chunk_kbs": [256],
        "results": ["reuse"], "trees": ["chain", "star"], "samples": 1, "sock_buf": 0,
        "mesh_mb": 1, "mesh_chunk_kb": 256, "fast_mbit": 400.0, "slow_mbit": 100.0,
    }
    opts.update(kw)
    return opts


def _check(doc: dict[str, object], out: Path, kinds: set[str], network: str) -> None:
    saved = json.loads((out / "allreduce_bench.json").read_text())
    (res,) = saved["results"]
    assert res["network"] == network
    gloos = {k for k in kinds if k.startswith("gloo")} | {"gloo-alone"}
    assert {r["kind"] for r in res["rows"]} == kinds | gloos
    assert set(res["ratios"]) == kinds - gloos
    assert res["baseline"] in gloos
    assert set(res["ratios_by_baseline"]) == gloos
    for r in res["rows"]:
        (run,) = r["runs"]
        assert run["seconds"] > 0 and run["cpu_seconds"] > 0
        if r["wire"] == "fp32":  # every fp32 result is the exact average, to rounding
            assert run["max_err"] <= bench_allreduce.TOLERANCE
    assert str(bench_allreduce.table(doc).title).startswith("All-reduce")


@pytest.mark.timeout(240)
def test_loopback_chaos_and_gloo_agree(tmp_path: Path) -> None:
    lines: list[str] = []
    doc = bench_allreduce.run(_opts(samples=3), tmp_path, lines.append)
    _check(doc, tmp_path, {"gloo", "chaos/chain", "chaos/star"}, "loopback")
    assert any("wrote" in line for line in lines)


@pytest.mark.timeout(240)
def test_each_wire_format_runs_and_sends_its_share_of_the_bytes(tmp_path: Path) -> None:
    doc = bench_allreduce.run(_opts(trees=["chain"], wires=["fp32", "bf16", "int8"]), tmp_path,
                              print)
    _check(doc, tmp_path, {"gloo", "chaos/chain", "chaos/chain+bf16", "chaos/chain+int8"},
           "loopback")
    rows = {r["kind"]: r for r in doc["results"][0]["rows"]}
    assert [rows[k]["wire"] for k in ("gloo", "chaos/chain+int8")] == ["fp32", "int8"]
    fp32 = rows["chaos/chain"]["sent_MB_per_node"]
    # A chain of three: on average each node sends the vector 4/3 times (2 up, 2 down).
    assert fp32 == pytest.approx(4 / 3 * doc["results"][0]["bytes"] / 1e6, rel=0.01)
    assert rows["chaos/chain+bf16"]["sent_MB_per_node"] == pytest.approx(fp32 / 2, rel=0.01)
    assert rows["chaos/chain+int8"]["sent_MB_per_node"] == pytest.approx(fp32 / 4, rel=0.02)
    assert rows["chaos/chain"]["max_err"] <= bench_allreduce.TOLERANCE
    for kind in ("chaos/chain+bf16", "chaos/chain+int8"):  # lossy, but close (values ~N(0,1))
        assert 0 < rows[kind]["max_err"] < 0.5


@pytest.mark.netns
@pytest.mark.timeout(300)
def test_mesh_runs_on_the_spanning_tree_and_is_torn_down(tmp_path: Path) -> None:
    need_root()
    rid = run_id()
    doc = bench_allreduce.run(_opts(networks=["mesh"], run_id=rid), tmp_path, print)
    _check(doc, tmp_path, {"gloo", "gloo-rooted", "chaos/spanning", "chaos/chain"}, "mesh")
    (res,) = doc["results"]
    bounds = {r["kind"]: r["bound_s"] for r in res["rows"]}
    # 1 MB: gloo's ring crosses a 100 Mbit/s link with 1.5 MB; the spanning star sends 1 MB
    # each way over 400 Mbit/s links; the chain crosses 100 Mbit/s links.
    assert bounds["gloo"] == pytest.approx(1.5 * 1e6 * 8 / 100e6)
    assert bounds["chaos/spanning"] == pytest.approx(1e6 * 8 / 400e6)
    assert bounds["chaos/chain"] == pytest.approx(1e6 * 8 / 100e6)
    # A bound holds; tbf's bucket (1 ms of bytes) lets a round start a little ahead of it.
    assert all(r["seconds"] >= 0.9 * r["bound_s"] for r in res["rows"]), res["rows"]
    assert res["trees"]["spanning"] == {"edges": [["n1", "n2"], ["n1", "n3"], ["n1", "n4"]],
                                        "root": "n1"}  # the fast star, from the link rates
    assert res["link_mbit"]["n1-n2"] == 400.0 and res["link_mbit"]["n2-n3"] == 100.0
    prefix = f"{netns.ROOT_PREFIX}{rid}"
    assert res["leftovers_after_teardown"] == []
    assert netns.list_netns(prefix) == [] and netns.list_links(prefix) == []


def test_a_stale_or_wrong_result_is_refused() -> None:
    # What a round that wrote nothing would hand back: the last round's average. Each round
    # scales the input anew, so that is far outside the tolerance.
    elems, world = 1000, 3
    avg = worker.exact_average(world, elems)
    assert all(worker.scale(r) != worker.scale(r + 1) for r in range(20))
    stale = avg * np.float32(worker.scale(4))
    err = float(np.max(np.abs(stale - avg * np.float32(worker.scale(5)))))
    assert err > 100 * bench_allreduce.TOLERANCE
    good = {"start": 0.0, "end": 1.0, "cpu": 1.0, "checksum": 1.0, "err": 1e-7, "sent": 10,
            "tx": 0}
    assert procs.check_round("chaos/chain", [good, good])["max_err"] == 1e-7
    with pytest.raises(CtlError, match="differs from the exact average"):
        procs.check_round("gloo", [good, {**good, "err": err}])
    with pytest.raises(CtlError, match="different results"):
        procs.check_round("chaos/chain", [good, {**good, "checksum": 2.0}])
    assert procs.check_round("chaos/chain+int8", [good, {**good, "err": 0.3}])["max_err"] == 0.3
