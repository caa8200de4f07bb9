"""The node agent: what one chaosd does on the bus.

It sends heartbeats, takes part in the scheduler election, mirrors the retained cluster state,
and, while elected, runs the :class:`~daemon.cluster.scheduler.Scheduler`. Only the scheduler
hears every heartbeat (and every request); a follower hears the scheduler's, so the broker
delivers O(N) heartbeats per interval, not N^2 (see ``_wanted_topics``). Presence (retained,
silent between changes) still reaches everyone: it ranks the candidates of an election.
Message handlers only update state; the periodic :meth:`NodeAgent.tick` makes the decisions,
so the order in which messages arrive never matters more than one tick (0.1 s). Claims, the
snapshot it follows and contests after a partition are :mod:`daemon.agent.leadership`'s.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from daemon.agent.bus import Bus, Outgoing
from daemon.agent.copies import SnapshotCopies
from daemon.agent.leadership import Leadership
from daemon.agent.memory import TermMemory
from daemon.agent.metrics import AgentMetrics
from daemon.agent.probes import LinkMonitor, PeerEndpoint
from daemon.agent.resources import Resources, sample
from daemon.agent.worker import WorkerSession, WorkerSupervisor, pid_alive, unresponsive_for
from daemon.cluster.detector import PhiAccrualDetector
from daemon.cluster.election import Action, Election, Heard, Holding
from daemon.cluster.role import SchedulerRole
from daemon.cluster.scheduler import Scheduler
from daemon.contracts.clock import Clock, SystemClock
from daemon.contracts.config import Config
from daemon.contracts.errors import MessageError
from daemon.contracts.kinds import LIVE_STATES, WorkerExitReason
from daemon.contracts.messages import (
    ClusterState,
    Command,
    Event,
    Heartbeat,
    LeaderClaim,
    Request,
    Status,
    Topics,
    decode,
    encode,
)
from daemon.contracts.policy import policy_term
from daemon.contracts.protocol import (
    Bootstrap,
    CopySnapshot,
    JoinRequest,
    Replicate,
    Reply,
    RequestBody,
    WorkerExit,
    parse_command,
    parse_request,
)
from daemon.contracts.ratelog import RateLimitedLog
from daemon.contracts.signing import AuthError
from daemon.contracts.snapshots import SNAPSHOT_DIR, newest_snapshot_step

log = logging.getLogger("chaosd.node")
REPUBLISH_S = 5.0       # the scheduler refreshes the retained state this often
SELF_PAUSE_S = 1.0      # a tick gap this long means *we* were paused (SIGSTOP, swap storm)
JOIN_ASK_AGAIN_S = 5.0  # a join request no command answered goes again this often
# We hear our own heartbeats back from the broker (we subscribe to them). Silent this long,
# our path to the broker is broken even if the connection has not noticed yet (a keepalive
# takes seconds): everyone else's silence is then ours, and we judge nobody.
ECHO_S = 1.6
# A scheduler out of touch this long may have been replaced: the others fail a silent
# scheduler and elect another in about 3 s (detection, then the stagger).
LONG_CUT_S = 2 * ECHO_S
# A broker that shuts down may publish every client's last will as it goes. A will that is
# not followed by the loss of our own connection within this window is a real crash.
WILL_CONFIRM_S = 0.5
AUTH_LOG_S = 10.0  # at most one line per this long about messages that fail authentication


class NodeAgent:
    """One node's membership, election and (when elected) scheduling logic."""

    def __init__(self, cfg: Config, clock: Clock | None = None,
                 resources: Callable[[], Resources] = sample,
                 alive: Callable[[int], bool] = pid_alive) -> None:
        self.cfg = cfg
        self.me = cfg.node_id
        self.clock = clock or SystemClock()
        self.resources = resources  # the heartbeat's readings (a seam: the simulator's differ)
        self.pid_alive = alive  # whether a process exists (a seam: the simulator's are modelled)
        self.topics = Topics(cfg.cluster)
        # Distinguishes this process from earlier (or zombie) ones with the same node id:
        # microseconds of wall time at start, from the clock (the simulator replays it).
        self.incarnation = int(self.clock.wall() * 1_000_000)
        self.detector = PhiAccrualDetector(cfg.detector, self.clock)
        self.election = Election(self.me, cfg.election, self.clock)
        self.memory = TermMemory(cfg.data_dir, cfg.cluster)
        self.election.restore(self.memory.load())
        self.role: SchedulerRole | None = None  # only while elected, for that term
        self.monitor: LinkMonitor | None = None  # set by the daemon once the probes listen
        self.copies: SnapshotCopies | None = None  # set by the daemon once its shelf listens
        self.worker = WorkerSession()
        self.supervisor = WorkerSupervisor(cfg.data_dir, {
            "CHAOS_SOCKET": cfg.socket, "CHAOS_NODE_ID": cfg.node_id,
            "CHAOS_CLUSTER": cfg.cluster}, nice=cfg.worker.nice)
        self.supervisor.on_exit.append(self._worker_exited)
        self._req_seq = 0
        # Requests whose reply someone awaits (ask): registered and removed by ask alone, so
        # nothing is left behind when the answer never comes.
        self._replies: dict[str, asyncio.Future[str | None]] = {}
        self.view: ClusterState | None = None
        self.presence: dict[str, Status] = {}
        self.beats: dict[str, Heartbeat] = {}
        self.events: dict[tuple[int, float], Event] = {}
        # version -> policy as the wire carries it (SyncPolicy.to_dict), for worker.poll
        self.policies: dict[int, dict[str, Any]] = {}
        self.counters: Counter[str] = Counter()
        self.leadership = Leadership(self)  # claims and verdicts (reads the fields above)
        self.metrics = AgentMetrics(cfg.metrics.listen)  # served by Daemon.startup
        self.state = "standby"
        self.step = 0
        self.started = self.clock.monotonic()
        self.should_exit = False
        self.exit_reason = ""
        self._hb_seq = 0
        self._last_tick: float | None = None
        # Paused (SIGSTOP, a suspend) since the last view we had: what the cluster decided
        # meanwhile is unknown to us until the scheduler's next snapshot (see view_outdated).
        self.paused_since_view = False
        self._last_publish = 0.0
        self._last_leader: str | None = None
        # Until then, silence is not judged: peers may reconnect up to one backoff after us.
        self._judge_after = 0.0
        # When our own last heartbeat came back: a peer's silence counts only up to then, for
        # the broker forwards in order, so whatever a peer sent before it reached us before
        # it. Judged up to now, the cut-off node blamed its peers up to ECHO_S before it knew
        # itself deaf, and elected itself (the simulator's seed 6355).
        self._echo_at: float | None = None
        self._heard_self_at: float | None = None  # likewise, but never credited in advance
        self._connected_at = 0.0
        self._held_requests: list[tuple[Request, RequestBody]] = []  # during a contest
        # As scheduler back from a long cut: act on nothing until then (see _holding).
        self._hold_until = 0.0
        self._statuses_held = False  # statuses that came during that hold, judged after it
        self._deaf = False  # our heartbeats stopped coming back (see ECHO_S)
        self._pending: list[Outgoing] = []
        self._wills: dict[str, tuple[Status, float]] = {}
        # Last heartbeat per node; unlike the detector's history it survives a last will,
        # so failure events can say how long the node had been silent.
        self.last_heard: dict[str, float] = {}
        self._step_rates: dict[str, tuple[float, float]] = {}  # node -> (steps/s, when)
        # The wall time of the current connection: our "up" statuses and the last will of that
        # connection carry it, so a peer can tell a replayed will of an earlier one (older).
        self._conn_ts = self.clock.wall()
        self._auth_failures = RateLimitedLog(
            log, "dropped %d control message(s) that failed authentication; last on %s",
            self.clock, AUTH_LOG_S)
        self._rejects = RateLimitedLog(
            log, "dropped %d malformed control message(s); last: dropped message on %s",
            self.clock, AUTH_LOG_S)
        self._repair_retained = False  # a forgery overwrote the retained claim or snapshot
        self.bus = Bus(
            cfg,
            client_id=f"chaos-{cfg.cluster}-{self.me}",
            will=self._will,
            subscriptions=sorted(self._wanted_topics()),
            on_message=self.on_message,
            on_connect=self.on_connect,
            on_disconnect=self.on_disconnect,
            on_auth_error=self.on_auth_error,
            wall=self.clock.wall,
        )

    # --- subscriptions ------------------------------------------------------------------
    def watches(self, node: str) -> bool:
        """Do we hear ``node``'s heartbeats? All of them while we schedule; otherwise the
        scheduler's, and the previous one's until a new one is followed (so that a frozen
        ex-scheduler stays judged dead and out of the next election's ranking)."""
        return self.role is not None or node in (self.election.leader, self._last_leader)

    def _wanted_topics(self) -> set[str]:
        t = self.topics
        # Our own heartbeats too: hearing them back is how we know the broker hears us.
        wanted = {f"{t.root}/node/+/status", t.cmd(self.me), t.leader, t.state, t.hb(self.me)}
        if self.role is not None:
            return wanted | {f"{t.root}/node/+/hb", t.req}
        return wanted | {t.hb(n) for n in (self.election.leader, self._last_leader)
                         if n is not None and n != self.me}

    def watch_leader(self) -> None:
        """Judge the accepted scheduler's silence from now on, unless it is known to be gone
        (the claim can arrive before its first heartbeat, or before we subscribed to it)."""
        leader = self.election.leader
        if leader is None or leader == self.me or leader in self.detector.known():
            return
        st = self.presence.get(leader)
        if st is None or st.online:
            self.detector.heartbeat(leader, seed=True)

    async def _sync_subscriptions(self) -> None:
        """Follow the role: forget whom we no longer hear, and tell the broker."""
        for node in self.detector.known():
            if not self.watches(node):
                self.detector.forget(node)
                self.beats.pop(node, None)
        self.watch_leader()
        self.bus.want(self._wanted_topics())
        await self.bus.sync()

    # --- outgoing -----------------------------------------------------------------------
    @property
    def scheduler(self) -> Scheduler | None:
        """The scheduler's state while elected, else None."""
        return self.role.sched if self.role is not None else None

    def own_status(self) -> Status:
        return self._status(True, "up")

    def _will(self) -> Outgoing:
        """The last will of the connection about to open (the bus asks at every connect)."""
        self._conn_ts = self.clock.wall()
        return Outgoing(self.topics.status(self.me), encode(self._status(False, "lost")), 1,
                        True)

    def _status(self, online: bool, reason: str) -> Status:
        mon = self.monitor
        ts = self.clock.wall() if reason == "left" else self._conn_ts
        return Status(node=self.me, online=online, reason=reason, incarnation=self.incarnation,
                      addr=self.cfg.advertise, ts=ts, term=self.election.term,
                      probe_port=mon.probe_port if mon else 0, bw_port=mon.bw_port if mon else 0,
                      bw_kind=mon.bandwidth.kind if mon else "",
                      shelf_port=self.copies.port if self.copies else 0)

    @property
    def leader(self) -> str | None:
        """The scheduler this node follows, if any."""
        return self.election.leader

    @property
    def term(self) -> int:
        """The newest term this node knows."""
        return self.election.term

    def endpoint(self, node: str) -> PeerEndpoint | None:
        """Where ``node``'s probe servers listen, from its presence."""
        st = self.presence.get(node)
        if st is None or not st.online:
            return None
        return PeerEndpoint(st.addr, st.probe_port, st.bw_port, st.bw_kind)

    def _sync_probes(self) -> None:
        if self.monitor is None:
            return
        rec = self.view.nodes.get(self.me) if self.view is not None else None
        peers = {}
        for peer in rec.neighbors if rec is not None else []:
            ep = self.endpoint(peer)
            if ep is not None:
                peers[peer] = ep
        self.monitor.sync(peers)
        self.monitor.tick()

    def queue(self, topic: str, payload: bytes, qos: int = 1, retain: bool = False) -> None:
        """Handlers are synchronous; they queue, and the tick publishes."""
        self._pending.append(Outgoing(topic, payload, qos, retain))

    async def flush(self) -> None:
        pending, self._pending = self._pending, []
        for out in pending:
            await self.bus.publish(out.topic, out.payload, qos=out.qos, retain=out.retain,
                                   reliable=out.qos > 0)

    async def heartbeat(self) -> None:
        self._hb_seq += 1
        await self.bus.publish(self.topics.hb(self.me), encode(self.own_heartbeat()), qos=0)

    def own_heartbeat(self) -> Heartbeat:
        """What our next heartbeat says: a role elected here reads it at once, before its echo
        comes back through the broker."""
        res = self.resources()
        return Heartbeat(node=self.me, seq=self._hb_seq, incarnation=self.incarnation,
                         step=self.step, state=self.worker.state if self.worker.attached else
                         self.state, cpu_percent=res.cpu_percent,
                         mem_percent=res.mem_percent, battery_percent=res.battery_percent,
                         policy_version=self.worker.version if self.worker.attached else -1,
                         leader=self.election.leader or "", snapshot=self._snapshot_step(),
                         holds=self.worker.step if self.worker.attached else -1,
                         compute_ms=self.worker.compute_ms if self.worker.attached else -1.0,
                         elements=self.worker.elements if self.worker.attached else -1,
                         cannot_diloco=self.worker.cannot_diloco if self.worker.attached
                         else "")

    def _start_from(self) -> Holding:
        """What a scheduler elected here would start from: the cluster's snapshot (the
        retained view), else our worker's state or a snapshot of it on our disk, else nothing.
        After a power cut of every box and the broker, only the disks held the state: counted
        as holding nothing, every node waited ``election.orphan_s``, each broker restart
        began that wait again, and training resumed 96 s after the daemons returned (the
        soak's hour in stop 34). A holder of a state stands once the nodes with the view had
        their turn; whoever leads waits to hear the nodes up and goes on from the newest
        state they hold."""
        if self.view is not None:
            return Holding.VIEW  # the usual case: the disk is read only while no view is kept
        w = self.worker
        if (w.attached and w.step > 0) or self._snapshot_step() > 0:
            return Holding.STATE
        return Holding.NOTHING

    def _snapshot_step(self) -> int:
        """The newest snapshot on our disk, by name (what the worker restores if it starts)."""
        if not self.cfg.snapshots.enabled:
            return -1
        return newest_snapshot_step(Path(self.cfg.data_dir) / SNAPSHOT_DIR)

    async def leave(self) -> None:
        """Graceful exit: a retained 'left' status, so the last will never fires."""
        self.metrics.stop()
        await self.bus.publish(self.topics.status(self.me), encode(self._status(False, "left")),
                               qos=1, retain=True)

    # --- bus callbacks ------------------------------------------------------------------
    async def on_connect(self) -> None:
        self.election.connected()
        # Everyone's silence while we were cut off was ours, not theirs; and after a broker
        # outage the others reconnect on their own backoff, up to reconnect_max_s after the
        # broker is back, and then connect, subscribe and beat: on a loaded box that took more
        # than grace_s on top, and a peer failed for it costs a whole re-replication. So
        # forgive two backoffs (a node that died in the outage is found 5 s later).
        self.detector.reset_all()
        self._hold_after_cut()
        self._echo_at = self._connected_at = self.clock.monotonic()  # our first beat is on its
        # way back: not judged deaf meanwhile, but not in touch before it is back (in_touch)
        if self.bus.connects > 1:
            self._judge_after = (self.clock.monotonic() + 2 * self.cfg.mqtt.reconnect_max_s
                                 + self.cfg.election.grace_s)
        await self.bus.publish(self.topics.status(self.me), encode(self._status(True, "up")),
                               qos=1, retain=True)
        await self.heartbeat()
        if self.role is not None:
            self.leadership.queue_claim()
            self.role.sched.dirty = True

    def _hold_after_cut(self) -> None:
        """A scheduler back from a long cut holds its seat in doubt until it has heard the
        nodes it schedules, or one reconnect backoff: the others may have elected another
        meanwhile, trained on under it, and lost that claim with a broker restart. Acting at
        once on the link reports from before, ours scaled in a node of the other side, and a
        policy of our own had our one member commit round 21 on step 20 while the other side
        held 34 (the simulator's seed 635). Their heartbeats name the term we missed
        (:meth:`_learn_term`)."""
        now = self.clock.monotonic()
        since = self._heard_self_at if self._heard_self_at is not None else self._connected_at
        if self.role is not None and self.bus.connects > 1 and now - since > LONG_CUT_S:
            log.warning("back after %.1f s out of touch: acting on nothing until the nodes "
                        "are heard", now - since)
            self._hold_until = now + self.cfg.mqtt.reconnect_max_s

    def _holding(self, now: float) -> bool:
        """Is our seat in doubt: a contest runs, or we are back from a long cut and have not
        heard every node we schedule since (:meth:`_hold_after_cut`)?"""
        return self.election.contested is not None or self._cut_hold(now)

    def _cut_hold(self, now: float) -> bool:
        """Back from a long cut, and not every node we schedule heard since?"""
        if self.role is None or now >= self._hold_until:
            return False
        unheard = [n for n in self.role.sched.live() if n != self.me
                   and self.last_heard.get(n, -1.0) < self._connected_at]
        if not unheard:
            self._hold_until = 0.0
        return bool(unheard)

    def on_disconnect(self) -> None:
        self.election.disconnected()
        self._wills.clear()  # they came with the broker's own going away

    def on_message(self, topic: str, payload: bytes) -> None:
        """Validate and route one message; a bad one is counted, logged (at a rate limit)
        and dropped."""
        try:
            self._route(topic, payload)
        except MessageError as exc:
            self.counters["rejected"] += 1
            self._rejects.note(f"{topic}: {exc}")

    def on_auth_error(self, topic: str, exc: AuthError) -> None:
        """A message that failed authentication: dropped and counted; logged at a rate limit."""
        self.counters["auth_failed"] += 1
        self.counters[f"auth_{exc.reason.replace('-', '_')}"] += 1
        self._auth_failures.note(f"{topic}: {exc}")
        if topic in (self.topics.leader, self.topics.state) and exc.reason != "replayed":
            # New subscribers would find only the forgery there: the scheduler repairs it.
            self._repair_retained = True

    def _route(self, topic: str, payload: bytes) -> None:
        t = self.topics
        node = t.node_of(topic)
        if topic.endswith("/hb") and node:
            self._on_heartbeat(node, decode(payload, Heartbeat))  # type: ignore[arg-type]
        elif topic.endswith("/status") and node:
            self._on_status(node, decode(payload, Status))  # type: ignore[arg-type]
        elif topic == t.cmd(self.me):
            self._on_command(decode(payload, Command))  # type: ignore[arg-type]
        elif topic == t.leader:
            if payload:  # an empty retained payload only clears the topic
                self.leadership.on_claim(decode(payload, LeaderClaim))  # type: ignore[arg-type]
        elif topic == t.req:
            self._on_request(decode(payload, Request))  # type: ignore[arg-type]
        elif topic == t.state and payload:
            self.leadership.on_state(decode(payload, ClusterState))  # type: ignore[arg-type]

    def _on_heartbeat(self, node: str, hb: Heartbeat) -> None:
        if hb.node != node:
            raise MessageError(f"heartbeat for {hb.node!r} on the topic of {node!r}")
        if node == self.me:
            if hb.incarnation == self.incarnation:
                self._echo_at = self._heard_self_at = self.clock.monotonic()
                if self.role is not None:  # our own worker is one of the scheduler's nodes
                    self.role.on_heartbeat(hb, self.cfg.advertise)
            return
        if not self.watches(node):
            return  # one in flight from before an unsubscribe
        st = self.presence.get(node)
        if (st is not None and not st.online and st.reason == "left"
                and hb.incarnation <= st.incarnation):
            # Sent before its daemon said it left, delivered after (heartbeats and statuses
            # are separate topics and QoS): taken as a sign of life, it re-admitted the node,
            # which was then failed for its offline presence (a graceful leave logged as a
            # failure under load). A restarted daemon has a new incarnation and says "up".
            self.counters["late_beats"] += 1
            return
        now = self.clock.monotonic()
        self.detector.heartbeat(node)
        prev = self.beats.get(node)
        # A rate needs two beats of a worker that trains: one that restores a state jumps to
        # the cluster's step while joining, which read as a rate would put every planned
        # change far ahead (a leave right after a rejoin was set 300 steps out).
        if (prev is not None and prev.state == hb.state == "active"
                and prev.incarnation == hb.incarnation and hb.step >= prev.step
                and node in self.last_heard and now > self.last_heard[node]):  # fmt: skip
            inst = max(0, hb.step - prev.step) / (now - self.last_heard[node])
            old_rate = self._step_rates.get(node, (inst, now))[0]
            self._step_rates[node] = (0.7 * old_rate + 0.3 * inst, now)
        else:
            self._step_rates[node] = (0.0, now)
        self.last_heard[node] = now
        self.beats[node] = hb
        self._learn_term(hb)
        if self.role is not None:
            st = self.presence.get(node)
            self.role.on_heartbeat(hb, st.addr if st else "")

    def _on_status(self, node: str, st: Status) -> None:
        if st.node != node:
            raise MessageError(f"status for {st.node!r} on the topic of {node!r}")
        if node == self.me:
            if st.online and st.incarnation > self.incarnation:
                log.error("another chaosd with node id %r started; this one exits", self.me)
                self.exit_reason = "duplicate node id"
                self.should_exit = True
            elif not st.online and st.incarnation == self.incarnation and self.bus.connected:
                # The broker gave up on us once (keepalive) but we are here: say so again.
                self.queue(self.topics.status(self.me), encode(self._status(True, "up")),
                            retain=True)
            return
        prev = self.presence.get(node)
        if prev is not None and st.incarnation < prev.incarnation:
            return
        if (not st.online and st.reason == "lost" and prev is not None and prev.online
                and st.incarnation == prev.incarnation and st.ts < prev.ts):
            # The will of an earlier connection than the "up" we hold: replayed, or late.
            self.counters["stale_wills"] += 1
            return
        if (st.online and prev is not None and st.incarnation == prev.incarnation
                and st.ts < prev.ts):
            # Statuses skip the freshness window (a will fires long after it was signed):
            # an "up" of an earlier connection than the one we hold is a replay.
            self.counters["stale_statuses"] += 1
            return
        if not st.online and st.reason == "lost":
            self._wills[node] = (st, self.clock.monotonic())  # confirmed in tick()
            return
        if (st.online and node == self.election.leader and prev is not None
                and st.incarnation > prev.incarnation):
            # The scheduler's process restarted, so the one that held the term is dead, even
            # if its will never came (it died while the broker was away).
            log.warning("scheduler %s restarted; its term %d is over", node, self.election.term)
            self.election.leader_lost()
        self._wills.pop(node, None)
        self._apply_status(node, st)

    def _apply_status(self, node: str, st: Status) -> None:
        self.presence[node] = st
        if not st.online:
            if node == self.election.leader:
                self.election.leader_lost()
            self._status_to_role(st)
            self.detector.forget(node)
            return
        # "up" is a sign of life too: judge its silence from now on. This catches a node that
        # freezes before its first heartbeat, and it keeps a node that comes back (thawed,
        # reconnected) from being judged by the silence it has just ended.
        if self.watches(node):
            self.detector.heartbeat(node, seed=True)
        self._status_to_role(st)

    def _status_to_role(self, st: Status) -> None:
        """Let the role judge ``st``; back from a long cut, when the hold ends (_decide): the
        boxes of the other side, rebooted meanwhile, were failed at once and the policy
        without them let our stale members train (the simulator's seed 2521)."""
        if self.role is None:
            return
        if self._cut_hold(self.clock.monotonic()):
            self._statuses_held = True
        else:
            self.role.on_status(st)

    def _on_command(self, cmd: Command) -> None:
        if not self.election.admits(cmd.term, cmd.leader):
            self.counters["fenced"] += 1
            log.warning("fenced a command %r from %s: term %d < %d", cmd.op, cmd.leader,
                        cmd.term, self.election.term)
            return
        body = parse_command(cmd.op, cmd.args)  # a MessageError: counted and dropped
        self.election.obeyed(cmd.term, cmd.leader)
        self.counters["commands"] += 1
        log.info("command %s from %s (term %d)", cmd.op, cmd.leader, cmd.term)
        if isinstance(body, Reply):
            fut = self._replies.get(body.req_id)
            if fut is not None and not fut.done():
                fut.set_result(body.error)
        elif isinstance(body, CopySnapshot):
            if self.copies is not None:
                self.copies.order(body)
            else:
                self.counters["copies_refused"] += 1  # snapshots off, or no shelf here
        else:
            if isinstance(body, (Replicate, Bootstrap)) and body.new == self.me:
                self.worker.answer = body
            self.worker.push(body)

    def restore_from_copy(self, sender: str, step: int) -> None:
        """``sender`` left a copy of the newest snapshot on our disk for our worker, held with
        an older state: restarted, the worker restores it and asks to join holding it."""
        w = self.worker
        if not w.attached or w.state != "joining" or w.step >= step:
            log.info("a copy of step %d from %s is on our disk; our worker does not need it",
                     step, sender)
            return
        if self.supervisor.owns(w.pid) and self.supervisor.kill():
            log.warning("restarting the worker to restore the snapshot of step %d that %s "
                        "copied here", step, sender)
        else:
            log.warning("the snapshot of step %d that %s copied here restores when the worker "
                        "is started again (it was not started by chaosd)", step, sender)

    def _ask_join_again(self, now: float) -> None:
        """Our worker asked to join and no command came: ask again every JOIN_ASK_AGAIN_S.

        A request is lost when no scheduler holds the seat as it goes out: after a power cut
        of every box, the workers asked the scheduler they remembered, before it had claimed
        the seat again, and waited for a minute (the simulator's seed 1112). The same
        scheduler claiming again is no new leader, so :meth:`Leadership.ask_new_leader` does
        not fire. A request the scheduler has is answered again, or held again, at no cost.
        """
        w = self.worker
        if not (w.attached and w.state == "joining" and self.election.leader is not None
                and now - w.asked_at >= JOIN_ASK_AGAIN_S):
            return
        if isinstance(w.answer, Bootstrap) and (self._stale(w.answer)
                                                or w.answer.ended(self.election.term)):
            # A newer policy leaves us out: the scheduler made another node the start while
            # we were frozen or cut off with this command queued; the worker drops it
            # (JoinMachine), and the join is asked again (the simulator's seed 2167).
            log.warning("the bootstrap of policy v%d is stale (a newer policy leaves us out): "
                        "asking to join again", w.answer.policy_version)
            w.answer = None
        if not w.answered:
            w.asked_at = now
            self.request(JoinRequest(addr=w.data_addr, neighbors=w.neighbors, step=w.step))

    def _stale(self, cmd: Bootstrap) -> bool:
        """Whether the newest policy we hold is newer than ``cmd``'s and leaves us out."""
        if not self.policies:
            return False
        newest = self.policies[max(self.policies)]
        members = newest.get("members")
        return cmd.stale(max(self.policies), members if isinstance(members, list) else [])

    def _on_request(self, req: Request) -> None:
        if self.role is not None:
            try:
                body = parse_request(req.op, req.args)
            except MessageError as exc:  # counted and dropped by on_message; said if awaited
                self.role.refuse(req, str(exc))
                raise
            self.counters["requests"] += 1
            if req.node != self.me:
                # A request is a sign of life: a node that asks to join right after a healed
                # partition must not be failed for the silence that the partition was.
                self.detector.heartbeat(req.node, seed=True)
            if self._holding(self.clock.monotonic()):
                # A better claim holds our seat in doubt: act on nothing until the contest is
                # decided (the simulator's seed 3: a scheduler back from a cut, contesting
                # a claim whose count was stale, scaled in the others for its own worker,
                # which trained alone on steps the other side had committed).
                self._held_requests.append((req, body))
                return
            self.role.on_request(req, body)

    def request(self, body: RequestBody, reply: bool = False) -> str:
        """Queue a request to the scheduler; returns its id (``reply``: one comes back)."""
        self._req_seq += 1
        req_id = f"{self.me}-{self.incarnation}-{self._req_seq}"
        self.queue(self.topics.req, encode(Request(node=self.me, req_id=req_id, op=body.OP,
                                                    args=body.to_args(), reply=reply)))
        return req_id

    async def ask(self, body: RequestBody, timeout: float) -> str | None:
        """Send a request and wait for the scheduler's answer: None (done) or its error.

        Raises:
            TimeoutError: No answer within ``timeout`` seconds.
        """
        req_id = self.request(body, reply=True)
        fut: asyncio.Future[str | None] = asyncio.get_running_loop().create_future()
        self._replies[req_id] = fut
        try:
            await self.flush()
            return await asyncio.wait_for(fut, timeout)
        finally:
            del self._replies[req_id]

    def check_worker(self, paused: bool = False) -> None:
        """The attached worker's liveness: polls that stopped (a hang), or, for a worker
        started by hand (no supervisor sees it exit), a process that is gone."""
        w, now = self.worker, self.clock.monotonic()
        if paused:
            w.forgive(now)  # the silence was ours: nobody can poll a frozen daemon
        silent = unresponsive_for(w, now, self.cfg.worker.poll_silence_s)
        if silent is not None:
            self._worker_hung(silent)
        elif w.attached and not self.supervisor.running and not self.pid_alive(w.pid):
            log.warning("worker pid %d is gone", w.pid)
            self._worker_exited(-1)

    def _worker_hung(self, silent: float) -> None:
        """Drop a hung worker from the rounds at once; kill and restart it if it is ours."""
        pid = self.worker.pid
        ours = self.supervisor.owns(pid)
        self.counters["worker_unresponsive"] += 1
        log.warning("worker pid %d sent no poll for %.1f s: %s", pid, silent,
                    "killed; it restarts and rejoins by scale-out" if ours else
                    "dropped from the rounds (started by hand, it cannot be restarted)")
        # Reported before the kill, so the exit the supervisor then sees is not reported twice.
        self._worker_exited(-9 if ours else -1, "worker-unresponsive")
        if ours:
            self.supervisor.kill()

    def _worker_exited(self, code: int, reason: WorkerExitReason = "worker-exit") -> None:
        # A refused worker is on its way out: silent while it exits (a loaded box), it is
        # still refused, not hung, and the cluster must not wait for it to come back.
        if self.supervisor.refused is not None and reason in ("worker-exit",
                                                               "worker-unresponsive"):
            reason = "state-refused"
        if self.worker.attached:
            self.worker.detach()
            self.request(WorkerExit(code=code, reason=reason))
        elif self.supervisor.start_error is not None:  # it never ran: said to the cluster
            self.request(WorkerExit(code=code, reason="job-failed",
                                    detail=self.supervisor.start_error))

    # --- decisions ----------------------------------------------------------------------
    def heard_steps(self) -> dict[str, int]:
        """The step each node's last heartbeat said (ours: our worker's), as heard."""
        return {**{n: hb.step for n, hb in self.beats.items()}, self.me: self.step}

    def view_outdated(self) -> bool:
        """Is our view from before a pause of this daemon, no snapshot heard since?"""
        return self.paused_since_view

    def reported_step(self, node: str) -> int:
        """The step ``node`` last said it holds (its heartbeat; ours: our worker's), not
        extrapolated: a node that is cut off or waiting does not step on."""
        if node == self.me:
            return self.step
        hb = self.beats.get(node)
        if hb is not None:
            return hb.step
        rec = self.view.nodes.get(node) if self.view is not None else None
        return rec.step if rec is not None else 0

    def step_of(self, node: str) -> int:
        """``node``'s training step now: its last heartbeat's step tag, plus the steps it
        has likely made since at its recent rate (a heartbeat is up to 0.5 s old, and a
        policy must not take effect at a step the cluster has already passed)."""
        if node == self.me:
            return self.step
        hb = self.beats.get(node)
        if hb is None:
            # Not heard yet (a scheduler elected a moment ago): the last snapshot's word.
            rec = self.view.nodes.get(node) if self.view is not None else None
            return rec.step if rec is not None else 0
        rate, heard = self._step_rates.get(node, (0.0, self.clock.monotonic()))
        return hb.step + int(rate * (self.clock.monotonic() - heard) + 0.999)

    def daemon_alive(self, node: str) -> bool:
        """Up as far as we know: no last will pending or applied, and heard recently, or not
        judged yet (a scheduler elected a moment ago hears the others only from now on: its
        silence so far is no news of theirs, and presence says they are up)."""
        if node == self.me:
            return True
        st = self.presence.get(node)
        if node in self._wills or (st is not None and not st.online):
            return False
        return self.detector.is_alive(node, self._echo_at) or node not in self.detector.known()

    def silence(self, node: str) -> float | None:
        """Seconds since ``node``'s last heartbeat: an upper bound on a detection delay."""
        heard = self.last_heard.get(node)
        if heard is None:
            # Not heard since we began to listen (a new scheduler hears the followers only
            # from its election on): the time since the detector began to judge it.
            return self.detector.age(node)
        return self.clock.monotonic() - heard

    def live_peers(self) -> set[str]:
        """Peers we believe alive. Those we hear: online, and heard recently (or forgiven
        after a reconnect). Those we do not hear (a follower hears only the scheduler): online
        presence, unless the scheduler's snapshot says they failed or left."""
        forgiving = self.clock.monotonic() < self._judge_after
        live = set()
        known = set(self.detector.known())
        for node in known:
            st = self.presence.get(node)
            if ((forgiving or self.detector.is_alive(node, self._echo_at))
                    and (st is None or st.online)):
                live.add(node)
        if self.role is not None:
            return live
        members = self.view.nodes if self.view is not None else {}
        for node, st in self.presence.items():
            rec = members.get(node)
            if (node != self.me and node not in known and st.online and node not in self._wills
                    and (rec is None or rec.state in LIVE_STATES)):
                live.add(node)
        return live

    async def tick(self) -> None:
        """Run one round of decisions; called every 0.1 s by the main loop."""
        now = self.clock.monotonic()
        gap = 0.0 if self._last_tick is None else now - self._last_tick
        self._last_tick = now
        if gap > SELF_PAUSE_S:
            log.warning("this daemon was paused for %.1f s; not judging peers this tick", gap)
            self.detector.reset_all()
            self.paused_since_view = self.role is None
        elif self.bus.connected and self._hears_itself(now):
            self._decide(now)
        self.check_worker(paused=gap > SELF_PAUSE_S)
        self._ask_join_again(now)
        self.memory.save(self.election.term, self.election.leader)
        self._auth_failures.flush()
        self._rejects.flush()
        if self._repair_retained and self.role is not None and self.bus.connected:
            self.leadership.queue_claim()
            self.role.sched.dirty = True
        self._repair_retained = False
        self._sync_probes()
        # Before the claim goes out: a new scheduler hears every heartbeat and request by the
        # time anyone follows it.
        await self._sync_subscriptions()
        if self.role is not None:
            self.role.flush()
        await self.flush()
        if self.role is not None and self.bus.connected and (
                self.role.sched.dirty or now - self._last_publish > REPUBLISH_S):
            snap = self._stamped(self.role.snapshot())
            self.view = snap
            # Ours is the view now: a doubt left from a pause before our election would have
            # our worker rejoin (one more pull) if we were elected again without a snapshot.
            self.paused_since_view = False
            self.leadership.merge_events(snap.events)
            self.leadership.merge_policies(snap)
            self._last_publish = now
            await self.bus.publish(self.topics.state, encode(snap), qos=1, retain=True,
                                   reliable=True)
        self.metrics.update(self, now)
        # The pause check measures from here: time spent awaiting the broker above is ours,
        # not a sign that the process was frozen.
        self._last_tick = self.clock.monotonic()

    def in_touch(self) -> bool:
        """Whether this node is in touch with the cluster: connected, and its own heartbeats
        come back from the broker. A worker starts no round otherwise (``worker.poll``)."""
        now = self.clock.monotonic()
        heard = self._heard_self_at
        # A heartbeat of ours that came back since we connected: the broker sends what was
        # retained (the claim, the snapshot) first, so by then we know the cluster as it is
        # (the simulator's seed 2855: a worker started a round the instant its daemon was
        # back from a cut, before it heard of the new term).
        # Nor while the seat is in doubt (two schedulers met after a cut and count): a round
        # started under either side's old policy may be one the other side redoes (seed 2855).
        return (self.bus.connected and heard is not None and heard >= self._connected_at
                and now - heard <= ECHO_S and self.election.contested is None
                and not self.election.deferring and not self.election.challenged)

    def _learn_term(self, hb: Heartbeat) -> None:
        """A peer that committed a round under a policy of a later term than ours knows a
        claim we missed (a broker restart lost it while we were cut off): taken as that
        claim, a stale scheduler contests it on what it hears, or yields (the simulator's
        seed 635, heard while :meth:`_hold_after_cut` holds)."""
        if hb.policy_version <= 0 or not hb.leader or hb.leader == self.me:
            return
        term = policy_term(hb.policy_version)
        if term > self.election.term:
            log.warning("%s trained under term %d (led by %s); we knew term %d", hb.node,
                        term, hb.leader, self.election.term)
            self.leadership.on_claim(LeaderClaim(id=hb.leader, term=term, step=hb.holds))

    def _hears_itself(self, now: float) -> bool:
        """Whether our own heartbeats still come back from the broker (ECHO_S). A node whose
        path to the broker broke keeps a connection it believes in for a keepalive or more;
        judging peers then failed every one of them, and a scheduler cut off alone scaled
        the others in and trained on by itself (found by the simulator, seed 3)."""
        deaf = self._echo_at is None or now - self._echo_at > ECHO_S
        if deaf and not self._deaf:
            self.counters["deaf"] += 1
            log.warning("our heartbeats stopped coming back from the broker; judging nobody "
                        "until they do")
        elif self._deaf and not deaf:
            log.info("our heartbeats come back again")
            self.detector.reset_all()  # their silence was our path's
        self._deaf = deaf
        return not deaf

    def _stamped(self, snap: ClusterState) -> ClusterState:
        """The snapshot with each node's step and last heartbeat as the scheduler heard them:
        followers hear no one else, and show these in ``chaosctl nodes``. Not a reason to
        republish on their own (they change with every heartbeat)."""
        wall, nodes = self.clock.wall(), dict(snap.nodes)
        for node, rec in snap.nodes.items():
            silence = 0.0 if node == self.me else self.silence(node)
            hb = self.beats.get(node)
            nodes[node] = replace(
                rec, step=self.step if node == self.me else (hb.step if hb else rec.step),
                heard_at=rec.heard_at if silence is None else round(wall - silence, 3))
        return replace(snap, nodes=nodes)

    def _decide(self, now: float) -> None:
        for node, (will, heard) in list(self._wills.items()):
            if now - heard >= WILL_CONFIRM_S:
                del self._wills[node]
                self._apply_status(node, will)
        if self.election.leader not in (None, self.me):
            self._last_leader = self.election.leader
        self.watch_leader()
        live = self.live_peers()
        before, term = self.election.leader, self.election.term
        rival = self.election.contested
        # Counted only while a contest runs: it walks every live node, and this is every tick.
        own, own_step = self.leadership.training(live) if rival is not None else (0, -1)
        outside = self.leadership.rival(rival.leader, live) if rival is not None else Heard()
        # The best term a live peer knows: above 0, a cluster exists, and a node that holds
        # none of its state lets a peer that may hold it lead first.
        known = max((st.term for n, st in self.presence.items() if n in live), default=0)
        verdict = self.election.tick(live, holding=self._start_from(), own=own,
                                     cluster_term=known, alone_s=self.cfg.mqtt.reconnect_max_s,
                                     own_step=own_step, heard=outside)
        if verdict.action is Action.CLAIM and self.role is not None and rival is not None:
            self.role.outbid(verdict.term, rival.leader, own, max(rival.training, outside.training))
            self.leadership.queue_claim()
        elif verdict.action is Action.CLAIM:
            self.role = SchedulerRole(self, self._last_leader)
            self.leadership.queue_claim()
            self.leadership.ask_new_leader(before)
        else:
            self.leadership.settled(verdict, before, term)
        if self._holding(now):
            return  # nothing is judged or changed while our seat is in doubt
        if self._statuses_held and self.role is not None:
            self.role.take_presence(list(self.presence.values()))
        self._statuses_held = False
        held, self._held_requests = self._held_requests, []
        if self.role is not None:
            for req, body in held:  # the contest is won: what waited is done now
                self.role.on_request(req, body)
            self.role.judge(live)
        else:
            for req, _ in held:  # the contest is lost: the winner gets them (requests go to
                self.queue(self.topics.req, encode(req))  # whoever schedules)
