"""What the elected node does: the scheduler's state, its negotiator, and its outputs.

A :class:`SchedulerRole` exists only while this node holds the term it was elected in; the
agent drops it on stepping down, so nothing here can act under a stale term. Every output is
a term-stamped command or the retained snapshot, both fenced by the followers.
"""

from __future__ import annotations

import logging
from typing import Protocol, cast

from daemon.cluster.adapter import Adapter
from daemon.cluster.detector import PhiAccrualDetector
from daemon.cluster.election import Election
from daemon.cluster.keepers import Keepers
from daemon.cluster.primitives import Negotiator
from daemon.cluster.scheduler import Scheduler
from daemon.contracts.clock import Clock
from daemon.contracts.config import Config
from daemon.contracts.messages import (
    ClusterState,
    Command,
    Heartbeat,
    Request,
    Status,
    Topics,
    encode,
)
from daemon.contracts.policy import TERM_POLICY_SPAN
from daemon.contracts.protocol import CommandBody, PolicyRequest, Reply, RequestBody, Strategy

log = logging.getLogger("chaosd.leader")


class RoleHost(Protocol):
    """What the role needs of the node that hosts it (the agent's ``NodeAgent``).

    A protocol, so that the pure cluster logic never imports the asyncio agent, and the
    unit tests can host a role on a fake.
    """

    me: str
    cfg: Config
    clock: Clock
    topics: Topics
    election: Election
    detector: PhiAccrualDetector
    view: ClusterState | None
    presence: dict[str, Status]

    def own_status(self) -> Status: ...
    def own_heartbeat(self) -> Heartbeat: ...
    def step_of(self, node: str) -> int: ...
    def reported_step(self, node: str) -> int: ...
    def heard_steps(self) -> dict[str, int]: ...
    def view_outdated(self) -> bool: ...
    def daemon_alive(self, node: str) -> bool: ...
    def silence(self, node: str) -> float | None: ...
    def queue(self, topic: str, payload: bytes, qos: int = 1, retain: bool = False) -> None: ...


class SchedulerRole:
    """The scheduler duties of ``agent`` for its current term."""

    def __init__(self, agent: RoleHost, previous: str | None) -> None:
        self.agent = agent
        self.term = agent.election.term
        self.sched = Scheduler(agent.me, self.term, agent.view, agent.clock)
        snaps = agent.cfg.snapshots
        self.neg = Negotiator(self.sched, agent.clock, agent.step_of, agent.daemon_alive,
                              strategy=cast(Strategy, agent.cfg.replication.strategy),
                              wire=agent.cfg.training.wire,
                              sync=agent.cfg.training.sync_mode(),
                              reported=agent.reported_step,
                              keepers=Keepers(snaps.copies, snaps.every_steps, agent.clock)
                              if snaps.enabled and snaps.copies > 0 else None,
                              shelf_of=self._shelf_of)
        self._cmd_seq = 0
        # After the view's policy is known: a new scheduler goes on under the policy in force.
        self.adapter = Adapter(self.sched, self.neg, agent.cfg.adaptive, agent.cfg.training,
                               agent.clock)
        # The snapshot's step lags (it is published on changes, not every step); the members'
        # last heartbeats said newer ones. Resumed from the snapshot alone, a joiner behind
        # them that took the seat started the cluster over from its older state while the
        # frozen member holding the newest came back (the simulator's seed 8852).
        for node, step in agent.heard_steps().items():
            rec = self.sched.nodes.get(node)
            if rec is not None and rec.state == "active" and step > self.sched.step:
                self.sched.step = step
        if agent.view_outdated():
            self.neg.doubt_own()
        self.take_own(agent.own_status())
        self.take_own_heartbeat(agent.own_heartbeat())
        self.take_presence(list(agent.presence.values()))
        self.govern_at_once()
        silence = agent.silence(previous) if previous else None
        log.warning("elected scheduler, term %d (previous: %s)", self.term, previous)
        self.sched.record("scheduler-elected", node=agent.me, previous=previous,
                          term_previous=agent.view.term if agent.view else 0,
                          delay_ms=None if silence is None else silence * 1000.0)

    def govern_at_once(self) -> None:
        """Publish a policy of this term's numbers, effective at once, over the one inherited.

        The old term's scheduler, cut off, may have published one more policy before it heard
        of this term: some members took it, others never will (a retained policy of ours
        replaced it), and a round under two versions never commits. Ours is the newest for
        every round not yet committed, so the members rerun at most one round under it (the
        simulator's seed 11774: round 211 under v1000004 on one member and v1000003 on the
        other, while this term's first policy took effect only at 213: no round for 90 s).
        """
        if self.sched.policy is not None and self.sched.policy.members:
            self.neg.publish_policy(effective_step=0)

    def outbid(self, term: int, rival: str, own: int, theirs: int) -> None:
        """We won a contest: lead ``term``, above the rival's. A policy of the new term's
        numbers, effective at once, is the newest everywhere, so the rival's members find
        themselves outside it and rejoin by scale-out; ours rerun one round under it."""
        self.term = self.sched.term = term
        self.sched.policy_version = max(self.sched.policy_version,
                                        (term - 1) * TERM_POLICY_SPAN)
        log.warning("outbid %s: %d nodes train under us, %d under it; term %d", rival, own,
                    theirs, term)
        self.sched.record("scheduler-elected", node=self.agent.me, previous=rival,
                          term_previous=term - 1, contest={"own": own, "rival": theirs})
        self.neg.publish_policy(effective_step=0)
        self.sched.dirty = True

    def _shelf_of(self, node: str) -> str:
        """Where ``node``'s shelf takes copies of snapshots, from its presence ("": none)."""
        st = self.agent.presence.get(node) if node != self.agent.me else \
            self.agent.own_status()
        return f"{st.addr}:{st.shelf_port}" if st is not None and st.shelf_port and \
            st.addr else ""

    # --- outputs --------------------------------------------------------------------------
    def command(self, node: str, body: CommandBody) -> None:
        """Queue a term-stamped command to ``node`` (the scheduler's only way to act)."""
        self._cmd_seq += 1
        cmd = Command(term=self.term, leader=self.agent.me, seq=self._cmd_seq, op=body.OP,
                      args=body.to_args())
        self.agent.queue(self.agent.topics.cmd(node), encode(cmd))

    def flush(self) -> None:
        """Send what the negotiator decided."""
        out, self.neg.out = self.neg.out, []
        for node, body in out:
            self.command(node, body)

    def snapshot(self) -> ClusterState:
        self.sched.prune()
        return self.sched.snapshot()

    # --- inputs ---------------------------------------------------------------------------
    def on_request(self, req: Request, body: RequestBody) -> None:
        """Apply one parsed request; answer it if the requester waits for the answer."""
        log.info("request %s from %s", req.op, req.node)
        if isinstance(body, PolicyRequest):
            error = self.adapter.request(body)
        else:
            error = self.neg.handle(req.node, body)
        if req.reply:
            self.command(req.node, Reply(req_id=req.req_id, error=error))
        elif error:
            log.warning("request %s from %s refused: %s", req.op, req.node, error)
        self.flush()

    def refuse(self, req: Request, error: str) -> None:
        """Answer a request that could not be parsed, if its sender waits for an answer."""
        if req.reply:
            self.command(req.node, Reply(req_id=req.req_id, error=error))

    def on_heartbeat(self, hb: Heartbeat, addr: str) -> None:
        self.sched.observe_heartbeat(hb, addr)
        # The worker's own step: the daemon's (hb.step) is its last poll's, which lags a
        # worker that just attached with a restored snapshot or nothing.
        self.neg.observe_worker(hb.node, hb.state, hb.holds, attached=hb.holds >= 0,
                               snapshot=hb.snapshot, policy_version=hb.policy_version)
        self.neg.observe_progress()
        self.adapter.heard(hb)
        self.flush()

    def take_own(self, st: Status) -> None:
        """At election, our own box is judged like any other: back as a new process (a power
        cut of every box), its worker holds a snapshot at most, not the state the record says
        it trains. Kept as a member, joins were planned from it at step 0, and its rounds
        waited on joiners that had no state (the soak: no step for two minutes)."""
        self.on_status(st)

    def take_own_heartbeat(self, hb: Heartbeat) -> None:
        """At election: our worker's state and our disk's newest snapshot, as our next
        heartbeat says them. Its echo through the broker came after the first join was judged,
        and a peer's older snapshot started the cluster over beside the newer one on our own
        disk (the e2e power cut with the broker: 368 bootstrapped while our disk held 372)."""
        self.on_heartbeat(hb, self.agent.cfg.advertise)

    def take_presence(self, statuses: list[Status]) -> None:
        """At election: act on the presence the old scheduler may never have acted on (it
        died, or left, a moment after). A member whose daemon left or died is scaled in now,
        by a policy: marked left without one, its old policy still named it, and the members
        waited on it for rounds no one could finish (the simulator's seed 319: for 100 s,
        until a join's policy happened to replace it)."""
        for st in statuses:
            self.on_status(st)

    def on_status(self, st: Status) -> None:
        verdict = self.sched.observe_status(st)
        if verdict == "lost":
            self.fail(st.node, "last-will")
        elif verdict == "restarted":
            self.fail(st.node, "restarted")
            self.sched.observe_status(st)  # failed now: admitted again as a standby
        elif verdict == "left":
            self.neg.gone(st.node, "daemon-left")
            self.flush()

    def fail(self, node: str, reason: str) -> None:
        """Declare ``node`` failed (``node-failed``) and scale it in (a new policy at once)."""
        self.sched.fail(node, reason, self.agent.silence(node))
        self.neg.gone(node, "failure")
        self.flush()

    def judge(self, live: set[str]) -> None:
        """Every tick: fail every admitted node that is not ``live``, and let the negotiator
        decide what waits on time (a join held for a holder of the state)."""
        self.neg.tick()
        self.adapter.tick()
        self.flush()
        agent = self.agent
        for node in self.sched.live():
            if node == agent.me:
                continue
            if node not in agent.detector.known():
                # Admitted (status "up") but not heard yet: start the clock now, so a node
                # frozen before its first heartbeat is still caught by the detector.
                agent.detector.heartbeat(node, seed=True)
                continue
            if node not in live:
                st = agent.presence.get(node)
                self.fail(node, "last-will" if st is not None and not st.online else
                          "heartbeat")
