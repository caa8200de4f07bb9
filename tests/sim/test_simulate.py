"""The simulator: its network against closed forms, the validation at 6-7 nodes against the
netns testbed's recorded runs, determinism for a seed, the broker and failover models, a real
mosquitto measurement, and the command's errors.

The testbed's runs are a trimmed copy (sizes 6 and 7) of
``bench/results/scaleout-testbed/scaleout.json`` in ``data/`` (the run of 2026-11-25, which
also measured the links all at once), so a new testbed run does not move these tests.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import pytest
import simpy

from chaos_bench.models import tensor_sizes
from chaos_bench.sim import broker, failover, rate, scaleout, validate
from chaos_bench.sim.network import MBIT, Net
from chaos_bench.sim.run import Options, run
from tests.cli.conftest import assert_one_line_error, run_ctl

pytestmark = pytest.mark.timeout(120)
TESTBED = Path(__file__).parent / "data" / "testbed_6_7.json"
MB = 10**6


def _run_flows(rates: dict[tuple[str, str], float], flows: list[tuple[list[str], int]],
               together: dict[tuple[str, str], float] | None = None
               ) -> tuple[float, list[float]]:
    env = simpy.Environment()
    net = Net(env, rates, latency_s=0.0, together=together or {})
    procs = [net.flow(path, n) for path, n in flows]
    ends: list[float] = []
    for p in procs:
        p.callbacks.append(lambda _e: ends.append(env.now))
    env.run()
    return env.now, ends


def test_one_flow_takes_bytes_over_rate() -> None:
    end, _ = _run_flows({("a", "b"): 100 * MBIT}, [(["a", "b"], 50 * MB)])
    assert end == pytest.approx(50 * MB / (100 * MBIT), rel=1e-9)


def test_two_flows_share_a_link_equally() -> None:
    end, ends = _run_flows({("a", "b"): 100 * MBIT}, [(["a", "b"], 20 * MB)] * 2)
    assert end == pytest.approx(2 * 20 * MB / (100 * MBIT), rel=0.01)
    assert min(ends) > 0.95 * end  # interleaved, not one after the other


def test_a_relayed_flow_is_pipelined_at_the_slowest_hop() -> None:
    rates = {("a", "b"): 800 * MBIT, ("b", "c"): 100 * MBIT}
    end, _ = _run_flows(rates, [(["a", "b", "c"], 100 * MB)])
    assert end == pytest.approx(100 * MB / (100 * MBIT), rel=0.02)


def test_links_into_one_node_send_at_their_together_rate_only_while_shared() -> None:
    rates = {("a", "c"): 100 * MBIT, ("b", "c"): 100 * MBIT}
    together = {("a", "c"): 50 * MBIT, ("b", "c"): 50 * MBIT}
    end, ends = _run_flows(rates, [(["a", "c"], 10 * MB), (["b", "c"], 20 * MB)], together)
    # both at 50 until a's 10 MB are in, then b's last 10 MB alone at 100
    assert min(ends) == pytest.approx(10 * MB / (50 * MBIT), rel=0.1)
    assert end == pytest.approx(10 * MB / (50 * MBIT) + 10 * MB / (100 * MBIT), rel=0.05)
    alone, _ = _run_flows(rates, [(["b", "c"], 20 * MB)], together)
    assert alone == pytest.approx(20 * MB / (100 * MBIT), rel=1e-9)


def test_replay_plans_and_sends_at_the_rates_measured_all_at_once() -> None:
    raw = json.loads(TESTBED.read_text())["instances"][0]
    del raw["concurrent_mbps"]  # as recorded before commit 739c1fa
    alone = validate.instance(raw, 0.95)
    assert not alone.together and alone.probed[raw["neighbours"][0]] > 0
    raw["concurrent_mbps"] = {n: m / 2 for n, m in raw["measured_mbps"].items()}
    inst = validate.instance(raw, 0.95)
    assert inst.probed == inst.together == {n: r / 2 for n, r in alone.probed.items()}
    assert inst.rates == alone.rates  # a link alone still sends at its own rate
    seg = tensor_sizes("resnet101")
    costs = scaleout.Costs()
    assert (scaleout.simulate(inst, "chaos", seg, costs).delay_s
            > 1.8 * scaleout.simulate(alone, "chaos", seg, costs).delay_s)
    assert (scaleout.simulate(inst, "single", seg, costs).delay_s
            == pytest.approx(scaleout.simulate(alone, "single", seg, costs).delay_s))


def test_validation_at_6_and_7_nodes_within_15_percent() -> None:
    doc = validate.load(TESTBED)
    res = validate.replay(doc)
    pts = res["points"]
    assert len(pts) == 2 * 3 * 4  # 2 sizes x 3 models x 4 strategies
    for p in pts:
        if p["strategy"] in ("chaos", "single", "multi-source"):
            assert abs(p["delay_err"]) <= validate.TOLERANCE, p
        if p["strategy"] in ("chaos", "single"):
            assert abs(p["idle_err"]) <= validate.TOLERANCE, p
    multi_idle = sorted(abs(p["idle_err"]) for p in pts if p["strategy"] == "multi-source")
    assert multi_idle[len(multi_idle) // 2] <= validate.TOLERANCE
    # stop-resume: the testbed's own phases added up (its restart varied 1.4-6.9 s in the run)
    costs = validate.calibrate(doc)
    stop = next(p for p in pts if p["strategy"] == "stop-resume")
    nbytes = sum(tensor_sizes(stop["model"]))
    assert stop["delay_sim_s"] == pytest.approx(
        nbytes / costs.disk_write_bps + costs.restart_s + nbytes / costs.disk_read_bps
        + nbytes / costs.verify_bps)


def test_holdout_fits_on_one_run_and_predicts_another_from_configured_rates() -> None:
    doc = validate.load(TESTBED)
    fit = {**doc, "instances": [i for i in doc["instances"] if i["size"] == 6]}
    check = {**doc, "instances": [i for i in doc["instances"] if i["size"] == 7]}
    res = validate.holdout(fit, check)
    assert res["sizes"] == [7] and res["fitted_on"]["costs"] == validate.calibrate(fit).__dict__
    # Nothing measured on the checked run reaches the prediction: change it all, same result.
    blind = json.loads(json.dumps(check))
    for inst in blind["instances"]:
        inst["measured_mbps"] = dict.fromkeys(inst["measured_mbps"], 1.0)
        inst["concurrent_mbps"] = dict.fromkeys(inst["concurrent_mbps"], 1.0)
    again = validate.holdout(fit, blind)
    assert [p["delay_sim_s"] for p in again["points"]] == [p["delay_sim_s"] for p in
                                                           res["points"]]
    # Unique points: 6 per model (single's idle and stop-resume's delay are not their own),
    # the predicted strategies apart from the fitted one.
    groups = {g["group"]: g for g in res["groups"]}
    assert groups["predicted"]["points"] == 3 * 5 and groups["fitted"]["points"] == 3
    assert sum(u["points"] for u in res["unique"]) == 3 * 6
    inst = validate.instance(check["instances"][0], 0.9, together=0.5)
    n = check["instances"][0]["neighbours"][0]
    cfg = check["instances"][0]["configured_mbps"][validate._link(n, inst.new)]
    assert inst.together[n] == pytest.approx(cfg * MBIT * 0.9 * 0.5) == inst.probed[n]


def test_chaos_never_slower_than_single_and_idles_only_its_neighbours() -> None:
    import random

    from chaos_bench.sim.topology import generate

    inst = generate(200, random.Random(3))
    seg = tensor_sizes("resnet101")
    c = scaleout.simulate(inst, "chaos", seg, scaleout.Costs())
    s = scaleout.simulate(inst, "single", seg, scaleout.Costs())
    assert c.delay_s < s.delay_s
    assert c.participants == len(inst.neighbours) == 3
    assert s.idle_s == pytest.approx(200 * s.delay_s)


def _small(seed: int) -> dict:
    doc = run(Options(nodes=(12, 40), seed=seed, repeats=2, models=("resnet101",),
                      testbed=TESTBED, churn_seconds=120.0), lambda _line: None)
    doc["meta"].pop("wall_s_not_seeded")
    assert set(doc.pop("measured")["policy_cpu_s"]) == {"12", "40"}
    return doc


def test_deterministic_for_a_seed() -> None:
    a, b = _small(5), _small(5)
    assert json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)
    assert json.dumps(_small(6)["sweep"]) != json.dumps(a["sweep"])
    assert [c["nodes"] for c in a["churn"]] == [12, 40]  # every size, capped at 1,000


def test_churn_runs_the_real_scheduler() -> None:
    from chaos_bench.sim import churn

    out = churn.run(60, 2, 600.0, churn.ChurnRates(join=6.0, leave=2.0, fail=2.0),
                    rate.DEFAULT_MODEL, scaleout.Costs())
    ev = out["events"]
    assert ev["join"] > 10 and ev["fail"] > 0
    # every join ends as the real scheduler's scale-out event, or was failed while joining,
    # or is still in flight
    assert out["scale_outs"] + out["joins_dropped"] + out["joins_in_flight"] == ev["join"]
    assert out["scale_outs"] > out["joins_dropped"]
    assert out["scale_out_delay_s"]["median"] > 0
    assert out["members_end"] <= 60 + ev["join"] - ev["leave"] + 3
    # each snapshot is charged at the size the daemon sends it: stamped and packed, about
    # ten times smaller than the plain JSON that the churn measured before
    assert out["snapshots"] > ev["join"]
    plain = broker.measure_snapshot(out["members_end"], packed=False)
    assert broker.snapshot_bytes(60) < out["snapshot_bytes_max"] < plain / 4


def test_heartbeat_patterns_quadratic_and_linear() -> None:
    # the control bench measured 289 deliveries/s at 12 nodes (heartbeats and a little more)
    assert broker.heartbeat_load(12, "all-to-all")[1] == 288
    linear = [broker.heartbeat_load(n, "leader-only")[1] for n in (12, 48)]
    assert linear[1] / linear[0] <= 4.5
    m = rate.DEFAULT_MODEL
    assert broker.saturation_n("all-to-all", m) < broker.saturation_n("leader-only", m)
    assert broker.saturation_n("leader-only", m, 1.0) < broker.saturation_n("leader-only", m)


def test_snapshot_size_follows_the_real_scheduler() -> None:
    assert broker.snapshot_bytes(400) == pytest.approx(broker.measure_snapshot(400), rel=0.03)
    assert broker.snapshot_bytes(broker.snapshot_limit_n()) > broker.MAX_PAYLOAD


def test_failover_at_12_and_10000_nodes() -> None:
    m = rate.DEFAULT_MODEL
    stop = failover.run(12, "sigstop", "leader-only", m, 1)
    assert 1.5 < stop["detect_s"] <= stop["elected_s"] < 2.5  # phi crosses 8 about 2 s in
    kill = failover.run(12, "kill9", "leader-only", m, 1)
    assert kill["elected_s"] < 1.0
    big = failover.run(10_000, "sigstop", "leader-only", m, 1)
    assert not big["saturated"] and big["followers"] == 9_999
    assert failover.run(10_000, "sigstop", "all-to-all", m, 1)["saturated"]


@pytest.mark.skipif(shutil.which("mosquitto", path="/usr/sbin:/usr/bin:/usr/local/sbin")
                    is None, reason="mosquitto not installed")
def test_measures_a_real_mosquitto() -> None:
    # long enough for the broker CPU to span a few dozen clock ticks (10 ms each)
    model = rate.measure(lambda _line: None, seconds=1.5, subscribers=4)
    assert model.per_delivery_s > 0
    assert 1_000 < model.service_rate() < 10_000_000


def test_scaled_broker_rate() -> None:
    assert rate.scaled(50_000).service_rate() == pytest.approx(50_000)


def test_command_writes_results(tmp_path: Path) -> None:
    proc = run_ctl("bench", "simulate", "--nodes", "12", "--repeats", "1", "--models",
                   "resnet101", "--testbed", str(TESTBED), "--out", str(tmp_path), timeout=110)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads((tmp_path / "simulate.json").read_text())
    assert doc["sweep"][0]["size"] == 12 and doc["validation"]["points"]
    assert (tmp_path / "simulate.md").exists()


@pytest.mark.parametrize(("args", "code", "needle"), [
    (["--nodes", "2"], 2, "--nodes"),
    (["--nodes", "x"], 2, "--nodes"),
    (["--models", "resnet9000"], 2, "resnet9000"),
    (["--measure-broker", "--broker-rate", "1000"], 2, "not both"),
    (["--testbed", "/nonexistent/scaleout.json"], 1, "no testbed results"),
    (["--holdout", "x.json", "--no-validate"], 2, "drop --no-validate"),
    (["--out", "/proc/no-such-dir"], 2, "--out /proc/no-such-dir"),
])
def test_bad_input_is_one_line(args: list[str], code: int, needle: str, tmp_path: Path) -> None:
    if "--out" not in args:
        args = [*args, "--out", str(tmp_path)]
    proc = run_ctl("bench", "simulate", *args, timeout=90)
    assert needle in assert_one_line_error(proc, code)


def test_costs_are_plain_data() -> None:
    assert dataclasses.asdict(scaleout.Costs())["window_bytes"] == 2 << 20
