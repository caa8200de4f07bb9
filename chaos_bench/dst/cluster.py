"""Boxes, sites and the faults of a plan, on one simulated broker, clock and data plane.

Each box runs the real :class:`~daemon.agent.node.NodeAgent` (election, failure detection,
the scheduler's role and negotiator, its control handlers), ticked every 0.1 s and beating
every 0.5 s as chaosd does, with its data dir on disk (the election term it remembers), and
one :class:`~chaos_bench.dst.worker.SimWorker` at a time, started again by a supervisor
after it fails, as ``chaosctl join -- CMD`` does.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import shutil
import signal
import tempfile
from collections.abc import Iterator
from typing import Any

from chaos_bench.dst.broker import SimBroker, SimBus
from chaos_bench.dst.faults import SLOW_FACTOR, SLOW_LINK_MBPS, Fault, Plan
from chaos_bench.dst.loop import Sim, drive
from chaos_bench.dst.plane import DataPlane, State, fresh_state
from chaos_bench.dst.referee import Referee
from chaos_bench.dst.worker import SNAPSHOT_KEEP, SNAPSHOT_WRITE_S, SimWorker
from daemon.agent.node import NodeAgent
from daemon.agent.resources import Resources
from daemon.contracts.config import AdaptiveConfig, Config
from daemon.contracts.messages import Command, LeaderClaim, Request, Status, decode
from daemon.contracts.protocol import LinkMetrics, LinkRecovered, LinkRequest, PolicyRequest
from daemon.contracts.snapshots import SNAPSHOT_DIR, snapshot_name

TICK_S = 0.1
HB_S = 0.5
RESTART_MIN_S, RESTART_MAX_S = 1.0, 30.0  # the supervisor's backoff (daemon.agent.worker)
QUIET = Resources(cpu_percent=10.0, mem_percent=20.0, battery_percent=None)
#: A plan with slow boxes runs the policy controller with its policy pinned, so only its
#: straggler judge acts, on what the workers say of their compute and the probes of their links.
JUDGED = AdaptiveConfig(enabled=True, pin=("sync", "wire", "inner_steps"), dwell=2,
                        min_interval_s=10.0, straggler_retry_s=20.0)
LINK_MBPS = 100.0


class Box:
    """One machine: its chaosd and, while it trains, its worker."""

    def __init__(self, cluster: Cluster, name: str, site: str) -> None:
        self.c, self.name, self.site = cluster, name, site
        self.data_dir = os.path.join(cluster.root, name)
        os.makedirs(self.data_dir, exist_ok=True)
        self.agent: NodeAgent | None = None
        self.bus: SimBus | None = None
        self.worker: SimWorker | None = None
        self.wants_worker = False  # its job is on (chaosctl join), off after a leave
        self.held: State | None = None  # what its last worker held (a restart starts fresh)
        # Its disk: the snapshots its workers wrote (step -> state), which outlive crashes and
        # power cuts; the files' names are written for real, so chaosd reads them as it does.
        self.disk: dict[int, State] = {}
        self.gen = 0  # each boot of chaosd, so that a dead one's timers stop
        self.frozen = False
        self.cut = False
        self.slow = 1.0  # how many times slower than the pace its steps are (a slow fault)
        self.link_slow = False  # its links test at SLOW_LINK_MBPS (a slow-link fault)
        self._backoff = RESTART_MIN_S

    # --- chaosd -------------------------------------------------------------------------
    def boot(self) -> None:
        if self.agent is not None:
            return  # already running (a reboot scheduled twice)
        c = self.c
        self.gen += 1
        gen = self.gen
        cfg = Config(node_id=self.name, cluster="sim", data_dir=self.data_dir,
                     advertise="127.0.0.1",
                     adaptive=JUDGED if c.plan.judged else AdaptiveConfig())
        agent = NodeAgent(cfg, c.sim.clock, resources=lambda: QUIET, alive=c.pid_alive)
        bus = SimBus(c.sim, c.broker, cfg, client_id=f"chaos-sim-{self.name}",
                     will=agent._will, on_message=agent.on_message,
                     on_connect=agent.on_connect, on_disconnect=agent.on_disconnect,
                     subscriptions=sorted(agent._wanted_topics()))
        agent.bus = bus
        sup = agent.supervisor
        sup.on_exit.clear()
        sup.on_exit.append(agent._worker_exited)
        # Our workers are the supervisor's children (chaosctl join): chaosd may kill one it
        # finds hung, and the box restarts it. Without this every worker ran "by hand", and
        # a hung one dropped from the rounds lived on holding its state (the seed 2934).
        sup.owns = self._runs_worker  # type: ignore[method-assign]
        sup.kill = self._kill_supervised  # type: ignore[method-assign]
        self._watch_commands(agent)
        self.agent, self.bus = agent, bus
        bus.reachable = not self.cut
        bus.start()
        phase = c.sim.rng.random() * TICK_S
        c.sim.at(phase, lambda: self._tick(gen))
        c.sim.at(phase + c.sim.rng.random() * HB_S, lambda: self._beat(gen))
        c.sim.note(f"{self.name} chaosd boots (incarnation {agent.incarnation})")
        c.ref.count("box:boot")

    def _watch_commands(self, agent: NodeAgent) -> None:
        """Which scheduler's commands this agent obeys (invariant 1 is about those)."""
        obey, ref, name = agent._on_command, self.c.ref, self.name

        def on_command(cmd: Command) -> None:
            before = agent.counters["commands"]
            obey(cmd)
            if agent.counters["commands"] > before:
                ref.command_obeyed(name, agent.incarnation, cmd.term, cmd.leader)

        agent._on_command = on_command  # type: ignore[method-assign]

    def _tick(self, gen: int) -> None:
        if gen != self.gen or self.agent is None:
            return
        self.c.sim.at(TICK_S, lambda: self._tick(gen))
        if self.frozen:
            return
        try:
            drive(self.agent.tick())
        except Exception as exc:  # chaosd logs and carries on; for us it is a finding
            self.c.ref.violation("tick-error", f"{self.name}: {type(exc).__name__}: {exc}")
        self.c.ref.term_seen(self.name, self.agent.election.term)
        if self.agent.should_exit:  # chaosd's main loop ends, and it says goodbye
            self.c.sim.note(f"{self.name} chaosd exits: {self.agent.exit_reason}")
            self.shutdown()

    def _beat(self, gen: int) -> None:
        if gen != self.gen or self.agent is None:
            return
        self.c.sim.at(HB_S, lambda: self._beat(gen))
        if not self.frozen:
            drive(self.agent.heartbeat())

    def crash(self) -> None:
        """chaosd dies without a goodbye; its worker dies with it (kill_with_parent)."""
        if self.agent is None:
            return
        self._kill_worker(supervised=False)
        assert self.bus is not None
        self.bus.kill()
        self.agent, self.bus = None, None
        self.gen += 1
        self.frozen = False

    def shutdown(self) -> None:
        """``systemctl stop chaosd``: the worker stops, chaosd says it left."""
        if self.agent is None:
            return
        self._kill_worker(supervised=False)
        drive(self.agent.leave())
        assert self.bus is not None
        self.bus.close()
        self.agent, self.bus = None, None
        self.gen += 1

    # --- the worker ---------------------------------------------------------------------
    def start_worker(self, misfit: bool = False) -> None:
        if self.agent is None or (self.worker is not None and self.worker.alive):
            return
        self.wants_worker = True
        # A script that starts loads the newest snapshot on its box's disk, or a fresh model.
        held = self.disk[max(self.disk)] if self.disk else State(*fresh_state())
        w = SimWorker(self.c.sim, self.agent, self.c.plane, held, self._exited, self.c.ref,
                      self.c.plan.pace)
        w.misfit = misfit
        w.slowness, w.says_compute = lambda: self.slow, self.c.plan.judged
        w.snapshot_to = self.write_snapshot
        w.pid = self.c.next_pid()
        self.worker = w
        self.c.plane.workers[self.name] = w
        w.start()
        self.c.ref.count("worker:start")

    def write_snapshot(self, w: SimWorker, state: State) -> None:
        """``w`` snapshots ``state``: on disk after SNAPSHOT_WRITE_S, if ``w`` is still alive
        then (written atomically: a crash during the write leaves the older ones)."""
        def done() -> None:
            if not w.alive or w is not self.worker:
                return
            self.disk[state.step] = state
            folder = os.path.join(self.data_dir, SNAPSHOT_DIR)
            os.makedirs(folder, exist_ok=True)
            open(os.path.join(folder, snapshot_name(state.step)), "w").close()
            for old in sorted(self.disk)[:-SNAPSHOT_KEEP]:
                del self.disk[old]
                os.unlink(os.path.join(folder, snapshot_name(old)))
            self.c.ref.count("snapshot")
        self.c.sim.at(SNAPSHOT_WRITE_S, done)

    def _exited(self, node: str, code: int, why: str) -> None:
        """The supervisor saw its child exit: it tells chaosd, and restarts it unless done."""
        w = self.worker
        if w is not None:
            self.held = w.state
            if w.was_member:
                self._backoff = RESTART_MIN_S
        if self.agent is not None:
            for cb in self.agent.supervisor.on_exit:
                cb(code)
        if code == 0:
            self.wants_worker = False
            return
        if self.agent is not None and self.agent.supervisor.refused is not None:
            self.wants_worker = False  # a script whose model does not fit is not restarted
            return
        gen, delay = self.gen, self._backoff
        self._backoff = min(self._backoff * 2, RESTART_MAX_S)
        self.c.sim.at(delay, lambda: self._restart_worker(gen))

    def _restart_worker(self, gen: int) -> None:
        if gen == self.gen and self.wants_worker and not self.frozen:
            self.start_worker()
        elif gen == self.gen and self.wants_worker:
            self.c.sim.at(1.0, lambda: self._restart_worker(gen))

    def _runs_worker(self, pid: int) -> bool:
        w = self.worker
        return w is not None and w.alive and w.pid == pid

    def _kill_supervised(self) -> bool:
        """The supervisor's SIGKILL of its child (a hung worker): it restarts as after a crash."""
        w = self.worker
        if w is None or not w.alive:
            return False
        self.c.ref.count("worker:killed-hung")
        self._kill_worker(supervised=True)
        return True

    def _kill_worker(self, supervised: bool) -> None:
        w = self.worker
        if w is None or not w.alive:
            return
        self.held = w.state
        w.kill()
        self.c.sim.note(f"{self.name} worker killed")
        if supervised and self.agent is not None:
            self._exited(self.name, -9, "killed")

    # --- faults -------------------------------------------------------------------------
    def freeze(self, seconds: float, worker_only: bool = False) -> None:
        w = self.worker
        if worker_only:
            if w is not None and w.alive and not w.frozen:
                w.frozen = True
                self.c.sim.at(seconds, lambda: setattr(w, "frozen", False))
            return
        if self.agent is None or self.frozen:
            return
        self.frozen = True
        assert self.bus is not None
        self.bus.freeze()
        if w is not None:
            w.frozen = True
        self.c.ref.excuse(self.name, seconds)
        gen = self.gen
        self.c.sim.at(seconds, lambda: self.thaw(gen))

    def slow_down(self, seconds: float) -> None:
        """Its steps take SLOW_FACTOR paces for ``seconds`` (its worker's and the next's)."""
        self.slow = SLOW_FACTOR

        def back() -> None:
            self.slow = 1.0
            self.c.sim.note(f"{self.name} is fast again")

        self.c.sim.at(seconds, back)

    def slow_links(self, seconds: float) -> None:
        """Its links test at SLOW_LINK_MBPS for ``seconds``, both ways, as iperf3 would read
        them. The modelled rounds take no longer: the judge acts on what the probes say."""
        self.link_slow = True

        def back() -> None:
            self.link_slow = False
            self.c.sim.note(f"{self.name}'s links are fast again")

        self.c.sim.at(seconds, back)

    def thaw(self, gen: int) -> None:
        if gen != self.gen or not self.frozen:
            return
        self.frozen = False
        if self.worker is not None:
            self.worker.frozen = False
        if self.bus is not None:
            self.bus.thaw()
        self.c.sim.note(f"{self.name} thaws")


class Cluster:
    """The boxes of a plan, the broker, the data plane and the referee."""

    def __init__(self, plan: Plan, sim: Sim) -> None:
        self.plan, self.sim = plan, sim
        self.root = tempfile.mkdtemp(prefix=f"chaos-dst-{plan.seed}-")
        self.ref = Referee(lambda: sim.now, sim.note)
        self.ref.holders = self.holders
        self.ref.disks = self.disks
        self.broker = SimBroker(sim, plan.net, self.ref.count)
        self.plane = DataPlane(sim, self.reach, self.ref.committed)
        self.boxes = {name: Box(self, name, site) for name, site in plan.sites.items()}
        self.splits: set[frozenset[str]] = set()  # pairs of sites cut apart on the data plane
        self._pids = 1000
        self._checked_at = 0.0
        self._judged: set[tuple[int, int]] = set()  # straggler events seen (term, seq)
        self._watch_traffic()

    def next_pid(self) -> int:
        self._pids += 1
        return self._pids

    def pid_alive(self, pid: int) -> bool:
        """A process exists while its worker does (killed, it is gone; frozen, it is not)."""
        return any((w := b.worker) is not None and w.pid == pid and w.alive
                   for b in self.boxes.values())

    def close(self) -> None:
        # A campaign's worker ends on SIGTERM through here: not halfway through the removal.
        held = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
        try:
            shutil.rmtree(self.root, ignore_errors=True)
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, held)

    def _watch_traffic(self) -> None:
        """Count every message by kind, and note who commands in which term."""
        inner = self.broker.publish

        def publish(sender: Any, topic: str, payload: bytes, qos: int, retain: bool) -> None:
            leaf = topic.rsplit("/", 1)[-1]
            self.ref.count(f"mqtt:{leaf}")
            if leaf in ("cmd", "req", "leader") and payload:
                msg = decode(payload)
                if isinstance(msg, Command):
                    self.ref.count(f"cmd:{msg.op}")
                    self.sim.note(f"{msg.leader}@{msg.term} -> {topic.split('/')[-2]}: "
                                  f"{msg.op} {_brief(msg.args)}")
                elif isinstance(msg, Request):
                    self.ref.count(f"req:{msg.op}" + (f":{msg.args.get('kind')}"
                                                      if msg.op == "report" else ""))
                    if msg.args.get("kind") not in ("link-metrics", "stall"):
                        self.sim.note(f"{msg.node} asks {msg.op} {_brief(msg.args)}")
                elif isinstance(msg, LeaderClaim):
                    self.sim.note(f"{msg.id} claims term {msg.term}")
            elif leaf == "status" and payload:
                st = decode(payload)
                if isinstance(st, Status):
                    self.ref.count(f"status:{st.reason}")
                    self.sim.note(f"{st.node} status {st.reason}")
            inner(sender, topic, payload, qos, retain)

        self.broker.publish = publish  # type: ignore[method-assign]

    # --- reachability -------------------------------------------------------------------
    def reach(self, a: str, b: str) -> bool:
        """Whether ``a``'s worker reaches ``b``'s on the data plane now."""
        ba, bb = self.boxes[a], self.boxes[b]
        if ba.cut or bb.cut:
            return ba.site == bb.site and ba.cut == bb.cut
        return frozenset((ba.site, bb.site)) not in self.splits or ba.site == bb.site

    # --- the plan -----------------------------------------------------------------------
    def start(self) -> None:
        for i, name in enumerate(self.plan.initial):
            box = self.boxes[name]
            self.sim.at(i * 0.05, box.boot)
            self.sim.at(2.0 + self.sim.rng.random() * 2.0, box.start_worker)
        for f in self.plan.faults:
            self.sim.at(f.at, functools.partial(self.apply, f))
        self.sim.at(5.0, self.probe)

    def apply(self, f: Fault) -> None:
        self.sim.note(f"FAULT {f}")
        self.ref.count(f"fault:{f.kind}")
        box = self.boxes.get(f.target.split(">")[0])
        if f.kind == "join" and box is not None:
            box.boot()
            self.sim.at(1.0 + self.sim.rng.random(), box.start_worker)
        elif f.kind == "leave" and box is not None and box.agent is not None:
            if box.agent.worker.attached:
                box.agent.worker.leave_requested = True  # what `chaosctl leave` does
        elif f.kind == "leave-daemon" and box is not None:
            box.wants_worker = False
            box.shutdown()
            self.sim.at(20.0, box.boot)  # the owner starts it again later, idle
        elif f.kind == "kill-worker" and box is not None:
            box._kill_worker(supervised=True)
        elif f.kind == "misfit" and box is not None and box.agent is not None:
            # Its owner starts another script, whose model is not the cluster's, a tenth of
            # a second to a second later (never inside one 0.1-s tick: a Python script takes
            # longer than that to start).
            box._kill_worker(supervised=False)
            box.agent.supervisor.refused = None
            self.sim.at(0.1 + self.sim.rng.random(), functools.partial(box.start_worker, True))
        elif f.kind == "link-op" and box is not None and box.agent is not None:
            peer, _, action = f.target.split(">")[1].partition("/")
            box.agent.request(LinkRequest(peer=peer, action="add" if action == "add" else "del"),
                              reply=True)
        elif f.kind == "policy-op" and box is not None and box.agent is not None:
            mode, _, h = f.target.split(">")[1].partition("/")
            box.agent.request(PolicyRequest(
                sync=mode, inner_steps=0 if mode == "every-step" else int(h),
                fragments=2 if mode == "streaming" else 0), reply=True)
        elif f.kind == "crash" and box is not None and box.agent is not None:
            wanted = box.wants_worker
            box.crash()
            self.sim.at(f.seconds, functools.partial(self._reboot, box, wanted))
        elif f.kind == "slow" and box is not None:
            box.slow_down(f.seconds)
        elif f.kind == "slow-link" and box is not None:
            box.slow_links(f.seconds)
        elif f.kind in ("freeze", "freeze-worker") and box is not None:
            box.freeze(f.seconds, worker_only=f.kind == "freeze-worker")
        elif f.kind == "broker-restart":
            self.broker.restart(f.seconds)
            for b in self.boxes.values():
                self.ref.excuse(b.name, f.seconds + 10.0)
        elif f.kind == "cut":
            self._cut(f.target, f.seconds)
        elif f.kind == "dataplane-split":
            pair = frozenset(f.target.split("|"))
            self.splits.add(pair)
            self.sim.at(f.seconds, functools.partial(self._rejoin_sites, pair))
        elif f.kind == "power":
            for b in self.boxes.values():
                if b.site == f.target and b.agent is not None:
                    wanted = b.wants_worker
                    b.crash()
                    self.sim.at(f.seconds, functools.partial(self._reboot, b, wanted))

    def _rejoin_sites(self, pair: frozenset[str]) -> None:
        """A data-plane split heals; the probes of the boxes on both sides hear each other
        again, and the scheduler hears about it (link-recovered), as chaosd's LinkMonitor
        reports a link whose probes answer again."""
        self.splits.discard(pair)
        self.sim.note(f"sites {'|'.join(sorted(pair))} reach each other again")
        for b in sorted(self.boxes.values(), key=lambda b: b.name):
            if b.site not in pair or b.agent is None or b.agent.view is None:
                continue
            rec = b.agent.view.nodes.get(b.name)
            for peer in rec.neighbors if rec is not None else []:
                other = self.boxes.get(peer)
                if other is not None and other.site in pair and other.site != b.site:
                    b.agent.request(LinkRecovered(peer=peer))

    def probe(self) -> None:
        """Every few seconds, like chaosd's LinkMonitor: each box reports the RTT of its
        overlay links (link-metrics)."""
        for b in sorted(self.boxes.values(), key=lambda b: b.name):
            if b.agent is None or b.frozen or b.agent.view is None:
                continue
            rec = b.agent.view.nodes.get(b.name)
            for peer in rec.neighbors if rec is not None else []:
                if peer in self.boxes and self.reach(b.name, peer):
                    # With the controller on, a rate too, as iperf3 measures it: the same on
                    # every link but those of a box on a slow link.
                    slow = b.link_slow or self.boxes[peer].link_slow
                    b.agent.request(LinkMetrics(peer=peer, rtt_ms=round(
                        0.2 + self.sim.rng.random(), 3),
                        bandwidth_mbps=(SLOW_LINK_MBPS if slow else LINK_MBPS)
                        if self.plan.judged else None))
        self.sim.at(5.0, self.probe)

    def _reboot(self, box: Box, wanted: bool) -> None:
        box.boot()
        if wanted:  # the job is started again (systemd and the operator, for now)
            self.sim.at(2.0, box.start_worker)

    def _cut(self, site: str, seconds: float) -> None:
        boxes = [b for b in self.boxes.values() if b.site == site]
        for b in boxes:
            b.cut = True
            if b.bus is not None:
                b.bus.link_cut()
            self.ref.excuse(b.name, seconds + 10.0)

        def heal() -> None:
            for b in boxes:
                b.cut = False
                if b.bus is not None:
                    b.bus.link_healed()
            self.sim.note(f"site {site} reconnected")

        self.sim.at(seconds, heal)

    # --- the referee's view -------------------------------------------------------------
    def check(self) -> None:
        """After every event: the invariants that need the whole cluster's view."""
        # A straggler set aside waits outside by the scheduler's choice: not a slow join.
        since, self._checked_at = self._checked_at, self.sim.now
        roles = [b.agent.role for b in self.boxes.values()
                 if b.agent is not None and b.agent.role is not None]
        for node in sorted({n for role in roles for n in role.neg.benched}):
            self.ref.excuse(node, self.sim.now - since)
        for role in roles:  # what the straggler judges did (coverage, and the trace)
            for e in role.sched.events:  # at most EVENT_KEEP
                key = (e.term, e.seq)
                if e.kind == "straggler" and key not in self._judged:
                    self._judged.add(key)
                    self.ref.count(f"straggler:{e.detail.get('action')}")
                    if e.detail.get("action") == "set-aside":
                        self.ref.count(f"straggler:set-aside:{e.detail.get('cause')}")
                    self.sim.note(f"scheduler@{e.term}: straggler {e.detail.get('action')} "
                                  f"{e.node} ({e.detail.get('cause')})")
        workers = [b for b in self.boxes.values() if b.worker is not None and b.worker.alive]
        if not workers:
            self.ref.check(False, False)
            return
        healthy = [b for b in workers if not b.frozen and not b.worker.frozen  # type: ignore[union-attr]
                   and not b.cut and self.broker.up and b.agent is not None
                   and b.bus is not None and b.bus.connected]
        connected = all(self.reach(a.name, b.name) for a in healthy for b in healthy)
        quorum = connected and 2 * len(healthy) > len(workers)
        members = any(b.worker.phase in ("active", "leaving") for b in workers)  # type: ignore[union-attr]
        self.ref.check(quorum, members)

    def disks(self) -> list[tuple[str, State]]:
        """The newest snapshot of each box that is up, reachable and runs its job."""
        return [(b.name, b.disk[max(b.disk)]) for b in self.boxes.values()
                if b.disk and b.wants_worker and b.agent is not None and not b.frozen
                and not b.cut and self.broker.up and b.bus is not None and b.bus.connected]

    def holders(self) -> list[tuple[State, bool]]:
        """The state of every running worker process, and whether the cluster reaches it
        now (its process runs, its box is not frozen, and it talks to the broker)."""
        out = []
        for b in self.boxes.values():
            w = b.worker
            if w is None or not w.alive:
                continue
            reach = (not w.frozen and not b.frozen and not b.cut and self.broker.up
                     and b.bus is not None and b.bus.connected)
            out.append((w.state, reach))
        return out


def _brief(args: dict[str, Any]) -> str:
    keep = {k: v for k, v in args.items() if k in ("peer", "new", "version_step", "sources",
                                                     "policy_version", "kind", "step", "reason",
                                                     "action", "error", "code")}
    return " ".join(f"{k}={v}" for k, v in keep.items())


@contextlib.contextmanager
def quiet_logs() -> Iterator[None]:
    """The agents log at INFO as chaosd does; a simulation of thousands of runs keeps only
    errors (a run that fails is replayed with its trace). The levels are put back after the
    run: left at CRITICAL, they silenced the tests that ran next in the same process (a test
    of chaosd's one-line warnings found no line)."""
    loggers = [logging.getLogger(name) for name in ("chaosd", "chaos")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        for lg, level in zip(loggers, levels, strict=True):
            lg.setLevel(level)
