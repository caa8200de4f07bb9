"""Soak test: a training cluster on the netns testbed under random chaos, for a long time.

    chaosctl bench soak --minutes 60 --out bench/results/soak

A testbed of ``--nodes`` chaosd (a full mesh of shaped veth links, a mosquitto hub) trains the
tiny worker :mod:`chaos_bench.soak.worker` on every node. Then, for ``--minutes``, chaos
events arrive as a Poisson process of ``--rate`` per minute, each of a kind drawn among those
that are possible at that moment:

- ``join``: an idle node (one that left) joins with a training worker;
- ``leave``: a training node leaves gracefully (``chaosctl leave``);
- ``kill``: SIGKILL to a node's chaosd and its worker at once (a crash); the node reboots
  a few seconds later, and its chaosd starts the job it remembers, which rejoins;
- ``freeze``: SIGSTOP to both, SIGCONT a few seconds later (a power cut: no TCP reset);
- ``cut``: a data link goes down, and comes back a few seconds later (never a partition);
- ``broker-restart``: mosquitto stops and starts again;
- ``power-cut`` (every ``--power-cut-every`` seconds, not drawn): SIGKILL to every chaosd and
  worker at once, a whole site's power cut (the broker, a gateway's, stays up); the boxes come
  back a few seconds later on their data dirs, and the cluster resumes from its snapshots.

Leaves, kills and freezes keep at least ``MIN_TRAINING`` nodes training, counting only
active members (a node whose join is still in flight holds no state yet). Every
``--sample-seconds`` the RSS, open file descriptors and threads of each chaosd, worker and
the broker are sampled (psutil); a process in a node's namespace that is neither its chaosd
nor a child of it is a leaked process. At the end the testbed is torn down and checked for
leftovers (processes, namespaces, veths, sockets), and :mod:`chaos_bench.soak.report`
checks the step records and fits the growth per hour.

Each worker process writes ``<records>/<node>.<pid>.jsonl``, one line per committed step:
``{"t", "step", "joins", "digest", "loss"}``; ``joins`` counts the Trainer's joins, so a
rejoin inside one process (after a freeze, say) is visible.
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
import random
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import psutil

from chaos_bench.output import keep_copy
from chaos_bench.progress import Say
from chaos_bench.soak import report as soak_report
from chaosctl.client import ControlFailure, call_once
from chaosctl.testbed.core import Testbed
from chaosctl.testbed.state import TestbedError
from netprobe import netns

WORKER_MODULE = "chaos_bench.soak.worker"  # the training worker, run with -m
KINDS = ("join", "leave", "kill", "freeze", "cut", "broker-restart")
MIN_TRAINING = 2  # leaves, kills and freezes never take the cluster below this
JOIN_WAIT_S = 120.0
RESUME_WAIT_S = 120.0  # after the chaos phase, for a power cut near its end


@dataclass
class Options:
    """What one soak run does (the CLI's options)."""

    minutes: float
    nodes: int = 4
    rate: float = 6.0  # chaos events per minute
    sample_s: float = 5.0
    warmup_s: float | None = None  # None: a quarter of the run, at most 120 s
    kinds: tuple[str, ...] = KINDS
    bw: tuple[float, float] = (100.0, 400.0)
    seed: int = 1
    outage_s: tuple[float, float] = (2.0, 10.0)  # how long a freeze, cut or reboot lasts
    power_cut_every_s: float = 0.0  # every box loses power at once this often (0: never)
    limits: soak_report.Limits = field(default_factory=soak_report.Limits)

    @property
    def warmup(self) -> float:
        if self.warmup_s is not None:
            return self.warmup_s
        return min(120.0, self.minutes * 60 / 4)


@dataclass
class Chaos:
    """The chaos driver: what each node is doing, and the follow-ups that are due."""

    tb: Testbed
    opts: Options
    records: Path
    say: Say
    rng: random.Random
    t0: float = field(default_factory=time.monotonic)
    t0_wall: float = field(default_factory=time.time)  # the same instant, for the records
    state: dict[str, str] = field(default_factory=dict)  # training idle dead frozen
    ready_at: dict[str, float] = field(default_factory=dict)  # an idle node may join then
    cut: set[tuple[str, str]] = field(default_factory=set)
    due: list[tuple[float, str, str]] = field(default_factory=list)  # (when, action, arg)
    outages: list[tuple[float, float]] = field(default_factory=list)  # power cuts, wall clock
    had_job: set[str] = field(default_factory=set)  # nodes a power cut found with a job
    timeline: list[dict[str, Any]] = field(default_factory=list)

    def now(self) -> float:
        return time.monotonic() - self.t0

    def command(self) -> list[str]:
        return [sys.executable, "-m", WORKER_MODULE, "--out", str(self.records)]

    def worker_pid(self, node: str) -> int:
        """The worker of ``node``'s chaosd, found without asking it (it may be frozen)."""
        with contextlib.suppress(psutil.Error, TestbedError):
            for child in psutil.Process(self.tb.pid_of(node)).children():
                if WORKER_MODULE in " ".join(child.cmdline()):
                    return child.pid
        return 0

    def training(self) -> list[str]:
        return [n for n, s in self.state.items() if s == "training"]

    def members(self) -> list[str]:
        """Training nodes that the cluster lists as active: a node whose join is still in
        flight holds no state yet, and must not count toward MIN_TRAINING (two leaves while
        two joins were pending once left nobody to replicate from, and a joiner bootstrapped
        a fresh model: the harness's doing, not the cluster's)."""
        training = self.training()
        for asker in training:
            rows = self.tb.query(asker, "nodes", timeout=1.0)
            if isinstance(rows, list):
                active = {r.get("id") for r in rows if r.get("state") == "active"}
                return [n for n in training if n in active]
        return []

    def options(self, kind: str) -> list[str]:
        """The arguments ``kind`` could take now (empty: not possible now)."""
        now = self.now()
        if kind == "join":
            return [n for n, s in self.state.items() if s == "idle" and self.ready_at[n] <= now]
        if kind in ("leave", "kill", "freeze"):
            members = self.members()
            return members if len(members) > MIN_TRAINING else []
        if kind == "cut":
            return [f"{a}:{b}" for a, b in self.tb.links
                    if (a, b) not in self.cut and self._connected(self.cut | {(a, b)})]
        return ["hub"] if not any(a == "broker-start" for _, a, _ in self.due) else []

    def _connected(self, cut: set[tuple[str, str]]) -> bool:
        links = [lk for lk in self.tb.links if lk not in cut]
        seen, todo = {self.tb.nodes[0]}, [self.tb.nodes[0]]
        while todo:
            n = todo.pop()
            for a, b in links:
                for x, y in ((a, b), (b, a)):
                    if x == n and y not in seen:
                        seen.add(y)
                        todo.append(y)
        return len(seen) == len(self.tb.nodes)

    def _signal(self, node: str, sig: int) -> None:
        pid = self.worker_pid(node)
        if pid:  # the worker and the daemon go down together, as with a power cut
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, sig)
        self.tb.kill(node, sig)

    def _later(self, action: str, arg: str) -> None:
        self.due.append((self.now() + self.rng.uniform(*self.opts.outage_s), action, arg))

    def join(self, node: str) -> None:
        info = self.tb.query(node, "ping") or {}
        if (info.get("worker") or {}).get("pid"):  # the last worker is still leaving
            raise ControlFailure(f"{node} still has a worker")
        self.tb.join(node, self.command(), timeout=10)
        self.state[node] = "training"

    def fire(self, kind: str, arg: str) -> None:
        """Do one event (raises ControlFailure/OSError/TestbedError when it cannot)."""
        if kind == "join":
            self.join(arg)
        elif kind == "leave":
            call_once(self.tb.socket_of(arg), "leave", timeout=5)
            self.state[arg], self.ready_at[arg] = "idle", self.now() + 10.0
        elif kind == "kill":
            self._signal(arg, signal.SIGKILL)
            self.state[arg] = "dead"
            self._later("reboot", arg)
        elif kind == "freeze":
            self._signal(arg, signal.SIGSTOP)
            self.state[arg] = "frozen"
            self._later("thaw", arg)
        elif kind == "cut":
            a, b = arg.split(":")
            self.tb.cut(a, b)
            self.cut.add((a, b))
            self._later("heal", arg)
        elif kind == "broker-restart":
            self.tb.stop_broker()
            self.due.append((self.now() + self.rng.uniform(0.5, 3.0), "broker-start", "hub"))
        elif kind == "power-cut":
            self.power_cut()

    def power_cut(self) -> None:
        """Every box loses power at once; the ends of their other outages are moot."""
        self.had_job = {n for n, s in self.state.items() if s != "idle"}
        for node in self.tb.nodes:
            if self.state[node] != "dead":
                self._signal(node, signal.SIGKILL)  # a stopped process dies of it too
            self.state[node] = "dead"
        self.due = [d for d in self.due if d[1] not in ("reboot", "thaw")]
        self.outages.append((time.time(), 0.0))
        self._later("power-on", "all")

    def follow_up(self, action: str, arg: str) -> None:
        """A due follow-up: the end of an outage."""
        if action == "reboot":
            # Back on the same data dir, its chaosd starts the job it remembers: the worker
            # rejoins by scale-out with no join from us (as on a real box after a power cut).
            self.tb.start_node(arg)
            self.state[arg], self.ready_at[arg] = "training", self.now() + 3.0
        elif action == "thaw":
            self._signal(arg, signal.SIGCONT)
            self.state[arg] = "training"  # chaosd drops or restarts the worker as it sees fit
        elif action == "heal":
            a, b = arg.split(":")
            self.tb.heal(a, b)
            self.cut.discard((a, b))
        elif action == "broker-start":
            self.tb.start_broker()
        elif action == "power-on":
            self.outages[-1] = (self.outages[-1][0], time.time())
            for node in self.tb.nodes:  # a box that had left comes back idle
                self.tb.start_node(node)
                job = node in self.had_job
                self.state[node] = "training" if job else "idle"
                self.ready_at[node] = self.now() + (3.0 if job else 10.0)

    def act(self, kind: str, arg: str, follow: bool = False) -> None:
        entry: dict[str, Any] = {"t": round(self.now(), 3), "kind": kind, "arg": arg,
                                 "follow_up": follow}
        try:
            (self.follow_up if follow else self.fire)(kind, arg)
            entry["ok"] = True
        except (ControlFailure, OSError, TestbedError) as exc:
            entry.update(ok=False, error=str(exc)[:200])
            if kind == "join":
                self.state[arg], self.ready_at[arg] = "idle", self.now() + 5.0
        self.timeline.append(entry)
        if not follow or not entry["ok"]:
            self.say(f"t={entry['t']:7.1f}s {kind} {arg} "
                     f"{'ok' if entry['ok'] else entry.get('error')}")

    def event(self) -> None:
        """One Poisson arrival: a kind among those possible now, then its argument."""
        possible = {k: args for k in self.opts.kinds if (args := self.options(k))}
        if possible:
            kind = self.rng.choice(list(possible))
            self.act(kind, self.rng.choice(possible[kind]))

    def run_due(self) -> None:
        now = self.now()
        for item in sorted(d for d in self.due if d[0] <= now):
            self.due.remove(item)
            self.act(item[1], item[2], follow=True)

    def settle(self) -> None:
        """The end of the chaos phase: every outage ends now."""
        for _, action, arg in sorted(self.due):
            self.act(action, arg, follow=True)
        self.due.clear()


class Sampler:
    """Samples chaosd, workers and the broker; spots processes nobody owns."""

    def __init__(self, tb: Testbed, chaos: Chaos) -> None:
        self.tb, self.chaos = tb, chaos
        self.rows: list[dict[str, Any]] = []
        self.seen: dict[int, float] = {}  # pid -> create_time, for the leak check at the end
        self.suspects: dict[int, str] = {}  # unowned at the last sample
        self.leaks: dict[int, str] = {}  # unowned at two samples in a row

    def _take(self, t: float, kind: str, node: str, proc: psutil.Process) -> None:
        with contextlib.suppress(psutil.Error):
            with proc.oneshot():
                created = proc.create_time()
                self.rows.append({"t": round(t, 2), "kind": kind, "node": node, "pid": proc.pid,
                                  "age": round(time.time() - created, 2),
                                  "rss": proc.memory_info().rss, "fds": proc.num_fds(),
                                  "threads": proc.num_threads()})
            self.seen[proc.pid] = created

    def sample(self) -> None:
        t = self.chaos.now()
        with contextlib.suppress(TestbedError, psutil.Error):
            self._take(t, "broker", "hub", psutil.Process(self.tb.pid_of("broker")))
        suspects: dict[int, str] = {}
        for node in self.tb.nodes:
            owned: set[int] = set()
            with contextlib.suppress(TestbedError, psutil.Error):
                if self.chaos.state[node] != "dead":
                    daemon = psutil.Process(self.tb.pid_of(node))
                    self._take(t, "chaosd", node, daemon)
                    owned.add(daemon.pid)
                    for child in daemon.children(recursive=True):
                        owned.add(child.pid)
                        with contextlib.suppress(psutil.Error):
                            if WORKER_MODULE in " ".join(child.cmdline()):
                                self._take(t, "worker", node, child)
            for pid in netns.netns_pids(self.tb.ns_of(node)):
                with contextlib.suppress(psutil.Error):
                    proc = psutil.Process(pid)
                    if pid not in owned and proc.status() != psutil.STATUS_ZOMBIE:
                        suspects[pid] = f"{node}: {' '.join(proc.cmdline())[:120]}"
        for pid, what in suspects.items():
            if pid in self.suspects:
                self.leaks[pid] = what
        self.suspects = suspects


def leftovers(tb: Testbed, seen: dict[int, float]) -> list[str]:
    """What the teardown left: namespaces, root links, processes, socket files."""
    found = [f"netns {n}" for n in netns.list_netns(tb.state.prefix)]
    found += [f"link {n}" for n in netns.list_links(tb.state.prefix)]
    for pid, created in seen.items():
        with contextlib.suppress(psutil.Error):
            proc = psutil.Process(pid)
            if abs(proc.create_time() - created) < 0.05 and \
                    proc.status() != psutil.STATUS_ZOMBIE:
                found.append(f"pid {pid}: {' '.join(proc.cmdline())[:120]}")
    found += [f"socket {p}" for p in tb.dir.glob("**/*.sock")]
    return found


def _cluster(tb: Testbed, chaos: Chaos, sampler: Sampler, opts: Options, say: Say) -> None:
    """Bring the testbed up, join every node, and run the chaos phase."""
    say(f"building a {opts.nodes}-node testbed in {tb.dir}")
    tb.up(wait_s=60.0)
    for node in tb.nodes:
        chaos.state[node], chaos.ready_at[node] = "idle", 0.0

    def member(node: str) -> bool:
        rows = tb.query(tb.nodes[0], "nodes") or []
        return any(r.get("id") == node and r.get("state") == "active" for r in rows)

    for node in tb.nodes:  # one at a time: joins racing the bootstrap can leave nobody first
        chaos.join(node)
        tb.wait(functools.partial(member, node), JOIN_WAIT_S, f"{node} to train")
    say(f"training on {len(tb.nodes)} nodes; chaos for {opts.minutes:g} min at "
        f"{opts.rate:g} events/min")
    chaos.t0, chaos.t0_wall = time.monotonic(), time.time()
    end = opts.minutes * 60
    next_event = chaos.rng.expovariate(opts.rate / 60)
    next_sample = 0.0
    next_cut = opts.power_cut_every_s or math.inf
    while chaos.now() < end:
        now = chaos.now()
        if now >= next_sample:
            sampler.sample()
            next_sample += opts.sample_s
        chaos.run_due()
        if now >= next_cut:
            chaos.act("power-cut", "all")
            next_cut += opts.power_cut_every_s
        elif now >= next_event:
            chaos.event()
        if now >= next_event:
            next_event += chaos.rng.expovariate(opts.rate / 60)
        wake = min([next_sample, next_event, next_cut, end, *(d[0] for d in chaos.due)])
        time.sleep(min(1.0, max(0.02, wake - chaos.now())))
    chaos.settle()
    if chaos.outages:  # a power cut near the end: give the cluster its chance to resume
        back = chaos.outages[-1][1]
        with contextlib.suppress(TestbedError):
            tb.wait(lambda: any(p.stat().st_mtime > back
                                    for p in chaos.records.glob("*.jsonl")),
                    RESUME_WAIT_S, "training to resume after the last power cut")
    time.sleep(3.0)  # the last rows reach the files
    sampler.sample()


@contextlib.contextmanager
def _unwinds_on_sigterm() -> Iterator[None]:
    """SIGTERM unwinds like Ctrl-C, so the testbed is torn down either way."""
    def on_term(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt
    previous = signal.signal(signal.SIGTERM, on_term)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextlib.contextmanager
def _signals_ignored() -> Iterator[None]:
    previous = {s: signal.signal(s, signal.SIG_IGN) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def run(opts: Options, out: Path, say: Say, keep: Path | None = None,
        workdir: Path | None = None, run_id: str | None = None) -> dict[str, Any]:
    """One soak run; writes ``soak.json`` and ``soak.png`` under ``out`` and returns the doc
    (``violations`` empty when every invariant held)."""
    tmp = Path(tempfile.mkdtemp(prefix="soak-", dir=workdir))  # short: socket paths
    records = tmp / "records"
    records.mkdir()
    tb = Testbed(tmp / "tb", nodes=opts.nodes, topology="full", bw=opts.bw, seed=opts.seed,
                 run_id=run_id)
    chaos = Chaos(tb, opts, records, say, random.Random(opts.seed))
    sampler = Sampler(tb, chaos)
    error, interrupted = "", False
    torn: float | None = None  # when the teardown began (wall clock)
    try:
        with _unwinds_on_sigterm():
            _cluster(tb, chaos, sampler, opts, say)
    except (TestbedError, ControlFailure, OSError) as exc:
        error = str(exc)
        say(f"the run failed: {error}")
    except BaseException:  # interrupted: nothing of the run is left (its temp dir too)
        interrupted = True
        raise
    finally:
        # A second Ctrl-C (or the SIGINT `timeout` passes on beside the user's) must not
        # cut the teardown short: it once left four chaosd and five namespaces behind.
        with _signals_ignored():
            for node, st in chaos.state.items():  # a stopped process cannot take SIGTERM
                if st == "frozen":
                    with contextlib.suppress(ControlFailure, OSError, TestbedError):
                        chaos._signal(node, signal.SIGCONT)
            say("tearing down")
            torn = time.time()
            tb.down(grace_s=5.0)
            if interrupted:
                shutil.rmtree(tmp, ignore_errors=True)
    left = leftovers(tb, sampler.seen)
    rows = soak_report.load_records(records)
    doc = soak_report.analyse(rows, sampler.rows, opts.warmup,
                              (chaos.t0_wall, chaos.t0_wall + opts.minutes * 60), opts.limits,
                              chaos.outages, until=torn)
    doc["violations"] += [f"leaked process {w}" for w in sampler.leaks.values()]
    doc["violations"] += [f"left after teardown: {x}" for x in left]
    if error:
        doc["violations"].insert(0, f"the run did not complete: {error}")
    doc.update(window=[chaos.t0_wall, chaos.t0_wall + opts.minutes * 60],  # to check again
               teardown=torn,
               options={**asdict(opts), "warmup_s": opts.warmup}, timeline=chaos.timeline,
               leftovers=left, outages=[(round(a - chaos.t0_wall, 3), round(b - chaos.t0_wall, 3))
                                        for a, b in chaos.outages])
    if keep is not None:
        keep_copy(tmp, keep, say, "the records and logs")
    soak_report.keep_records(records, out / "records", say)
    shutil.rmtree(tmp, ignore_errors=True)
    soak_report.write(doc, out, say)
    return doc
