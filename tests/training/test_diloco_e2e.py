"""Issues 13 and 24: diloco and streaming modes keep the elasticity and the guarantees of
every-step mode.

Real mosquitto, three chaosd and their workers (``_diloco_worker.py``, the same script as in
every-step mode) with ``[training] sync = "diloco"`` and ``inner_steps = 4`` (or
``"streaming"`` with 2 fragments: a round every 2 steps, each syncing half the parameters,
and running while the next step computes).
The cluster goes through a scale-out, a graceful leave and a worker SIGKILLed in the middle of
an outer round (restarted by chaosd, it rejoins). At every outer round that two or more nodes
committed, the synced parameters, the outer momentum, the buffers, the registered objects and
the Trainer's digest are equal on all of them; every outer record's count is
``step // period`` (no outer round lost or applied twice anywhere); each worker's steps
follow one another.
"""

from __future__ import annotations

import functools
import itertools
import json
import sys
from pathlib import Path
from typing import Any

import pytest

from chaosctl.client import call_once
from tests.training._run import PACE_S, Run

pytestmark = pytest.mark.timeout(240)

WORKER = Path(__file__).with_name("_diloco_worker.py")
H = 4
CONFIG = f'[training]\nsync = "diloco"\ninner_steps = {H}\n'
PLAIN_STREAMING = (f'[training]\nsync = "streaming"\ninner_steps = {H}\nfragments = 2\n'
                   f"merge = 0.5\n")
STREAMING = PLAIN_STREAMING + "overlap = true\n"  # each round beside the next step
PERIOD = {CONFIG: H, STREAMING: H // 2, PLAIN_STREAMING: H // 2}  # steps between rounds
Row = dict[str, Any]


def join(r: Run, node: str, *extra: str) -> None:
    argv = [sys.executable, str(WORKER), "--out", str(r.out / f"{node}.jsonl"),
            "--sleep", str(PACE_S), *extra]
    call_once(r.c.socket_of(node), "join", {"neighbors": [], "command": argv}, timeout=5)


def outer_rows(r: Run, node: str) -> list[Row]:
    return [row for row in r.records(node) if "outer" in row]


def assert_outer_identical(r: Run, nodes: list[str], period: int = H,
                           skip: tuple[str, ...] = ()) -> int:
    """Every part of the outer state (but ``skip``) is equal on the nodes that committed an
    outer round; returns how many outer rounds two or more nodes committed."""
    table: dict[int, dict[str, Row]] = {}
    for node in nodes:
        for row in outer_rows(r, node):
            table.setdefault(row["step"], {})[node] = row["outer"]
    shared, bad = 0, []
    for step, rows in sorted(table.items()):
        for node, o in rows.items():
            assert o["count"] == step // period, (
                f"{node} at step {step} has applied {o['count']} outer rounds, not "
                f"{step // period}")
        if len(rows) < 2:
            continue
        shared += 1
        for part in next(iter(rows.values())):
            if part in skip:
                continue
            seen = {n: o[part] for n, o in sorted(rows.items())}
            if len({json.dumps(v) for v in seen.values()}) > 1:
                bad.append(f"step {step}: {part} differs: {seen}")
    assert not bad, f"{len(bad)} differences; the first:\n" + "\n".join(bad[:10])
    return shared


def assert_steps_follow(r: Run, node: str) -> None:
    """Within one worker, steps go up by one, but for a rejoin's jump (at most one)."""
    rows = r.records(node)
    for pid, group in itertools.groupby(rows, key=lambda row: row["pid"]):
        steps = [row["step"] for row in group]
        jumps = [(a, b) for a, b in itertools.pairwise(steps) if b != a + 1]
        assert len(jumps) <= 1 and all(b > a for a, b in jumps), (
            f"{node} (pid {pid}) skipped or repeated steps: {jumps}")


def kill_in_a_round(r: Run, node: str) -> Path:
    """SIGKILL ``node``'s worker (started with ``--die-in-outer``) in its next outer round,
    and wait until chaosd has restarted it and it trains again; returns the marker file."""
    killed = r.out / f"{node}.jsonl.killed"
    (r.out / f"{node}.jsonl.arm").write_text("now")
    r.c.wait(killed.exists, 30, f"{node}'s worker killed in an outer round")
    dead_pid = int(killed.read_text().split()[0])
    # chaosd restarts it; it rejoins and trains on.
    r.c.wait(lambda: any(row["pid"] != dead_pid for row in r.records(node)[-3:]), 60,
             f"{node} back")
    return killed


@pytest.mark.parametrize("config", [CONFIG, STREAMING], ids=["diloco", "streaming"])
def test_diloco_through_join_leave_and_kill_in_an_outer_round(run: Any, config: str) -> None:
    period = PERIOD[config]
    r = run(3, config)
    n1, n2, n3 = r.c.node_ids
    for node in (n1, n2):
        join(r, node)
        r.c.wait(functools.partial(r.active, [node]), 60, f"{node} active")
    r.advance([n1, n2], 3 * H)
    join(r, n3, "--die-in-outer")  # scale-out while the others train
    r.c.wait(lambda: r.active([n1, n2, n3]), 60, f"{n3} active")
    r.advance([n1, n2, n3], 3 * H)
    assert call_once(r.c.socket_of(n2), "leave", timeout=5)["state"] == "leaving"
    r.c.wait(lambda: [e for e in r.events("scale-in")
                      if e.get("node") == n2 and e.get("reason") == "leave"], 30,
             f"{n2}'s scale-in")
    r.advance([n1, n3], 2 * H)
    killed = kill_in_a_round(r, n3)
    r.advance([n1, n3], 3 * H)

    # Streaming keeps a merge share of each member's own values; with overlap a round is
    # recorded after the next step's forward pass, which moved each member's live buffers
    # (the agreed ones are in the Trainer's digest).
    skip = {CONFIG: (), STREAMING: ("params", "buffers")}[config]
    shared = assert_outer_identical(r, [n1, n2, n3], period, skip)
    assert shared >= 8, f"only {shared} outer rounds were committed by two or more nodes"
    for node in (n1, n2, n3):
        assert_steps_follow(r, node)
    assert not r.events("state-diverged"), r.events("state-diverged")
    for node in (n1, n2, n3):
        path = r.out / f"{node}.jsonl.errors"
        assert not path.exists(), path.read_text()
    # The kill happened in the middle of an outer round, and n1 committed that round once.
    kill_step = int(killed.read_text().split()[-1])
    assert kill_step % period == 0
    n1_steps = [row["step"] for row in outer_rows(r, n1)]
    landed = kill_step + (config == STREAMING)  # overlap: recorded once it landed, a step on
    assert n1_steps.count(landed) == 1, f"{n1} committed outer round {kill_step} " \
        f"{n1_steps.count(landed)} times"
    # A joiner starts from the synced parameters: n3's first outer step matches n1's.
    assert r.records(n3)[0]["step"] > 3 * H


def test_streaming_pseudo_gradients_travel_in_the_clusters_wire_format(
        run: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``[training] wire`` applies to the pseudo-gradients (here of streaming's fragments,
    each with its own int8 error feedback): with int8 on the wire, the outer state is still
    equal on every member at every outer round (the same decoded average on all of them),
    and no outer round is lost or applied twice. With ``overlap`` the rounds run while the
    script computes: each one in flight starts its all-reduce only after the ``update()``
    that began it has returned (the worker's ``--check-overlap``)."""
    monkeypatch.setenv("CHAOS_WORKER_LOG", "INFO")  # the worker says which format it uses
    r = run(2, STREAMING + 'wire = "int8"\n')
    for node in r.c.node_ids:
        join(r, node, "--check-overlap")
        r.c.wait(functools.partial(r.active, [node]), 60, f"{node} active")
    r.advance(r.c.node_ids, 4 * H)
    assert assert_outer_identical(r, r.c.node_ids, PERIOD[STREAMING],
                                  ("params", "buffers")) >= 6
    for node in r.c.node_ids:
        assert not (r.out / f"{node}.jsonl.overlap-violations").exists()
        # Most rounds ran in flight (the guard's and a join's run in update()).
        assert r.records(node)[-1]["in_flight"] >= 4, r.records(node)[-1]
    logs = [p.read_text(errors="replace") for p in tmp_path.rglob("worker.log")]
    assert len(logs) == 2 and all("rounds travel as int8" in text for text in logs)


def set_policy(r: Run, node: str, **args: Any) -> None:
    """``chaosctl policy set`` on ``node``, and the ``policy-changed`` event it makes."""
    before = len(r.events("policy-changed"))
    call_once(r.c.socket_of(node), "policy", args, timeout=10)
    r.c.wait(lambda: len(r.events("policy-changed")) > before, 30, f"policy {args} published")


def in_mode(r: Run, nodes: list[str], mode: str) -> bool:
    """Whether every node has committed a round in ``mode``."""
    return all(any(row.get("round", {}).get("mode") == mode for row in r.records(n)[-20:])
               for n in nodes)


def test_the_sync_mode_switches_twice_through_a_join_and_a_kill(run: Any) -> None:
    """Issue 24: the cluster starts in every-step sync; the operator switches it to streaming
    DiLoCo (2 fragments, overlap) while two nodes train; a third joins in that mode and its
    worker is killed in a round (chaosd restarts it, it rejoins); then it switches to
    every-step again. Every round that two or more nodes committed at the same step left them
    with the same state digest (mode and anchor included); each worker's rounds and steps
    follow one another, so no step or round is lost or doubled across a switch; every node
    switched at the same step."""
    r = run(3, "")
    n1, n2, n3 = r.c.node_ids
    for node in (n1, n2):
        join(r, node, "--rounds")
        r.c.wait(functools.partial(r.active, [node]), 60, f"{node} active")
    r.advance([n1, n2], 10)
    set_policy(r, n2, sync="streaming", inner_steps=H, fragments=2, overlap="on")
    r.c.wait(lambda: in_mode(r, [n1, n2], "streaming"), 60, "streaming rounds")
    r.advance([n1, n2], 2 * H)
    join(r, n3, "--rounds", "--die-in-outer")  # a scale-out in streaming mode
    r.c.wait(lambda: r.active([n1, n2, n3]), 60, f"{n3} active")
    r.advance([n1, n2, n3], 2 * H)
    kill_in_a_round(r, n3)
    r.advance([n1, n2, n3], 2 * H)
    set_policy(r, n1, sync="every-step")
    r.c.wait(lambda: in_mode(r, [n1, n2, n3], "every-step"), 60, "every-step again")
    r.advance([n1, n2, n3], 10)

    table: dict[int, dict[str, dict[str, Any]]] = {}
    anchors: dict[str, set[tuple[str, int]]] = {}
    for node in (n1, n2, n3):
        assert_steps_follow(r, node)
        rows = r.records(node)
        for pid, group in itertools.groupby(rows, key=lambda row: row["pid"]):
            rounds = [row["round"]["n"] for row in group if "round" in row]
            gaps = [(a, b) for a, b in itertools.pairwise(rounds) if b != a + 1]
            assert len(gaps) <= 1 and all(b > a for a, b in gaps), (
                f"{node} (pid {pid}) skipped or repeated rounds: {gaps}")
        for row in rows:
            if "round" in row:
                table.setdefault(row["step"], {})[node] = row["round"]
                anchors.setdefault(node, set()).add((row["round"]["mode"],
                                                     row["round"]["anchor"]))
    shared, bad = 0, []
    for step, seen in sorted(table.items()):
        if len(seen) > 1:
            shared += 1
            if len({json.dumps(v, sort_keys=True) for v in seen.values()}) > 1:
                bad.append(f"step {step}: {seen}")
    assert not bad, f"{len(bad)} rounds differ; the first:\n" + "\n".join(bad[:5])
    assert shared >= 20, f"only {shared} rounds were committed by two or more nodes"
    # One switch into streaming and one back, at the same step on every node that saw it.
    streaming = {a for node in (n1, n2) for m, a in anchors[node] if m == "streaming"}
    back = {a for node in (n1, n2, n3) for m, a in anchors[node] if m == "every-step" and a}
    assert len(streaming) == 1 and len(back) == 1, anchors
    assert streaming.pop() < back.pop()
    assert {m for m, _ in anchors[n3]} >= {"streaming", "every-step"}
    changes = r.events("policy-changed")
    assert [e["sync"] for e in changes] == ["streaming", "every-step"], changes
    assert not r.events("state-diverged"), r.events("state-diverged")
    for node in (n1, n2, n3):
        path = r.out / f"{node}.jsonl.errors"
        assert not path.exists(), path.read_text()
