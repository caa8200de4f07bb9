"""Scripted chaos on the testbed: a TOML file of timed events, run, then invariants checked.

A scenario names a testbed, a training command and a timeline::

    name = "cut-and-heal"
    duration_s = 30                 # how long the timeline runs once training is up
    [testbed]
    nodes = 4
    topology = "ring"               # line | ring | star | full | random
    bw = "100-1000"                 # Mbit/s, drawn per link
    seed = 1
    [training]
    # {out} is this node's record file, {node} its name. The worker must append one JSON
    # line per committed step: {"step", "digest", "loss"} (tests/training/_worker.py does).
    command = ["python", "tests/training/_worker.py", "--out", "{out}", "--sleep", "0.02"]
    start = ["n1", "n2", "n3"]      # joined in this order before the clock starts
    [[events]]
    at = 5
    action = "cut"                  # join leave kill9 sigstop sigcont cut heal shape
    a = "n1"                        #   broker-restart
    b = "n2"

At the end the run checks that (1) every two nodes that committed the same step hold the
same state digest, (2) no step was applied twice on a node and the cluster's committed steps
have no gap, (3) the loss fell, and (4) the surviving daemons agree on one scheduler. It
writes ``scenario.json`` and returns the failed checks (an empty list means success).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from chaosctl.client import ControlFailure, CtlUsageError, call_once
from chaosctl.testbed.core import Testbed
from chaosctl.testbed.state import TestbedError
from chaosctl.testbed.topo import TopologyError, parse_bw

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

ACTIONS = {
    "join": ("node",), "leave": ("node",), "kill9": ("node",), "sigstop": ("node",),
    "sigcont": ("node",), "cut": ("a", "b"), "heal": ("a", "b"), "shape": ("a", "b", "mbit"),
    "broker-restart": (),
}
ACTIVE_WAIT_S = 90.0


class ScenarioError(CtlUsageError):
    """The scenario file is invalid; the message names the key."""


@dataclass(frozen=True)
class Event:
    at: float
    action: str
    args: dict[str, Any]


@dataclass
class Scenario:
    name: str
    duration_s: float
    testbed: dict[str, Any]
    command: list[str]
    start: list[str]
    events: list[Event] = field(default_factory=list)


def _need(doc: dict[str, Any], key: str, kind: type | tuple[type, ...], where: str) -> Any:
    if key not in doc:
        raise ScenarioError(f"scenario: missing '{where}{key}'")
    value = doc[key]
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
        raise ScenarioError(f"scenario: '{where}{key}' has the wrong type ({value!r})")
    return value


def load(path: str | Path) -> Scenario:
    """Parse and validate a scenario file (raises :class:`ScenarioError`)."""
    try:
        doc = tomllib.loads(Path(path).read_text())
    except FileNotFoundError:
        raise ScenarioError(f"scenario: {path} not found") from None
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ScenarioError(f"scenario: {path} is not valid TOML: {exc}") from None
    tb = _need(doc, "testbed", dict, "")
    nodes = _need(tb, "nodes", int, "testbed.")
    names = {f"n{i}" for i in range(1, nodes + 1)}
    try:
        parse_bw(str(tb.get("bw", "100-1000")))
    except TopologyError as exc:
        raise ScenarioError(f"scenario: 'testbed.bw': {exc}") from None
    if not isinstance(tb.get("config", ""), str):
        raise ScenarioError("scenario: 'testbed.config' must be a string of chaosd.toml text")
    tr = _need(doc, "training", dict, "")
    command = _need(tr, "command", list, "training.")
    start = _need(tr, "start", list, "training.")
    if not command or not all(isinstance(a, str) for a in command):
        raise ScenarioError("scenario: 'training.command' must be a non-empty list of strings")
    for node in start:
        if node not in names:
            raise ScenarioError(f"scenario: 'training.start' names {node!r}, not a testbed node")
    events = []
    for i, ev in enumerate(doc.get("events", [])):
        where = f"events[{i}]."
        action = _need(ev, "action", str, where)
        if action not in ACTIONS:
            raise ScenarioError(f"scenario: '{where}action' {action!r} is not one of "
                                f"{', '.join(ACTIONS)}")
        at = float(_need(ev, "at", (int, float), where))
        args = {}
        for key in ACTIONS[action]:
            args[key] = _need(ev, key, (int, float) if key == "mbit" else str, where)
            if key in ("node", "a", "b") and args[key] not in names:
                raise ScenarioError(f"scenario: '{where}{key}' {args[key]!r} is not a node")
        events.append(Event(at, action, args))
    duration = float(_need(doc, "duration_s", (int, float), ""))
    if duration <= 0 or any(ev.at > duration or ev.at < 0 for ev in events):
        raise ScenarioError("scenario: every event's 'at' must lie in [0, duration_s]")
    return Scenario(str(doc.get("name", Path(path).stem)), duration, tb, command,
                    list(start), sorted(events, key=lambda e: e.at))


def _records(out: Path, node: str) -> list[dict[str, Any]]:
    path = out / f"{node}.jsonl"
    rows: list[dict[str, Any]] = []
    if path.exists():
        for line in path.read_text().splitlines():
            with contextlib.suppress(ValueError):
                rows.append(json.loads(line))
    return rows


def check(records: dict[str, list[dict[str, Any]]]) -> list[str]:
    """The invariants over the workers' step records; returns the failures."""
    failures = []
    by_step: dict[int, set[str]] = {}
    for node, rows in records.items():
        steps = [r["step"] for r in rows]
        twice = [s for a, s in itertools.pairwise(steps) if s <= a]
        if twice:
            failures.append(f"{node} applied step {twice[0]} again (or went back)")
        for r in rows:
            by_step.setdefault(r["step"], set()).add(r["digest"])
    diverged = sorted(s for s, d in by_step.items() if len(d) > 1)
    if diverged:
        failures.append(f"state diverged at {len(diverged)} steps, first {diverged[0]}")
    if not by_step:
        return [*failures, "no step was committed"]
    lost = [s for s in range(min(by_step), max(by_step) + 1) if s not in by_step]
    if lost:
        failures.append(f"{len(lost)} steps were committed by no node, first {lost[0]}")
    longest = max(records.values(), key=len)
    k = max(1, len(longest) // 5)
    first = sum(r["loss"] for r in longest[:k]) / k
    last = sum(r["loss"] for r in longest[-k:]) / k
    if len(longest) < 10 or not last < first:
        failures.append(f"the loss did not fall ({first:.4f} -> {last:.4f} over "
                        f"{len(longest)} steps)")
    return failures


class Runner:
    """Runs one scenario on a fresh testbed in ``directory``."""

    def __init__(self, sc: Scenario, directory: Path, say: Callable[[str], None],
                 run_id: str | None = None) -> None:
        self.sc = sc
        self.run_id = run_id
        self.dir = directory
        self.out = directory / "records"
        self.say = say
        self.log: list[dict[str, Any]] = []

    def _command(self, node: str) -> list[str]:
        out = str(self.out / f"{node}.jsonl")
        argv = []
        for i, arg in enumerate(self.sc.command):
            if i == 0 and arg in ("python", "python3"):
                arg = sys.executable  # the interpreter chaosctl runs on, with chaos installed
            elif not arg.startswith("-") and Path(arg).exists():
                arg = str(Path(arg).resolve())  # the daemon's working directory differs
            argv.append(arg.replace("{out}", out).replace("{node}", node))
        return argv

    def _member(self, tb: Testbed, node: str) -> bool:
        rows = tb.query(tb.nodes[0], "nodes") or []
        return any(r["id"] == node and r["state"] == "active" for r in rows)

    def _wait_member(self, tb: Testbed, node: str) -> None:
        deadline = time.monotonic() + ACTIVE_WAIT_S
        while not self._member(tb, node):
            if time.monotonic() > deadline:
                raise TestbedError(f"scenario: {node} did not become a training member "
                                    f"within {ACTIVE_WAIT_S:g}s; see {self.dir}/{node}/")
            time.sleep(0.2)

    def _signal_node(self, tb: Testbed, node: str, sig: int) -> None:
        info = tb.query(node, "ping") or {}
        pid = int((info.get("worker") or {}).get("pid") or 0)
        tb.kill(node, sig)
        if pid:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, sig)

    def _do(self, tb: Testbed, ev: Event) -> None:
        a = ev.args
        if ev.action == "join":
            tb.join(a["node"], self._command(a["node"]))
        elif ev.action == "leave":
            call_once(tb.socket_of(a["node"]), "leave", timeout=5)
        elif ev.action in ("kill9", "sigstop", "sigcont"):
            sig = {"kill9": signal.SIGKILL, "sigstop": signal.SIGSTOP,
                   "sigcont": signal.SIGCONT}[ev.action]
            self._signal_node(tb, a["node"], sig)
        elif ev.action == "cut":
            tb.cut(a["a"], a["b"])
        elif ev.action == "heal":
            tb.heal(a["a"], a["b"])
        elif ev.action == "shape":
            tb.shape(a["a"], a["b"], float(a["mbit"]))
        elif ev.action == "broker-restart":
            tb.stop_broker()
            tb.start_broker()

    def run(self) -> dict[str, Any]:
        self.out.mkdir(parents=True, exist_ok=True)
        spec = self.sc.testbed
        with Testbed(self.dir, nodes=int(spec["nodes"]),
                     topology=str(spec.get("topology", "random")),
                     bw=parse_bw(str(spec.get("bw", "100-1000"))),
                     seed=int(spec.get("seed", 0)),
                     redraw_period_s=float(spec.get("redraw_period_s", 0)),
                     run_id=self.run_id, config=str(spec.get("config", ""))) as tb:
            self.say("building the testbed")
            tb.up(wait_s=60.0)
            self.say(f"testbed up: {len(tb.nodes)} nodes, links {tb.links}")
            for node in self.sc.start:
                tb.join(node, self._command(node))
                self._wait_member(tb, node)
                self.say(f"{node} is training")
            t0 = time.monotonic()
            for ev in self.sc.events:
                time.sleep(max(0.0, t0 + ev.at - time.monotonic()))
                entry = {"at": round(time.monotonic() - t0, 3), "action": ev.action, **ev.args}
                try:
                    self._do(tb, ev)
                    entry["ok"] = True
                except (ControlFailure, OSError) as exc:
                    entry.update(ok=False, error=str(exc))
                self.log.append(entry)
                self.say(f"t={entry['at']:6.1f}s {ev.action} {ev.args} "
                         f"{'ok' if entry['ok'] else entry.get('error')}")
            time.sleep(max(0.0, t0 + self.sc.duration_s - time.monotonic()))
            stopped: set[str] = set()
            for ev in self.sc.events:  # who is dead or frozen when the clock runs out
                if ev.action in ("kill9", "sigstop"):
                    stopped.add(ev.args["node"])
                elif ev.action == "sigcont":
                    stopped.discard(ev.args["node"])
            live = [n for n in tb.nodes if n not in stopped]
            agreed = tb.agreed(live)
            events = tb.query(live[0], "events") if live else []
        records = {n: _records(self.out, n) for n in tb.nodes}
        failures = check({n: r for n, r in records.items() if r})
        if agreed is None:
            failures.append("the surviving daemons did not agree on one scheduler")
        report = {"scenario": self.sc.name, "failures": failures, "timeline": self.log,
                  "events": events or [],
                  "steps": {n: [r[0]["step"], r[-1]["step"]] if r else None
                            for n, r in records.items()}}
        (self.dir / "scenario.json").write_text(json.dumps(report, indent=2))
        return report
