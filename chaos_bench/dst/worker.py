"""A training worker, simulated: the real protocol code around a modelled data plane.

It talks to its box's real agent through the real control handlers (``worker.attach``,
``worker.poll``, ``worker.report``, ``worker.leave``, ``worker.detach`` of
:mod:`daemon.agent.ops`), parses what it gets with the real parsers, files policies in the real
:class:`~chaos_edge.trainer.policy.PolicyBook`, and decides its joins and its serving with the
real :class:`~chaos_edge.trainer.scaleout.JoinMachine` and
:class:`~chaos_edge.trainer.scaleout.ServeMachine`. Only what moves tensors is modelled
(:mod:`chaos_bench.dst.plane`).

Like the ``Trainer``: a worker that is not in the policy of its next round rejoins; one that
gets no round done within its step timeout says so and waits on, holding its state; one that
cannot reach its daemon, or finds itself behind the others, exits with an error, and its
supervisor starts it again.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from chaos_bench.dst.loop import Sim, drive
from chaos_bench.dst.plane import DataPlane, Pull, State
from chaos_edge.trainer.policy import PolicyBook
from chaos_edge.trainer.scaleout import (
    AskAgain,
    Fetch,
    GiveUp,
    Joined,
    JoinMachine,
    ServeMachine,
    StartAlone,
    Wait,
    standing,
)
from daemon.agent import ops
from daemon.contracts.errors import ControlError, MessageError
from daemon.contracts.policy import SyncPolicy, parse
from daemon.contracts.protocol import (
    Bootstrap,
    LinkFailed,
    Replicate,
    Replicated,
    RoundAborted,
    RoundStuck,
    ServeDeclined,
    Stall,
    StateRefused,
    WorkerReport,
    parse_worker_command,
)

if TYPE_CHECKING:
    from daemon.agent.node import NodeAgent

STEP_TIMEOUT_S = 120.0  # the Trainer's default step timeout
SNAPSHOT_EVERY = 20  # steps between snapshots ([snapshots] every_steps; every_s 0 here)
SNAPSHOT_WRITE_S = 0.2  # how long a write takes: a crash inside it loses that one
SNAPSHOT_KEEP = 3
JOIN_TIMEOUT_S = 300.0  # the Trainer's default join timeout
DECLINE_P = 0.05  # a source's memory guard refuses now and then
ELEMENTS = 10_000  # the gradient it says it has (the policy controller's cost model)


class SimWorker:
    """One process of a training script on one box (a new one after each restart).

    Args:
        sim: The simulation.
        agent: The box's chaosd (real).
        plane: The modelled data plane.
        state: The state this process starts with (a fresh model, or what it held).
        exits: Called with (node, code, why) when the process ends.
        events: Counts what happened (coverage) and records findings for the referee.
        pace: Seconds between two polls of chaosd, each followed by at most one step (the
            real poller: 20 ms; the plan's pace, 0.2 or 0.05 s).
    """

    def __init__(self, sim: Sim, agent: NodeAgent, plane: DataPlane, state: State,
                 exits: Callable[[str, int, str], None], events: Any, pace: float) -> None:
        self.sim, self.agent, self.plane, self.pace = sim, agent, plane, pace
        self.me = agent.me
        self.state = state
        self.exits, self.events = exits, events
        self.book = PolicyBook()
        self.phase = "attaching"  # attaching, joining, active, leaving, gone
        self.version = -1  # policy of the last committed round
        self.alive, self.frozen = True, False
        self.pid = 0  # the process id it attaches with, unique in the run (set by its box)
        # Where its snapshots go (its box's disk; set by the box): every SNAPSHOT_EVERY steps.
        self.snapshot_to: Callable[[SimWorker, State], None] = lambda w, st: None
        self.join: JoinMachine | None = None
        self.serve = ServeMachine(self.me)
        self.mine: Replicate | Bootstrap | None = None  # the newest command naming us new
        self.pull: Pull | None = None
        self.was_member = False
        self._round_since: float | None = None  # when we began to wait for the next round
        self._alarm_at = 0.0  # when the step alarm last rang (or the wait began)
        self._reported: set[tuple[int, str]] = set()  # (policy version, peer) link failures
        self.join_started: float | None = None
        self._near: tuple[int, tuple[str | None, ...]] | None = None  # tree neighbours
        self.misfit = False  # this script's model is not the cluster's: it refuses the state
        self.in_touch = True  # chaosd's word at the last poll
        self.term = 0  # likewise
        # Its box's slowness (a step takes that many paces), and whether it says its compute
        # as the Trainer does (set by its box; only plans that run the controller do, so the
        # others replay as before).
        self.slowness: Callable[[], float] = lambda: 1.0
        self.says_compute = False
        self._computing_until = 0.0  # a slow step ends then

    # --- lifecycle ----------------------------------------------------------------------
    def runs(self) -> bool:
        return self.alive and not self.frozen

    def start(self) -> None:
        self.sim.at(0.05 + self.sim.rng.random() * self.pace, self._attach)

    def _attach(self) -> None:
        if not self.runs():
            if self.alive:
                self.sim.at(self.pace, self._attach)
            return
        try:
            drive(ops.worker_attach(self.agent, {"pid": self.pid, "port": 7000,
                                                 "host": "127.0.0.1",
                                                 "step": self.state.step}))
        except ControlError as exc:
            self.exit(1, f"attach refused: {exc}")
            return
        self.events.count("op:worker.attach")
        self._begin_join()
        self.sim.at(self.pace, self._tick)

    def _begin_join(self) -> None:
        self.phase = "joining"
        self.join = JoinMachine(self.me, self.sim.clock.monotonic() + JOIN_TIMEOUT_S)
        self.join_started = self.sim.now
        self.events.join_started(self.me)
        if self.mine is not None:
            self.join.offer(self.mine)
            self.mine = None

    def exit(self, code: int, why: str) -> None:
        """The process ends (an error, or done after a leave)."""
        if not self.alive:
            return
        self.alive = False
        self.plane.forget(self.me)
        self.events.count(f"worker-exit:{'ok' if code == 0 else 'error'}")
        if self.phase == "joining":
            self.events.join_ended(self.me, "abandoned", why)
        self.sim.note(f"{self.me} worker exits {code}: {why}")
        self.exits(self.me, code, why)

    def kill(self) -> None:
        """SIGKILL (or the box lost power): no goodbye."""
        if self.alive:
            self.alive = False
            self.plane.forget(self.me)
            if self.phase == "joining":
                self.events.join_ended(self.me, "abandoned", "killed")

    def stale(self, why: str) -> None:
        """The agreement found us behind the others: the Trainer raises, the script exits."""
        self.events.count("worker:stale")
        self.exit(1, f"StateDiverged: {why}")

    # --- the loop -----------------------------------------------------------------------
    def _tick(self) -> None:
        if not self.alive:
            return
        self.sim.at(self.pace, self._tick)
        if self.frozen:
            return
        if not self._poll():
            return
        if self.plane.refuse_unnamed(self.me, self.serve.waiting):
            self.events.count("worker:serve-refused")
        if self.phase == "joining":
            self._joining()
        elif self.phase in ("active", "leaving"):
            self._training()

    def _poll(self) -> bool:
        w = self.agent.worker
        args: dict[str, Any] = {"step": self.state.step,
                                "state": "leaving" if self.phase == "leaving" else
                                ("active" if self.phase == "active" else "joining"),
                                "policy_version": self.book.newest_version}
        if self.version >= 0:
            args["committed_version"] = self.version
        if self.says_compute:
            args.update(compute_ms=round(self.pace * self.slowness() * 1e3, 3),
                        elements=ELEMENTS)
        try:
            data = ops.worker_poll(self.agent, args)
        except ControlError as exc:  # chaosd dropped us (a hang), or restarted
            self.exit(1, f"DaemonUnreachable: {exc}")
            return False
        del w
        known = self.book.newest_version
        for doc in [*(data.get("policies") or []), data.get("policy")]:
            # As the Poller does: the current policy comes with every answer; parse it once.
            if not isinstance(doc, dict) or not isinstance(doc.get("version"), int) or \
                    doc["version"] <= known:
                continue
            pub = parse(doc)
            if pub is not None and self.book.put(pub) is not None:
                self.events.count("policy")
        for raw in data.get("commands") or []:
            try:
                cmd = parse_worker_command(str(raw.get("op")), raw.get("args"))
            except MessageError as exc:
                self.events.violation("malformed-command", f"{self.me}: {exc}")
                continue
            self.events.count(f"worker-cmd:{cmd.OP}")
            if isinstance(cmd, (Replicate, Bootstrap)) and cmd.new == self.me:
                if self.join is not None and self.phase == "joining":
                    self.join.offer(cmd)
                else:
                    self.mine = cmd
            elif isinstance(cmd, Replicate):
                self.serve.offer(cmd)
        self.in_touch = data.get("in_touch") is not False
        self.term = int(data.get("term") or 0)
        if data.get("leave") and self.phase == "active":
            drive(ops.worker_leave(self.agent, {"step": self.state.step}))
            self.events.count("op:worker.leave")
            self.phase = "leaving"
        return True

    def report(self, rep: WorkerReport) -> None:
        try:
            drive(ops.worker_report(self.agent, rep.to_args()))
        except ControlError as exc:
            self.events.violation("report-refused", f"{self.me} {rep.KIND}: {exc}")
            return
        self.events.count(f"report:{rep.KIND}")

    # --- joining ------------------------------------------------------------------------
    def _joining(self) -> None:
        assert self.join is not None
        if self.pull is not None:
            self._pulling()
            if self.pull is not None:
                return
        action = self.join.advance(self.sim.clock.monotonic(), self.book.newest,
                                   in_touch=self.in_touch, term=self.term)
        if isinstance(action, Fetch):
            self.pull = self.plane.start_pull(self.me, tuple(sorted(action.command.sources)),
                                              action.command.version_step)
        elif isinstance(action, StartAlone):
            # A former member carries on from its own state; a new one from a fresh model.
            self.events.bootstrap(self.me, self.state)
            self.sim.note(f"{self.me} bootstraps from step {self.state.step}")
        elif isinstance(action, Joined):
            self.phase = "active"
            self.was_member = True
            self._round_since = None
            self.events.join_ended(self.me, "member", "")
            self.sim.note(f"{self.me} is a member at step {self.state.step}")
        elif isinstance(action, AskAgain):  # as the Trainer's Joiner: attach again
            self.events.count("worker:ask-again")
            drive(ops.worker_attach(self.agent, {"pid": self.pid, "port": 7000,
                                                 "host": "127.0.0.1",
                                                 "step": self.state.step}))
        elif isinstance(action, GiveUp):
            self.exit(1, f"TrainerError: {action.reason}")
        elif not isinstance(action, Wait):  # pragma: no cover - every action has a branch
            raise AssertionError(action)

    def _pulling(self) -> None:
        assert self.pull is not None and self.join is not None
        if self.join.superseded:
            self.pull = None
            self.plane.end_pull(self.me)
            self.join.fetched(False, self.sim.clock.monotonic())
            return
        verdict, got = self.plane.step_pull(self.pull)
        if verdict == "wait":
            return
        pull, self.pull = self.pull, None
        self.plane.end_pull(self.me)
        if verdict == "fail" or got is None:
            self.join.fetched(False, self.sim.clock.monotonic())
            return
        if self.misfit:  # the Trainer's fit check: refuse before loading anything, and exit
            self.join.refused()
            self.report(StateRefused(reason=f"{self.me} cannot join cluster state of step "
                                     f"{got.step}: model entry 'w' differs (simulated)"))
            self.exit(1, "StateMismatch")
            return
        self.events.restored(self.me, got)
        self.state = got
        plan = self.join.command.policy_version if self.join.command is not None else None
        self.report(Replicated(version=got.step, bytes=1 << 20, plan=plan,
                               delay_ms=round((self.sim.now - pull.started) * 1e3, 3),
                               sources=sorted(pull.chosen),
                               declined={s: "memory" for s in pull.sources
                                         if (s, self.me) in self.plane.declined}))
        self.join.fetched(True, self.sim.clock.monotonic())

    # --- training -----------------------------------------------------------------------
    def _training(self) -> None:
        nxt = self.book.for_round(self.state.step + 1)
        for rep in self.serve.due(self.state.step, nxt):
            if self.sim.rng.random() < DECLINE_P:
                self.plane.decline(self.me, rep.new)
                self.report(ServeDeclined(new=rep.new, reason="not enough memory (simulated)"))
            else:
                self.plane.offer(self.me, rep.new, self.state)
                self.events.count("serve")
        pub = nxt
        verdict = standing(pub, self.me, leaving=self.phase == "leaving")
        if verdict == "wait" or pub is None:
            self._waiting_for_round()
            return
        if verdict != "member":
            self.plane.unready(self.me)
            if verdict == "left":
                ops.worker_detach(self.agent, {"pid": self.pid})
                self.events.count("op:worker.detach")
                self.phase = "gone"
                self.exit(0, "left")
                return
            # Dropped (failed, or on the losing side of a partition): only a fresh replica
            # lets us back in, even when a newer policy adds us back.
            self.sim.note(f"{self.me} is not in policy v{pub.version}; rejoins")
            self.events.count("worker:rejoin")
            drive(ops.worker_attach(self.agent, {"pid": self.pid, "port": 7000,
                                                 "host": "127.0.0.1",
                                                 "step": self.state.step}))
            self._begin_join()
            return
        if not self.in_touch:  # as the Trainer: no round while chaosd is out of touch
            self.plane.unready(self.me)
            self._waiting_for_round()
            return
        if self.sim.now < self._computing_until:  # a slow box's step is not done yet
            return
        was = self.plane.ready.get(self.me)
        if was is not None and was[0] == self.state.step + 1 and was[1] != pub.version:
            # The round we were in is superseded by a newer policy: the real Trainer's round
            # aborts, is reported, and reruns under the new one.
            self.report(RoundAborted(step=was[0], reason=f"superseded by policy v{pub.version}"))
        self.plane.set_ready(self.me, self.state.step + 1, pub)
        self._link_failures(pub)
        if not self.plane.try_commit(self.me, pub):
            self._waiting_for_round()

    def _waiting_for_round(self) -> None:
        now = self.sim.now
        if self._round_since is None:
            self._round_since = self._alarm_at = now
        elif now - self._alarm_at > STEP_TIMEOUT_S:
            # As the Trainer's step alarm: said, and waited on with the state kept.
            self._alarm_at = now
            self.report(RoundStuck(step=self.state.step + 1,
                                   waited_s=round(now - self._round_since, 3),
                                   reason="step timeout (simulated)"))
            self.events.count("worker:round-stuck")

    def _link_failures(self, pub: SyncPolicy) -> None:
        """A tree neighbour our data plane cannot reach: its socket breaks, we report it."""
        me = self.me
        if self._near is None or self._near[0] != pub.version:
            self._near = (pub.version, (pub.parent(me), *pub.children(me)))
        for peer in self._near[1]:
            if not peer or (pub.version, peer) in self._reported:
                continue
            if not self.plane.reach(me, peer) or not self.plane.workers.get(peer) or \
                    not self.plane.workers[peer].alive:
                self._reported.add((pub.version, peer))
                self.report(LinkFailed(peer=peer, reason="connection reset (simulated)"))

    def committed(self, rnd: int, pub: SyncPolicy, digest: str) -> None:
        """The plane committed round ``rnd`` under ``pub`` for us: our state is ``digest``."""
        self.state = State(rnd, digest)
        if pub.version != self.version and self._round_since is not None:
            waited = self.sim.now - self._round_since
            if waited > 1.0:  # the first step under a new policy says what it cost
                self.report(Stall(step=rnd, ms=round(waited * 1e3, 3),
                                  policy_version=pub.version))
        self.version = pub.version
        self._round_since = None
        self._computing_until = self.sim.now + self.pace * (self.slowness() - 1.0)
        if rnd % SNAPSHOT_EVERY == 0:  # the Trainer's schedule, with every_s 0
            self.snapshot_to(self, self.state)
        self.plane.withdraw(self.me, pub.members)
        for m in pub.members:
            self.serve.forget(m)
