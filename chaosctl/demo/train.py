"""The demo's second act: the cluster trains a real model while it changes.

Every node runs ``python -m chaos_edge.examples.digits`` (an MLP on scikit-learn's bundled
digits, each node holding its own shard; it ships in the package) through ``chaosctl join``:
the first node bootstraps, the others scale out one by one. Then a link is added and removed,
one node leaves gracefully, and one is killed with -9; the survivors keep training. The act
measures each primitive's delay from the scheduler's events and reads the loss the workers print.
"""

from __future__ import annotations

import importlib.util
import re
import sys
import time
from pathlib import Path
from typing import Any

from chaosctl.client import call_once
from chaosctl.cluster import ClusterError
from chaosctl.demo.script import Script

EXAMPLE = "chaos_edge.examples.digits"  # a module of the package: no checkout needed
ACTIVE_TIMEOUT_S = 90.0
TRAIN_S = 4.0
SURVIVE_TIMEOUT_S = 30.0
LEAVE_TIMEOUT_S = 45.0
LOSS_RE = re.compile(r"step (\d+) loss ([0-9.]+) acc ([0-9.]+)")


def example_command() -> list[str]:
    # The workers run this interpreter, so what it lacks they lack: say so before they crash.
    if importlib.util.find_spec("sklearn") is None:
        raise ClusterError("the training act needs scikit-learn: pip install "
                           "'chaos-edge[examples]' (or run the demo with --no-train)")
    return [sys.executable, "-m", EXAMPLE, "--steps", "1000000", "--log-every", "50"]


def losses(workdir: Path, node: str) -> list[tuple[int, float, float]]:
    """(step, loss, accuracy) lines the node's worker printed."""
    log = workdir / node / "worker.log"
    if not log.exists():
        return []
    return [(int(m[1]), float(m[2]), float(m[3])) for m in LOSS_RE.finditer(log.read_text())]


class TrainingAct:
    """Joins, link changes, a leave and a kill, all while training."""

    def __init__(self, script: Script) -> None:
        self.s = script
        self.c = script.cluster

    def _active(self, node: str) -> bool:
        return self.s.state_of(node) == "active"

    def _step(self, node: str) -> int:
        for row in self.s.view.rows:
            if row.get("id") == node:
                return int(row.get("step") or 0)
        return 0

    def _train(self, seconds: float) -> None:
        self.s.pause(seconds)

    def _event(self, kind: str, node: str, since: float) -> dict[str, Any] | None:
        rows = self.c.events(self.s.view.observer or node, kind, since)
        return next((e for e in reversed(rows) if e.get("node") == node), None)

    def _unlinked(self, live: list[str]) -> tuple[str, str]:
        """Two training nodes with no overlay link between them yet."""
        rows = self.c.query(self.s.view.observer or live[0], "links") or []
        linked = {frozenset((r["a"], r["b"])) for r in rows}
        for i, a in enumerate(live):
            for b in live[i + 1:]:
                if frozenset((a, b)) not in linked:
                    return a, b
        raise ClusterError(f"every pair of {live} is already linked; nothing to add")

    def _not_a_cut_vertex(self, nodes: list[str]) -> str:
        """The last of ``nodes`` whose loss leaves the others connected by overlay links."""
        rows = self.c.query(self.s.view.observer or nodes[0], "links") or []
        edges = {frozenset((r["a"], r["b"])) for r in rows if r.get("state", "up") == "up"}
        for victim in reversed(nodes):
            rest = [n for n in nodes if n != victim]
            seen, todo = {rest[0]}, [rest[0]]
            while todo:
                a = todo.pop()
                for b in rest:
                    if b not in seen and frozenset((a, b)) in edges:
                        seen.add(b)
                        todo.append(b)
            if len(seen) == len(rest):
                return victim
        return nodes[-1]

    def run(self, live: list[str]) -> list[str]:
        """Train on ``live`` nodes; returns the nodes still training at the end."""
        view, cmd = self.s.view, example_command()
        view.narrate(f"training: `chaosctl join -- python -m {EXAMPLE}` on {len(live)} "
                     "nodes, one after the other", style="bold")
        for node in live:
            t0 = time.time()
            call_once(self.c.socket_of(node), "join", {"neighbors": [], "command": cmd},
                      timeout=5.0)
            def joined(node: str = node) -> bool:
                return self._active(node)

            self.s.wait(joined, ACTIVE_TIMEOUT_S, f"{node} to join the training")
            ev = self._event("scale-out", node, t0 - 1)
            how = "bootstrapped the cluster" if ev and ev.get("bootstrap") else (
                f"scaled out in {ev['delay_ms']:.0f} ms ({ev.get('bytes', 0)} bytes from "
                f"{', '.join(ev.get('sources') or [])})" if ev and ev.get("delay_ms") else
                "joined")
            view.narrate(f"{node} {how}", style="green")
        self._train(TRAIN_S)
        a, b = self._unlinked(live)
        for action, kind in (("add", "connect-link"), ("del", "disconnect-link")):
            since = time.time() - 1
            call_once(self.c.socket_of(a), "link", {"action": action, "peer": b}, timeout=10.0)

            def linked(kind: str = kind, since: float = since) -> dict[str, Any] | None:
                return self._event(kind, a, since)

            ev = self.s.wait(linked, 15.0, f"the {kind} event")
            view.narrate(f"link {action} {a}-{b}: new sync policy v{ev.get('policy_version')} "
                         f"in {ev.get('delay_ms') or 0:.2f} ms", style="cyan")
            self._train(TRAIN_S / 2)
        leaver = live[1]
        t0 = time.time()
        call_once(self.c.socket_of(leaver), "leave", timeout=5.0)
        def left() -> dict[str, Any] | None:
            return self._event("scale-in", leaver, t0 - 1)

        # The leave takes effect a few steps ahead; the bound is for a loaded box, not for a
        # stalled round (a new node's agreement once ended its parent's last round, and the
        # scale-in waited out a round timeout: fixed, tests/training/test_join_race.py).
        self.s.wait(left, LEAVE_TIMEOUT_S, "the scale-in")
        view.narrate(f"{leaver} left gracefully (scale-in after its all-reduce)",
                     style="yellow")
        self._train(TRAIN_S / 2)
        # A cut vertex would split the rest into parts, and the losing part rejoins by
        # scale-out (a partition: the tests cover it). The demo shows a plain failure.
        victim = self._not_a_cut_vertex([n for n in live if n != leaver])
        self.s.killed.add(victim)
        t0 = time.time()
        pid = int(((self.c.query(victim, "ping") or {}).get("worker") or {}).get("pid") or 0)
        self.c.kill(victim)
        if pid:
            self.s.kill_worker(pid)
        def failed() -> dict[str, Any] | None:
            return self._event("node-failed", victim, t0 - 1)

        self.s.wait(failed, 30.0, f"{victim} to be declared failed")
        view.narrate(f"kill -9 {victim} while training: detected, scaled in, the others "
                     "rerun the step and go on", style="bold red")
        survivors = [n for n in live if n not in (leaver, victim)]
        before = {n: self._step(n) for n in survivors}
        self._train(TRAIN_S)

        def progressed() -> bool:
            return all(self._step(n) > before[n] for n in survivors)

        # Bounded, not a fixed window: a loaded box may be slow to show the next heartbeat.
        try:
            self.s.wait(progressed, SURVIVE_TIMEOUT_S, "the survivors to train on")
        except ClusterError:
            after = {n: self._step(n) for n in survivors}
            raise ClusterError(f"the survivors {survivors} stopped training "
                               f"(steps {before} -> {after})") from None
        after = {n: self._step(n) for n in survivors}
        view.narrate(f"survivors {', '.join(survivors)} kept training: steps "
                     f"{min(before.values())} -> {min(after.values())}", style="green")
        return survivors
