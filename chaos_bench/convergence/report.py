"""What ``chaosctl bench convergence`` makes of its workers' records, and nothing else.

Every figure comes from the JSON lines the workers wrote (see
:mod:`chaos_bench.convergence.worker`), so the report can be recomputed from them:

- the global training loss of each step: the members' losses weighted by their samples;
- per epoch (``epoch_samples`` global samples): the mean of those losses over the steps that
  started in it, and the validation loss and accuracy at its end;
- the mean absolute difference of the per-epoch training loss (and of the validation loss) to
  the static run with the same starting node count, mode, wire format and seed, over the
  epochs after ``--at``;
- the *band* of each static configuration over its repeats (seeds): per epoch the mean, the
  least and the largest training loss, and the same of the validation loss at each epoch's
  end; and for each change run, how many of its epochs after ``--at`` lie inside the band of
  the static runs with its starting node count, and how far it is from the band's mean;
- for a run in a compressed wire format: its final loss and accuracy minus those of the same
  run in fp32, and the mean absolute difference of their per-epoch training losses;
- checks: every step ``1..N`` committed, each once by each member; while training, the
  members (the nodes that committed a round, and a leaver in its last rounds) change only at
  the planned join or leave; identical state digests at every step the members share; the
  whole sample budget trained; a falling loss;
- and, as information, the steps whose shard a member cut for other members than the round
  ran with (it read ``trainer.shard`` before the new policy reached it).
"""

from __future__ import annotations

import statistics
from typing import Any

from rich.table import Table

Records = dict[str, list[dict[str, Any]]]
MAX_PROBLEMS = 10  # per run: the first ones say enough


def _steps(recs: Records) -> dict[int, list[dict[str, Any]]]:
    by_step: dict[int, list[dict[str, Any]]] = {}
    for rows in recs.values():
        for r in rows:
            if r.get("kind") == "step":
                by_step.setdefault(int(r["step"]), []).append(r)
    return dict(sorted(by_step.items()))


def _mean(values: list[float]) -> float | None:
    return statistics.fmean(values) if values else None


def analyse(recs: Records, epoch_samples: int, epochs: int) -> dict[str, Any]:
    """The run's curves: per step, per epoch, the evaluations, and where membership changed."""
    steps: dict[str, list[Any]] = {"step": [], "pos": [], "global_batch": [], "members": [],
                                   "loss": []}
    form, took = 0, membership(recs)
    for step, rows in _steps(recs).items():
        if rows[0]["phase"] != "train":
            form += 1
            continue
        sized = [(r["loss"], r["size"]) for r in rows if r["loss"] is not None and r["size"]]
        n = sum(size for _, size in sized)
        loss = round(sum(v * size for v, size in sized) / n, 6) if n else None
        for key, value in (("step", step), ("pos", rows[0]["pos"]), ("loss", loss),
                           ("global_batch", rows[0]["global_batch"]),
                           ("members", len(took[step]))):
            steps[key].append(value)
    per_epoch = []
    for k in range(1, epochs + 1):
        lo, hi = (k - 1) * epoch_samples, k * epoch_samples
        losses = [loss for pos, gb, loss in zip(steps["pos"], steps["global_batch"],
                                                steps["loss"], strict=True)
                  if loss is not None and lo <= pos - gb < hi]
        per_epoch.append({"epoch": k, "steps": len(losses), "train_loss": _mean(losses)})
    seen: dict[int, dict[str, Any]] = {}
    for rows in recs.values():
        for r in rows:
            if r.get("kind") == "eval":
                seen.setdefault(r["pos"], {"epoch": round(r["epoch"], 4), "step": r["step"],
                                           "val_loss": r["val_loss"], "val_acc": r["val_acc"]})
    evals = [seen[p] for p in sorted(seen)]
    change = None
    for i, members in enumerate(steps["members"]):
        if members != steps["members"][0]:
            change = {"step": steps["step"][i], "members": members, "epoch": round(
                (steps["pos"][i] - steps["global_batch"][i]) / epoch_samples, 3)}
            break
    final = {"train_loss": per_epoch[-1]["train_loss"] if per_epoch else None,
             "val_loss": evals[-1]["val_loss"] if evals else None,
             "val_acc": evals[-1]["val_acc"] if evals else None}
    return {"final": final, "change": change, "formation_steps": form, "epochs": per_epoch,
            "evals": evals, "steps": steps}


def membership(recs: Records) -> dict[int, set[str]]:
    """Who took part in each committed round: the nodes that recorded it, and a leaver in the
    rounds it ran without samples inside ``request_node_exit()`` (after its ``leave`` record,
    up to the step of its ``exit`` record)."""
    drained: dict[str, range] = {}
    for node, rows in recs.items():
        leave = [r["step"] for r in rows if r.get("kind") == "leave"]
        gone = [r["step"] for r in rows if r.get("kind") == "exit"]
        if leave and gone:
            drained[node] = range(leave[0] + 1, gone[0] + 1)
    return {step: {r["node"] for r in rows} | {n for n, d in drained.items() if step in d}
            for step, rows in _steps(recs).items()}


def stale_shards(recs: Records) -> list[int]:
    """Training steps at which a member read ``trainer.shard`` before the policy that governed
    the round reached it: its shard was cut for other members (some samples of that global
    batch were then left out, or taken twice)."""
    took = membership(recs)
    return [step for step, rows in _steps(recs).items() if rows[0]["phase"] == "train"
            and any(set(r["members"]) != took[step] for r in rows)]


def check(recs: Records, start: int, end: int, budget: int) -> list[str]:
    """What is wrong with a run's records (empty: nothing); see the module docstring."""
    problems: list[str] = []
    by_step = _steps(recs)
    if not by_step:
        return ["no step was committed"]
    if list(by_step) != list(range(1, max(by_step) + 1)):
        problems.append(f"steps 1..{max(by_step)} are not all there")
    for node, rows in recs.items():
        mine = [int(r["step"]) for r in rows if r.get("kind") == "step"]
        if mine and mine != list(range(mine[0], mine[0] + len(mine))):
            problems.append(f"{node} committed steps with gaps or twice")
    took = membership(recs)
    sets: list[list[str]] = []
    for step, rows in by_step.items():
        digests = {r["digest"] for r in rows}
        if len(digests) > 1:
            problems.append(f"step {step}: {len(digests)} different state digests")
        if rows[0]["phase"] == "train" and (not sets or sets[-1] != sorted(took[step])):
            sets.append(sorted(took[step]))
    ids = [f"node-{i}" for i in range(1, max(start, end) + 1)]
    want = [ids[:start]] + ([ids[:end]] if end != start else [])
    if sets != want:
        problems.append(f"members while training were {sets}, not {want}")
    last = by_step[max(by_step)][0]
    if last["pos"] < budget:
        problems.append(f"the run stopped at sample {last['pos']} of {budget}")
    res = analyse(recs, 1, 1)
    evals, losses = res["evals"], [v for v in res["steps"]["loss"] if v is not None]
    k = max(1, len(losses) // 5)
    if len(evals) < 2 or evals[-1]["val_loss"] >= evals[0]["val_loss"] or len(losses) < 2 \
            or _mean(losses[-k:]) >= _mean(losses[:k]):  # type: ignore[operator]
        problems.append("the loss did not fall")
    return problems[:MAX_PROBLEMS]


def _suffix(res: dict[str, Any]) -> str:
    wire = res.get("wire", "fp32")
    return "" if wire == "fp32" else f"/{wire}"


def compare(mdoc: dict[str, Any], at: int) -> None:
    """Add each run's mean |loss - static| (same mode and wire format, its starting node
    count), but the static run's own; and a compressed run's difference from its fp32 twin."""
    runs = mdoc["runs"]
    for res in runs.values():
        res["vs_fp32"] = _vs_fp32(res, runs.get(f"{res['name']}/{res['mode']}"))
        base = runs.get(f"static-{res['start']}/{res['mode']}{_suffix(res)}")
        if base is None or base is res:
            res["delta"] = None
            continue
        pairs = [(a["train_loss"], b["train_loss"]) for a, b in
                 zip(res["epochs"], base["epochs"], strict=True)
                 if a["epoch"] > at and None not in (a["train_loss"], b["train_loss"])]
        at_base = {round(e["epoch"]): e["val_loss"] for e in base["evals"]}
        val = [(e["val_loss"], at_base[round(e["epoch"])]) for e in res["evals"]
               if round(e["epoch"]) > at and round(e["epoch"]) in at_base]
        res["delta"] = {"baseline": f"static-{res['start']}/{res['mode']}", "after_epoch": at,
                        "train_loss": _mean([abs(a - b) for a, b in pairs]),
                        "val_loss": _mean([abs(a - b) for a, b in val])}


def _spread(values: list[float]) -> dict[str, float]:
    return {"mean": statistics.fmean(values), "min": min(values), "max": max(values)}


def bands(mdoc: dict[str, Any], at: int) -> None:
    """Add the band of every static configuration with two or more repeats
    (``mdoc["bands"]``), and each change run's place in its band (``res["band"]``)."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for res in mdoc["runs"].values():
        if res["start"] == res["end"]:
            groups.setdefault(f"static-{res['start']}/{res['mode']}{_suffix(res)}", []).append(res)
    mdoc["bands"] = {}
    for key, runs in groups.items():
        if len(runs) < 2:
            continue
        train = [[e["train_loss"] for e in r["epochs"]] for r in runs]
        val: dict[int, list[float]] = {}
        for r in runs:
            for e in r["evals"]:
                val.setdefault(round(e["epoch"]), []).append(e["val_loss"])
        mdoc["bands"][key] = {
            "repeats": len(runs), "seeds": sorted(r.get("seed", 0) for r in runs),
            "train_loss": [None if None in col else _spread(list(col))
                           for col in zip(*train, strict=True)],
            "val_loss": {k: _spread(v) for k, v in sorted(val.items()) if len(v) == len(runs)},
            "final": {k: _spread([r["final"][k] for r in runs])
                      for k in ("train_loss", "val_loss", "val_acc")
                      if None not in [r["final"][k] for r in runs]}}
    for res in mdoc["runs"].values():
        band = mdoc["bands"].get(f"static-{res['start']}/{res['mode']}{_suffix(res)}")
        res["band"] = None if res["start"] == res["end"] or band is None else {
            "baseline": f"static-{res['start']}/{res['mode']}", "repeats": band["repeats"],
            "train_loss": _placed([(e["train_loss"], b) for e, b in
                                   zip(res["epochs"], band["train_loss"], strict=True)
                                   if e["epoch"] > at and b is not None
                                   and e["train_loss"] is not None]),
            "val_loss": _placed([(e["val_loss"], band["val_loss"][round(e["epoch"])])
                                 for e in res["evals"] if round(e["epoch"]) > at
                                 and round(e["epoch"]) in band["val_loss"]])}


def _placed(pairs: list[tuple[float, dict[str, float]]]) -> dict[str, Any]:
    """Where a run's values sit in a band: how many inside it, their mean distance from its
    mean, and its mean half-width (the noise they are measured against)."""
    return {"inside": sum(b["min"] <= v <= b["max"] for v, b in pairs), "epochs": len(pairs),
            "mean_abs_from_mean": _mean([abs(v - b["mean"]) for v, b in pairs]),
            "mean_half_width": _mean([(b["max"] - b["min"]) / 2 for _, b in pairs])}


def _vs_fp32(res: dict[str, Any], fp32: dict[str, Any] | None) -> dict[str, Any] | None:
    """Final figures minus the fp32 run's, and the mean |per-epoch loss difference|."""
    if fp32 is None or fp32 is res:
        return None
    diff = {k: None if None in (res["final"][k], fp32["final"][k])
            else res["final"][k] - fp32["final"][k] for k in ("train_loss", "val_loss", "val_acc")}
    pairs = [abs(a["train_loss"] - b["train_loss"]) for a, b in
             zip(res["epochs"], fp32["epochs"], strict=True)
             if None not in (a["train_loss"], b["train_loss"])]
    return {"final": diff, "mean_abs_train_loss": _mean(pairs)}


def summary(res: dict[str, Any]) -> str:
    """One line for the progress output."""
    f, ch = res["final"], res["change"]
    where = f", members {ch['members']} from epoch {ch['epoch']} (step {ch['step']})" if ch \
        else ""
    bad = f", {len(res['problems'])} PROBLEMS: {res['problems'][0]}" if res["problems"] else ""
    return (f"final loss {_fmt(f['train_loss'])}, val loss {_fmt(f['val_loss'])}, accuracy "
            f"{_fmt(f['val_acc'], 3)}{where}; {res['wall_s']:.0f} s{bad}")


def _fmt(value: float | None, digits: int = 4) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def table(doc: dict[str, Any]) -> Table:
    """One row per model, run and wire format: final figures, mean |loss - static| and (for a
    compressed format) the final loss and accuracy minus fp32's, in each mode."""
    modes = doc["modes"]
    wires = doc.get("wires", ["fp32"])
    t = Table(title="Convergence under scale-out/scale-in (loss: training, per epoch)")
    t.add_column("model")
    t.add_column("run")
    t.add_column("wire")
    whats = ["final loss", "final acc", "mean |loss - static|", "in band train, val"]
    if wires != ["fp32"]:
        whats += ["loss - fp32", "acc - fp32"]
    for what in whats:
        for mode in modes:
            t.add_column(f"{what}\n{mode}", justify="right")
    for model, mdoc in doc["models"].items():
        names = list(dict.fromkeys(r["name"] for r in mdoc["runs"].values()))
        for wire in wires:
            sfx = "" if wire == "fp32" else f"/{wire}"
            for name in names:
                got = [mdoc["runs"].get(f"{name}/{m}{sfx}") for m in modes]
                if not any(got):
                    continue
                cells = [_fmt(r["final"]["train_loss"]) if r else "" for r in got]
                cells += [_fmt(r["final"]["val_acc"], 3) if r else "" for r in got]
                cells += [_fmt(r["delta"]["train_loss"]) if r and r["delta"] else "-"
                          for r in got]
                cells += [_inside(r.get("band")) if r else "" for r in got]
                if wires != ["fp32"]:
                    vs = [r.get("vs_fp32") if r else None for r in got]
                    cells += [_signed(v["final"]["train_loss"]) if v else "-" for v in vs]
                    cells += [_signed(v["final"]["val_acc"], 3) if v else "-" for v in vs]
                t.add_row(model, name, wire, *cells)
    return t


def _inside(band: dict[str, Any] | None) -> str:
    """``k/n, k/n``: epochs after the change inside the static band (training, validation)."""
    if not band:
        return "-"
    return ", ".join(f"{band[k]['inside']}/{band[k]['epochs']}" for k in ("train_loss", "val_loss"))


def _signed(value: float | None, digits: int = 4) -> str:
    return "-" if value is None else f"{value:+.{digits}f}"


def draw(plt: Any, model: str, mdoc: dict[str, Any]) -> Any:
    """Accuracy and loss against epochs, one line per run and mode."""
    fig, (acc_ax, loss_ax) = plt.subplots(1, 2, figsize=(11, 4))
    colours: dict[str, str] = {}
    for res in mdoc["runs"].values():
        if res["start"] == res["end"] and res["delta"] is not None:
            continue  # a repeat: its line would hide the static run's
        wire = "" if res.get("wire", "fp32") == "fp32" else f" {res['wire']}"
        colour = colours.setdefault(res["name"] + wire, f"C{len(colours) % 10}")
        style = "-" if res["mode"] == "consistent" else "--"
        label = f"{res['name']}{wire} {res['mode']}"
        acc_ax.plot([e["epoch"] for e in res["evals"]], [e["val_acc"] for e in res["evals"]],
                    style, color=colour, label=label)
        ep = [e for e in res["epochs"] if e["train_loss"] is not None]
        loss_ax.plot([e["epoch"] - 0.5 for e in ep], [e["train_loss"] for e in ep], style,
                     color=colour, label=label)
    for key, band in mdoc.get("bands", {}).items():
        name, mode = key.split("/")[:2]
        colour = colours.get(name, "grey")
        pts = [(i + 0.5, b) for i, b in enumerate(band["train_loss"]) if b is not None]
        loss_ax.fill_between([x for x, _ in pts], [b["min"] for _, b in pts],
                             [b["max"] for _, b in pts], color=colour, alpha=0.15,
                             label=f"{name} {mode}: {band['repeats']} seeds")
    for ax, what in ((acc_ax, "validation accuracy"), (loss_ax, "training loss")):
        ax.axvline(mdoc["plan"]["at"], color="grey", linestyle=":")
        ax.set_xlabel("epoch")
        ax.set_ylabel(what)
    loss_ax.set_yscale("log")
    acc_ax.legend(fontsize=7)
    fig.suptitle(f"{model}: scale-out and scale-in at epoch {mdoc['plan']['at']} "
                 "(dashed: plain, solid: consistent mode)")
    return fig
