"""The convergence report's band: static runs repeated over seeds give the noise, and each
change run is placed in it. Made-up curves, so every figure can be checked by hand."""

from __future__ import annotations

from typing import Any

import pytest

from chaos_bench.convergence import report
from chaos_bench.convergence.run import runs_of

pytestmark = pytest.mark.timeout(30)


def _res(name: str, start: int, end: int, train: list[float], val: list[float],
         seed: int = 0) -> dict[str, Any]:
    return {"name": name, "mode": "plain", "wire": "fp32", "start": start, "end": end,
            "seed": seed,
            "epochs": [{"epoch": k + 1, "train_loss": v} for k, v in enumerate(train)],
            "evals": [{"epoch": k + 1.0, "val_loss": v, "val_acc": 0.5}
                      for k, v in enumerate(val)],
            "final": {"train_loss": train[-1], "val_loss": val[-1], "val_acc": 0.5}}


def _mdoc() -> dict[str, Any]:
    runs = [_res("static-4", 4, 4, [3.0, 2.0, 1.0, 0.5], [3.0, 2.0, 1.2, 0.6], 0),
            _res("static-4 r2", 4, 4, [3.1, 2.2, 1.2, 0.7], [3.1, 2.1, 1.4, 0.8], 1),
            _res("static-4 r3", 4, 4, [2.9, 2.1, 1.1, 0.6], [2.9, 2.2, 1.3, 0.7], 2),
            # joins at epoch 2: epoch 3 inside the band, epoch 4 above it; val both inside
            _res("4->5", 4, 5, [3.0, 2.0, 1.15, 0.9], [3.0, 2.0, 1.25, 0.75])]
    return {"runs": {f"{r['name']}/plain": r for r in runs}}


def test_the_band_spans_the_seeds_and_places_each_change_run() -> None:
    mdoc = _mdoc()
    report.compare(mdoc, at=2)
    report.bands(mdoc, at=2)
    band = mdoc["bands"]["static-4/plain"]
    assert band["repeats"] == 3 and band["seeds"] == [0, 1, 2]
    assert band["train_loss"][2] == pytest.approx({"mean": 1.1, "min": 1.0, "max": 1.2})
    assert band["val_loss"][4] == pytest.approx({"mean": 0.7, "min": 0.6, "max": 0.8})
    placed = mdoc["runs"]["4->5/plain"]["band"]
    assert placed["train_loss"]["inside"] == 1 and placed["train_loss"]["epochs"] == 2
    assert placed["train_loss"]["mean_abs_from_mean"] == pytest.approx((0.05 + 0.3) / 2)
    assert placed["train_loss"]["mean_half_width"] == pytest.approx(0.1)
    assert placed["val_loss"]["inside"] == 2
    # The static runs have no place in a band; the paired difference is to the same seed.
    assert mdoc["runs"]["static-4 r2/plain"]["band"] is None
    assert mdoc["runs"]["4->5/plain"]["delta"]["train_loss"] == pytest.approx((0.15 + 0.4) / 2)


def test_one_run_a_configuration_makes_no_band() -> None:
    mdoc = _mdoc()
    for key in ("static-4 r2/plain", "static-4 r3/plain"):
        del mdoc["runs"][key]
    report.compare(mdoc, at=2)
    report.bands(mdoc, at=2)
    assert mdoc["bands"] == {} and mdoc["runs"]["4->5/plain"]["band"] is None


def test_repeats_run_the_static_configurations_again_with_the_next_seeds() -> None:
    runs = runs_of("cnn", 4, ["plain"], repeats=3)
    assert [r.name for r in runs] == ["static-4", "static-5", "4->5", "5->4", "static-4 r2",
                                      "static-5 r2", "static-4 r3", "static-5 r3"]
    assert {r.repeat for r in runs if r.start != r.end} == {0}
    assert [r.name for r in runs_of("cnn", 2, ["consistent"])] == [
        "static-2", "static-3", "2->3", "3->2"]


def test_a_compressed_run_is_compared_with_its_fp32_twin() -> None:
    fp32 = _res("static-2", 2, 2, [3.0, 2.0, 1.0], [3.0, 2.2, 1.2])
    int8 = {**_res("static-2", 2, 2, [3.0, 2.5, 1.5], [3.0, 2.4, 1.1]), "wire": "int8"}
    int8["final"] = {**int8["final"], "val_acc": 0.75}
    mdoc = {"runs": {"static-2/plain": fp32, "static-2/plain/int8": int8}}
    report.compare(mdoc, at=1)
    assert fp32["vs_fp32"] is None  # the twin itself
    vs = int8["vs_fp32"]
    assert vs["final"] == pytest.approx({"train_loss": 0.5, "val_loss": -0.1, "val_acc": 0.25})
    assert vs["mean_abs_train_loss"] == pytest.approx((0.0 + 0.5 + 0.5) / 3)
    # A compressed run whose twin did not run has nothing to be compared with.
    del mdoc["runs"]["static-2/plain"]
    report.compare(mdoc, at=1)
    assert int8["vs_fp32"] is None
