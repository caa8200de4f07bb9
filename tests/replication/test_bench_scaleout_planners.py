"""The scale-out bench runs the paper's planner beside the default, without root.

The netns bench (``chaosctl bench scaleout``) drives :mod:`chaos_bench.scaleout.node`
processes over their stdin/stdout (:mod:`chaos_bench.workers`); here the same processes run on
loopback: two real state servers and a real joining node that runs ``chaos`` and
``chaos-paper`` on a state of one tensor, the shape the paper's planner cannot split, and the
``plain`` baseline (plain sockets, the water-filling split). The report puts them beside the
bounds.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from chaos_bench.models import make_state
from chaos_bench.scaleout import report
from chaos_bench.scaleout.run import NODE_MODULE
from chaos_bench.workers import LineWorker

pytestmark = pytest.mark.timeout(120)

NODES = ("n1", "n2")


def _node(name: str, argv: list[str], tmp: Path) -> LineWorker:
    """A ``scaleout.node`` process on loopback, through the bench's own worker harness."""
    return LineWorker(name, NODE_MODULE, argv, tmp / f"{name}.log")


@pytest.fixture
def nodes() -> Iterator[list[LineWorker]]:
    made: list[LineWorker] = []
    yield made
    for n in made:
        n.close()


def test_joiner_runs_the_paper_planner_beside_the_default(
    tmp_path: Path, nodes: list[LineWorker]
) -> None:
    state = tmp_path / "synth.state"
    manifest = make_state("synth-4", state, 1)
    common = ["--state", str(state), "--manifest", str(state.with_suffix(".manifest.json"))]
    addrs, plain = {}, {}
    for n in NODES:
        nodes.append(_node(n, ["serve", "--node", n, *common, "--port", "0", "--plain-port",
                               "0"], tmp_path))
        ready = nodes[-1].recv(60)
        addrs[n] = ["127.0.0.1", ready["ready"][1]]
        plain[n] = ["127.0.0.1", ready["plain"]]
    rates = {"n1": 400e6, "n2": 800e6}  # bit/s
    job = {
        "neighbors": [[n, 0.0, 8 / rates[n]] for n in NODES],
        "sources": [[n, 0.0, 8 / rates[n]] for n in NODES],
        "routes": {n: [n] for n in NODES},
        "addresses": addrs,
        "plain_addresses": plain,
        "checkpoint_nodes": [],
        "planner": "chaos",
    }
    (tmp_path / "job.json").write_text(json.dumps(job))
    joiner = _node("n0", ["join", "--node", "n0", *common, "--job", str(tmp_path / "job.json"),
                          "--workdir", str(tmp_path)], tmp_path)  # fmt: skip
    nodes.append(joiner)
    assert joiner.recv(60) == {"ready": True}
    res = {name: joiner.ask(f"run {name}", 60) for name in ("chaos", "chaos-paper", "plain")}
    for name, r in res.items():
        assert "error" not in r and r["verified"], (name, r)
        assert r["strategy"] == name
    assert res["chaos"]["planner"] == "chaos" and res["chaos-paper"]["planner"] == "paper"
    # One tensor: the paper's planner sends it all from one neighbour, the default from both.
    assert sorted(v for v in res["chaos-paper"]["plan_bytes"].values()) == [0, 4 << 20]
    assert all(v > 0 for v in res["chaos"]["plan_bytes"].values())
    assert res["chaos"]["plan_makespan_s"] < res["chaos-paper"]["plan_makespan_s"]
    # Plain sockets: the water-filling split of the one segment, every byte once.
    assert res["plain"]["plan_bytes"] == {
        s: v[2] for s, v in res["plain"]["sources"].items()
    }
    assert sum(res["plain"]["plan_bytes"].values()) == 4 << 20
    for r in res.values():  # every source's bytes, start, end, taken and given are reported
        assert all(len(v) == 6 for v in r["sources"].values())

    # The report puts both beside the bound (the other strategies' numbers are made up here).
    fake = {
        "delay_s": 1.0,
        "decision_s": 1e-4,
        "verified": True,
        "servers": {n: {"busy_s": 0.5, "bytes_sent": 1, "bytes_relayed": 0} for n in NODES},
    }
    runs = {s: fake for s in report.RUNS} | res
    for r in res.values():
        r["servers"] = fake["servers"]
    inst = {
        "size": 2,
        "new": "n3",
        "neighbours": list(NODES),
        "models": {"synth-4": runs},
        "measured_mbps": {n: rates[n] / 1e6 for n in NODES},
        "concurrent_mbps": {n: rates[n] / 2e6 for n in NODES},
        "configured_mbps": {f"{n}-n3": rates[n] / 1e6 for n in NODES},
    }
    (row,) = report.summarise([inst], {"synth-4": manifest})
    assert set(row["delay_s"]) == set(report.RUNS)
    assert row["paper_over_chaos"] == pytest.approx(
        res["chaos-paper"]["delay_s"] / res["chaos"]["delay_s"]
    )
    # Links measured all at once give half the rate here: the achievable bound is twice.
    assert row["lb_achievable_s"] == pytest.approx(2 * row["lb_measured_s"])
    assert row["chaos_over_lb_achievable"] == pytest.approx(
        res["chaos"]["delay_s"] / row["lb_achievable_s"]
    )
    assert row["chaos_over_plain"] == pytest.approx(
        res["chaos"]["delay_s"] / res["plain"]["delay_s"]
    )
    # The spread of each headline ratio over the repeats: one repeat, so least == largest.
    low, high = row["chaos_over_lb_achievable_range"]
    assert low == high == pytest.approx(row["chaos_over_lb_achievable"], abs=1e-4)
    assert row["chaos_over_plain_range"][0] == pytest.approx(row["chaos_over_plain"], abs=1e-4)
    slower = copy.deepcopy(inst)  # a second repeat in which chaos took twice as long
    slower["models"]["synth-4"]["chaos"]["delay_s"] *= 2
    (two,) = report.summarise([inst, slower], {"synth-4": manifest})
    assert two["repeats"] == 2 and two["chaos_over_lb_achievable_range"] == pytest.approx(
        [low, 2 * low], abs=1e-3)
    assert set(row["decision_ms"]) == {"chaos", "chaos-paper"}
    assert len(report.cells(row)) == len(report.COLUMNS)
    assert "paper s" in report.COLUMNS and "paper/LBm" in report.COLUMNS
    assert {"plain s", "LB ach s", "chaos/LBa", "paper/LBa", "chaos/plain"} <= set(report.COLUMNS)
    doc = {
        "meta": {
            "sizes": [2],
            "models": ["synth-4"],
            "repeats": 1,
            "bw_mbps": [400, 800],
            "degree": 2,
        },
        "rows": [row],
    }
    assert "| 2->3 | synth-4 |" in report.markdown(doc)
