"""Issue 9: real training scripts stay bit-identical, their whole state included.

Real mosquitto, chaosd and workers. The worker (``_full_worker.py``) is what a PyTorch user
writes: a CNN with BatchNorm and Dropout, AdamW, a OneCycleLR and a counter registered in
``state=``, a GradScaler, gradient clipping, autocast, and data chosen through
``trainer.shard``. Per committed step it records a digest of each part of its state. At every
step that two or more nodes committed, every part must be equal on all of them (a failure
names the step and the part); each node's steps follow one another; the lr is the schedule's
at that step and the counter counts the global batches.

The scenarios: scale-out, graceful leave and kill -9; a box frozen with SIGSTOP (no TCP
reset) and thawed; the divergence guard finding a silently corrupted node and re-replicating
it; joiners whose model or scheduler do not fit, refused with one line; and state that cannot
be serialised, refused when the Trainer is made.
"""

from __future__ import annotations

import functools
import itertools
import json
import os
import signal
import statistics
import sys
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from chaosctl.client import call_once
from tests.training._full_worker import build
from tests.training._run import PACE_S, Run

pytestmark = pytest.mark.timeout(180)

WORKER = Path(__file__).with_name("_full_worker.py")
STEPS = 3000  # the schedule's length; the tests stop long before
GLOBAL_BATCH = 48  # the worker's default --global-batch
PARTS = ("params", "buffers", "optim", "sched", "scaler", "lr", "pos", "digest")
Row = dict[str, Any]
Keep = Callable[[str, Row], bool]


def join(r: Run, node: str, *extra: str, digest_every: int = 10) -> None:
    """Start the full worker on ``node`` through chaosd's ``join`` (as ``chaosctl join``)."""
    argv = [sys.executable, str(WORKER), "--out", str(r.out / f"{node}.jsonl"),
            "--steps", str(STEPS), "--sleep", str(PACE_S), "--digest-every", str(digest_every),
            *extra]
    call_once(r.c.socket_of(node), "join", {"neighbors": [], "command": argv}, timeout=5)


def start(r: Run, nodes: list[str], digest_every: int = 10) -> None:
    r.join_all(nodes, start=functools.partial(join, r, digest_every=digest_every))


def last_seq(r: Run) -> int:
    return max((e["seq"] for e in r.c.query(r.c.node_ids[0], "events") or []), default=0)


def events(r: Run, kind: str, node: str, after: int = 0) -> list[Row]:
    """``kind`` events naming ``node`` recorded after event ``after``."""
    return [e for e in r.events(kind) if e.get("node") == node and e["seq"] > after]


def dropped(r: Run, node: str, after: int) -> bool:
    """Whether the scheduler dropped ``node`` after event ``after``: a scale-in, or the losing
    side of a partition (a neighbour's link to it may fail before its daemon reports it)."""
    parts = [e for e in r.events("partition") if e["seq"] > after]
    return bool(events(r, "scale-in", node, after) or events(r, "node-failed", node, after)
                or any(node not in e["kept"] for e in parts))


def assert_sources_agreed(r: Run) -> None:
    """No joiner found its sources offering different states for one step: members are
    bit-identical, so every source of a scale-out must offer the same bytes."""
    for node in r.c.node_ids:
        log = r.c.workdir / node / "worker.log"
        lines = log.read_text().splitlines() if log.exists() else []
        bad = [x for x in lines if "offer another state" in x]
        assert not bad, f"{node}'s worker: " + "\n".join(bad)


def assert_no_divergence(r: Run) -> None:
    """The guard found nothing: every member's state was identical at every step."""
    found = [(e["node"], e.get("step"), e.get("digest", "")[:16], e.get("majority", "")[:16])
             for e in r.events("state-diverged")]
    assert not found, f"state-diverged events (node, step, digest, majority): {found}"


def errors(r: Run, node: str) -> list[Row]:
    """The ChaosErrors ``node``'s workers ended with (one JSON line each)."""
    path = r.out / f"{node}.jsonl.errors"
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


@functools.cache
def _schedule() -> tuple[Any, Any, list[list[float]]]:
    """A fresh copy of the schedule, and the lrs it has given so far (index: steps taken)."""
    _, opt, sched = build(8, "onecycle", STEPS)
    return opt, sched, [[g["lr"] for g in opt.param_groups]]


def reference_lr(step: int) -> list[float]:
    """The lr of each group after ``step`` scheduler steps. One schedule, stepped on as far as
    asked: replayed from 0 for each row, the check cost O(steps²) and, on a loaded box whose
    nodes had trained some thousand steps, outlasted the test's timeout."""
    opt, sched, table = _schedule()
    with warnings.catch_warnings():  # "scheduler stepped before the optimizer"
        warnings.simplefilter("ignore")
        while len(table) <= step:
            sched.step()
            table.append([g["lr"] for g in opt.param_groups])
    return table[step]


def differences(r: Run, nodes: list[str], keep: Keep | None = None) -> tuple[list[str], int]:
    """Every (step, part) that differs between the nodes that committed the step, and how
    many steps two or more of them committed."""
    table: dict[int, dict[str, Row]] = {}
    for node in nodes:
        for row in r.records(node):
            if keep is None or keep(node, row):
                table.setdefault(row["step"], {})[node] = row
    bad, shared = [], 0
    for step, rows in sorted(table.items()):
        if len(rows) < 2:
            continue
        shared += 1
        for part in PARTS:
            seen = {n: row[part] for n, row in sorted(rows.items())}
            if len({json.dumps(v) for v in seen.values()}) > 1:
                bad.append(f"step {step}: {part} differs: {seen}")
    return bad, shared


def assert_identical(r: Run, nodes: list[str], keep: Keep | None = None,
                     at_least: int = 20) -> None:
    bad, shared = differences(r, nodes, keep)
    assert not bad, f"{len(bad)} differences; the first:\n" + "\n".join(bad[:12])
    assert shared >= at_least, f"only {shared} steps committed by two or more of {nodes}"


def assert_rows(r: Run, node: str, rejoins: int = 0, keep: Keep | None = None) -> None:
    """``node``'s steps increase by one, but for at most ``rejoins`` jumps within one worker
    (a rejoin restores a later step) and at worker restarts; the lr is the schedule's and the
    counter counts global batches at every step; its shards tile the global batch."""
    rows = [row for row in r.records(node) if keep is None or keep(node, row)]
    assert rows, f"{node} committed no step"
    jumps = []
    for a, b in itertools.pairwise(rows):
        assert b["step"] > a["step"], f"{node}: step {b['step']} after {a['step']}"
        if b["step"] != a["step"] + 1 and a["pid"] == b["pid"]:
            jumps.append((a["step"], b["step"]))
    assert len(jumps) <= rejoins, f"{node} skipped steps without a rejoin: {jumps}"
    for row in rows:
        assert row["lr"] == reference_lr(row["step"]), (
            f"{node} step {row['step']}: lr {row['lr']}, the schedule's "
            f"{reference_lr(row['step'])}")
        assert row["pos"] == row["step"] * GLOBAL_BATCH, (
            f"{node} step {row['step']}: counter {row['pos']}, expected "
            f"{row['step'] * GLOBAL_BATCH}")
        assert node in row["members"], f"{node} step {row['step']}: not in {row['members']}"


def assert_shards_tile(r: Run, nodes: list[str]) -> int:
    """Where every member of a step recorded it with the same member list, their shards are
    disjoint and cover the global batch exactly; returns how many steps were checked.

    A row whose shard was read for another step is left out: its ``update()`` found the node
    outside the cluster (thawed from a freeze), rejoined and took part in the next round with
    no samples, since its gradient was of a state it no longer held."""
    table: dict[int, dict[str, Row]] = {}
    for node in nodes:
        for row in r.records(node):
            if row["shard"]["step"] == row["step"]:
                table.setdefault(row["step"], {})[node] = row
    checked = 0
    for step, rows in table.items():
        lists = {tuple(row["members"]) for row in rows.values()}
        if len(lists) != 1 or set(next(iter(lists))) != set(rows):
            continue
        spans = sorted((row["shard"]["start"], row["shard"]["size"]) for row in rows.values())
        assert all(row["shard"]["global_batch"] == GLOBAL_BATCH for row in rows.values())
        ends = [0] + [s + n for s, n in spans]
        assert [s for s, _ in spans] == ends[:-1] and ends[-1] == GLOBAL_BATCH, (
            f"step {step}: shards {spans} do not tile the global batch {GLOBAL_BATCH}")
        checked += 1
    assert checked, "no step had all its members' records"
    return checked


@pytest.mark.timeout(300)  # two tests' worth of faults: a hang guard, not a bound
def test_whole_state_through_scale_out_leave_kill9_and_a_frozen_box(run: Any) -> None:
    r = run(4)
    n1, n2, n3, n4 = r.c.node_ids
    start(r, [n1, n2, n3])
    r.advance([n1, n2, n3], 15)
    join(r, n4)  # scale-out while the others train
    r.c.wait(lambda: r.active([n1, n2, n3, n4]), 60, f"{n4} active")
    r.advance([n1, n2, n3, n4], 15)
    assert call_once(r.c.socket_of(n2), "leave", timeout=5)["state"] == "leaving"
    r.c.wait(lambda: [e for e in events(r, "scale-in", n2) if e["reason"] == "leave"], 30,
             f"{n2}'s scale-in")
    r.advance([n1, n3, n4], 15)
    mark, pid = last_seq(r), r.worker_pid(n4)
    assert pid, f"{n4} reported no worker"
    os.killpg(pid, signal.SIGKILL)  # the worker's process group; chaosd restarts it
    r.c.wait(lambda: dropped(r, n4, mark), 20, f"{n4}'s worker dropped")
    r.advance([n1, n3], 10)
    r.c.wait(lambda: events(r, "scale-out", n4, mark), 60, f"{n4} back by scale-out")
    r.c.wait(lambda: r.active([n1, n3, n4]), 60, f"{n4} active again")
    r.advance([n1, n3, n4], 15)
    # Then a box frozen whole (daemon and worker: a power cut sends no TCP reset) until it is
    # declared failed. Thawed, it is no longer a member: it rejoins by scale-out and restores
    # the cluster's state in place (its scheduler, scaler and counter included). One cluster
    # for both: the frozen box had a test and a cluster of its own, 22 CPU-s of the suite.
    mark = last_seq(r)
    r.signal_node(n3, signal.SIGSTOP)
    try:
        r.c.wait(lambda: events(r, "node-failed", n3, mark), 60, f"{n3} declared failed")
        r.advance([n1, n4], 15)
    finally:
        r.signal_node(n3, signal.SIGCONT)
    r.c.wait(lambda: events(r, "scale-out", n3, mark), 60, f"{n3} back by scale-out")
    r.c.wait(lambda: r.active([n1, n3, n4]), 60, f"{n3} active again")
    r.advance([n1, n3, n4], 15)

    assert_identical(r, r.c.node_ids)
    for node, rejoins in ((n1, 0), (n2, 0), (n3, 1), (n4, 0)):
        assert_rows(r, node, rejoins)
    assert_shards_tile(r, r.c.node_ids)
    assert len({row["pid"] for row in r.records(n4)}) == 2, "n4 restarted once"
    assert len({row["pid"] for row in r.records(n3)}) == 1, "n3 rejoined in the same worker"
    assert_no_divergence(r)
    assert not any(errors(r, n) for n in r.c.node_ids), {n: errors(r, n) for n in r.c.node_ids}
    assert_sources_agreed(r)


@pytest.mark.timeout(300)  # two tests' worth of joins: a hang guard, not a bound
def test_joiners_that_do_not_fit_are_refused_and_a_slow_one_gets_fewer_samples(
        run: Any) -> None:
    """Two joiners that do not fit (another model shape, another scheduler type, asking at the
    same time) are refused in one line and never restarted, while the members train on; then
    consistent mode end to end: a joiner that takes 5 ms more per sample ends up with a much
    smaller share of the global batch, the shares still tile it exactly, and the members stay
    identical. (Two tests until stop 63, each on a cluster of its own.)"""
    r = run(5)
    n1, n2, n3, n4, n5 = r.c.node_ids
    start(r, [n1, n2])
    r.advance([n1, n2], 15)
    join(r, n4, "--width", "12")  # another model shape
    join(r, n5, "--sched", "cosine")  # another scheduler type, asking at the same time
    wait_refused(r, n4, ("conv", "bn2", "fc1", "shape"))
    wait_refused(r, n5, ("sched", "OneCycleLR", "CosineAnnealingLR"))
    r.advance([n1, n2], 15)
    assert not r.records(n4) and not r.records(n5), "a refused joiner committed a step"
    for node in (n4, n5):  # refused for good: chaosd did not restart the script meanwhile
        worker = (r.c.query(node, "ping") or {}).get("worker") or {}
        assert worker.get("restarts") == 0 and worker.get("pid") is None, worker
    assert not r.active([n4]) and not r.active([n5])
    assert_identical(r, [n1, n2])

    join(r, n3, "--sleep-per-sample", "0.005")
    r.c.wait(functools.partial(r.active, [n3]), 60, f"{n3} active")
    members = [n1, n2, n3]
    r.advance(members, 40, timeout=120)
    rows = {n: {x["step"]: x["shard"]["size"] for x in r.records(n)} for n in members}
    steps = sorted(set(rows[n1]) & set(rows[n2]) & set(rows[n3]))[-15:]
    assert len(steps) >= 10, f"only {len(steps)} common steps"
    slow = statistics.median(rows[n3][s] for s in steps)
    fast = min(statistics.median(rows[n][s] for s in steps) for n in (n1, n2))
    assert slow * 2 < fast, f"slow box's median share {slow}, the fast ones' {fast}"
    assert all(rows[n1][s] + rows[n2][s] + rows[n3][s] == GLOBAL_BATCH for s in steps)
    assert assert_shards_tile(r, members) >= 10
    assert_identical(r, members)
    assert_no_divergence(r)
    for node in (n1, n2):
        assert_rows(r, node)


def test_divergence_guard_re_replicates_a_corrupted_node(run: Any) -> None:
    r = run(3)
    n1, n2, n3 = r.c.node_ids
    for node in (n1, n2):
        join(r, node, digest_every=5)
        r.c.wait(functools.partial(r.active, [node]), 60, f"{node} active")
    join(r, n3, "--corrupt-after", "20", digest_every=5)
    r.c.wait(lambda: r.active(r.c.node_ids), 60, f"{n3} active")
    hit = r.c.wait(lambda: [x for x in r.records(n3) if x["corrupted"]], 60,
                   f"{n3} to corrupt its state")[0]
    bad = hit["step"]
    ev = r.c.wait(lambda: events(r, "state-diverged", n3), 30, "a state-diverged event")[0]
    assert bad <= ev["step"] <= bad + 10, f"corrupted at {bad}, found at {ev['step']}"
    assert ev["digest"] != ev["majority"], ev
    out = r.c.wait(lambda: [e for e in events(r, "scale-in", n3)
                            if e["reason"] == "state-diverged"], 30, f"{n3} dropped")[0]
    back = r.c.wait(lambda: events(r, "scale-out", n3, out["seq"]), 60,
                    f"{n3} re-replicated by scale-out")[0]
    r.c.wait(lambda: r.active(r.c.node_ids), 60, f"{n3} active again")
    r.advance(r.c.node_ids, 15)

    rows = {n: {x["step"]: x for x in r.records(n)} for n in r.c.node_ids}
    # The event names the digests the nodes had at that step.
    if ev["step"] in rows[n1]:
        assert ev["majority"] == rows[n1][ev["step"]]["digest"], (ev, rows[n1][ev["step"]])
    if ev["step"] in rows[n3]:
        assert ev["digest"] == rows[n3][ev["step"]]["digest"], (ev, rows[n3][ev["step"]])
    assert rows[n3][bad]["params"] != rows[n1][bad]["params"], "the corruption took no effect"
    assert not [e for e in r.events("state-diverged") if e["node"] != n3]
    # Identical before the corruption and after the rejoin; the majority throughout.
    version = back["policy_version"]

    def healthy(node: str, row: Row) -> bool:
        return node != n3 or row["step"] < bad or row["policy_version"] >= version

    assert_identical(r, r.c.node_ids, healthy)
    before = [s for s in rows[n3] if s < bad and s in rows[n1]]
    after = [x["step"] for x in r.records(n3) if x["policy_version"] >= version]
    assert len(before) >= 10 and len(after) >= 10, (
        f"{n3} shared {len(before)} steps before the corruption, {len(after)} after its rejoin")
    for node in (n1, n2):
        assert_rows(r, node)
    assert_rows(r, n3, rejoins=1, keep=healthy)
    assert {e["error"] for e in errors(r, n3)} <= {"StateDiverged"}, errors(r, n3)
    assert not errors(r, n1) and not errors(r, n2)
    assert_sources_agreed(r)


def wait_refused(r: Run, node: str, names: tuple[str, ...]) -> str:
    """Wait until ``node``'s worker is refused with a StateMismatch, exits, is scaled in with
    reason ``state-refused`` and is not restarted; the message is one line naming one of
    ``names``. Returns it."""
    err = r.c.wait(lambda: errors(r, node), 60, f"{node}'s worker to be refused")[0]
    assert err["error"] == "StateMismatch", err
    msg = err["message"]
    assert "\n" not in msg and any(n in msg for n in names), msg
    log = (r.c.workdir / node / "worker.log").read_text()
    assert f"StateMismatch: {msg}" in log, log[-2000:]
    r.c.wait(lambda: [e for e in events(r, "scale-in", node) if e["reason"] == "state-refused"],
             30, f"{node} to be scaled in as refused")
    worker = (r.c.query(node, "ping") or {}).get("worker") or {}
    assert worker.get("refused") == msg and worker.get("restarts") == 0, worker
    return msg


class _Sampler:
    """A sampler whose state holds a function: no JSON, no tensor."""

    def state_dict(self) -> dict[str, Any]:
        return {"seed": 1, "key_fn": lambda i: i}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass


@pytest.mark.timeout(60)
@pytest.mark.parametrize("state, names", [
    ({"sampler": _Sampler()}, ("sampler", "key_fn")),
    ({"counters": {"pos": 0, "rows": (i for i in range(3))}}, ("counters", "rows")),
], ids=["lambda-in-state-dict", "generator-in-json"])
def test_unserialisable_state_is_refused_when_the_trainer_is_made(
        tmp_path: Path, state: dict[str, Any], names: tuple[str, ...]) -> None:
    from chaos_edge import Trainer, UnserialisableState

    model = torch.nn.Linear(2, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    # No chaosd at this socket: the state must be refused before anything is attached.
    with pytest.raises(UnserialisableState) as info:
        Trainer(model, opt, state=state, socket=tmp_path / "no-daemon.sock")
    msg = str(info.value)
    assert "\n" not in msg and all(n in msg for n in names), msg
