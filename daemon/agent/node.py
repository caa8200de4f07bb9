"""The node agent: what one chaosd does on the bus.

It sends heartbeats, watches everyone else's with the phi-accrual detector, takes part in the
scheduler election, mirrors the retained cluster state, and, while elected, runs the
:class:`~daemon.cluster.scheduler.Scheduler`. Message handlers only update state; the periodic
:meth:`NodeAgent.tick` makes the decisions, so the order in which messages arrive never
matters more than one tick (0.1 s).
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from typing import Any

from typing_extensions import assert_never

from daemon.agent.bus import Bus, Outgoing
from daemon.agent.metrics import AgentMetrics
from daemon.agent.probes import LinkMonitor, PeerEndpoint
from daemon.agent.resources import sample
from daemon.agent.worker import WorkerSession, WorkerSupervisor, pid_alive, unresponsive_for
from daemon.cluster.detector import PhiAccrualDetector
from daemon.cluster.election import Action, Election, better
from daemon.cluster.role import SchedulerRole
from daemon.cluster.scheduler import Scheduler
from daemon.contracts.clock import Clock, SystemClock
from daemon.contracts.config import Config
from daemon.contracts.errors import MessageError
from daemon.contracts.kinds import COMMAND_OPS, RequestOp, WorkerExitReason, member
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
from daemon.contracts.policy import POLICY_KEEP
from daemon.contracts.signing import AuthError

log = logging.getLogger("chaosd.node")
REPUBLISH_S = 5.0       # the scheduler refreshes the retained state this often
SELF_PAUSE_S = 1.0      # a tick gap this long means *we* were paused (SIGSTOP, swap storm)
# A broker that shuts down may publish every client's last will as it goes. A will that is
# not followed by the loss of our own connection within this window is a real crash.
WILL_CONFIRM_S = 0.5
EVENTS_KEEP = 1000
AUTH_LOG_S = 10.0  # at most one line per this long about messages that fail authentication


class NodeAgent:
    """One node's membership, election and (when elected) scheduling logic."""

    def __init__(self, cfg: Config, clock: Clock | None = None) -> None:
        self.cfg = cfg
        self.me = cfg.node_id
        self.clock = clock or SystemClock()
        self.topics = Topics(cfg.cluster)
        # Distinguishes this process from earlier (or zombie) ones with the same node id.
        self.incarnation = time.time_ns() // 1000
        self.detector = PhiAccrualDetector(cfg.detector, self.clock)
        self.election = Election(self.me, cfg.election, self.clock)
        self.role: SchedulerRole | None = None  # only while elected, for that term
        self.monitor: LinkMonitor | None = None  # set by the daemon once the probes listen
        self.worker = WorkerSession()
        self.supervisor = WorkerSupervisor(cfg.data_dir, {
            "CHAOS_SOCKET": cfg.socket, "CHAOS_NODE_ID": cfg.node_id,
            "CHAOS_CLUSTER": cfg.cluster})
        self.supervisor.on_exit.append(self._worker_exited)
        self._req_seq = 0
        self.replies: dict[str, str | None] = {}  # req_id -> error (None: ok)
        self.view: ClusterState | None = None
        self.presence: dict[str, Status] = {}
        self.beats: dict[str, Heartbeat] = {}
        self.events: dict[tuple[int, float], Event] = {}
        # version -> policy as the wire carries it (SyncPolicy.to_dict), for worker.poll
        self.policies: dict[int, dict[str, Any]] = {}
        self.counters: Counter[str] = Counter()
        self.metrics = AgentMetrics(cfg.metrics.listen)  # served by Daemon.startup
        self.state = "standby"
        self.step = 0
        self.started = self.clock.monotonic()
        self.should_exit = False
        self.exit_reason = ""
        self._hb_seq = 0
        self._last_tick: float | None = None
        self._last_publish = 0.0
        self._last_leader: str | None = None
        # Until then, silence is not judged: peers may reconnect up to one backoff after us.
        self._judge_after = 0.0
        self._pending: list[Outgoing] = []
        self._wills: dict[str, tuple[Status, float]] = {}
        # Last heartbeat per node; unlike the detector's history it survives a last will,
        # so failure events can say how long the node had been silent.
        self.last_heard: dict[str, float] = {}
        self._step_rates: dict[str, tuple[float, float]] = {}  # node -> (steps/s, when)
        # The wall time of the current connection: our "up" statuses and the last will of that
        # connection carry it, so a peer can tell a replayed will of an earlier one (older).
        self._conn_ts = self.clock.wall()
        self._auth_unlogged: tuple[int, str] = (0, "")  # failures since the last log line
        self._auth_logged_at: float | None = None
        self._repair_retained = False  # a forgery overwrote the retained claim or snapshot
        topics = self.topics
        self.bus = Bus(
            cfg,
            client_id=f"chaos-{cfg.cluster}-{self.me}",
            will=self._will,
            subscriptions=[f"{topics.root}/node/+/hb", f"{topics.root}/node/+/status",
                           topics.cmd(self.me), topics.leader, topics.req, topics.state],
            on_message=self.on_message,
            on_connect=self.on_connect,
            on_disconnect=self.on_disconnect,
            on_auth_error=self.on_auth_error,
            wall=self.clock.wall,
        )

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
                      addr=self.cfg.advertise, ts=ts,
                      probe_port=mon.probe_port if mon else 0, bw_port=mon.bw_port if mon else 0,
                      bw_kind=mon.bandwidth.kind if mon else "")

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

    def _queue_claim(self) -> None:
        claim = LeaderClaim(id=self.me, term=self.election.term, ts=self.clock.wall())
        self.queue(self.topics.leader, encode(claim), retain=True)

    async def flush(self) -> None:
        pending, self._pending = self._pending, []
        for out in pending:
            await self.bus.publish(out.topic, out.payload, qos=out.qos, retain=out.retain,
                                   reliable=out.qos > 0)

    async def heartbeat(self) -> None:
        self._hb_seq += 1
        res = sample()
        hb = Heartbeat(node=self.me, seq=self._hb_seq, incarnation=self.incarnation,
                       step=self.step, state=self.worker.state if self.worker.attached else
                       self.state, cpu_percent=res.cpu_percent,
                       mem_percent=res.mem_percent, battery_percent=res.battery_percent)
        await self.bus.publish(self.topics.hb(self.me), encode(hb), qos=0)

    async def leave(self) -> None:
        """Graceful exit: a retained 'left' status, so the last will never fires."""
        self.metrics.stop()
        await self.bus.publish(self.topics.status(self.me), encode(self._status(False, "left")),
                               qos=1, retain=True)

    # --- bus callbacks ------------------------------------------------------------------
    async def on_connect(self) -> None:
        self.election.connected()
        # Everyone's silence while we were cut off was ours, not theirs; and after a broker
        # outage the others reconnect on their own backoff, up to reconnect_max_s after us.
        self.detector.reset_all()
        if self.bus.connects > 1:
            self._judge_after = (self.clock.monotonic() + self.cfg.mqtt.reconnect_max_s
                                 + self.cfg.election.grace_s)
        await self.bus.publish(self.topics.status(self.me), encode(self._status(True, "up")),
                               qos=1, retain=True)
        await self.heartbeat()
        if self.role is not None:
            self._queue_claim()
            self.role.sched.dirty = True

    def on_disconnect(self) -> None:
        self.election.disconnected()
        self._wills.clear()  # they came with the broker's own going away

    def on_message(self, topic: str, payload: bytes) -> None:
        """Validate and route one message; a bad one is logged and dropped."""
        try:
            self._route(topic, payload)
        except MessageError as exc:
            self.counters["rejected"] += 1
            log.warning("dropped message on %s: %s", topic, exc)

    def on_auth_error(self, topic: str, exc: AuthError) -> None:
        """A message that failed authentication: dropped and counted; logged at a rate limit."""
        self.counters["auth_failed"] += 1
        self.counters[f"auth_{exc.reason.replace('-', '_')}"] += 1
        self._auth_unlogged = (self._auth_unlogged[0] + 1, f"{topic}: {exc}")
        self._log_auth_failures()
        if topic in (self.topics.leader, self.topics.state) and exc.reason != "replayed":
            # New subscribers would find only the forgery there: the scheduler repairs it.
            self._repair_retained = True

    def _log_auth_failures(self) -> None:
        count, last = self._auth_unlogged
        now = self.clock.monotonic()
        if not count or (self._auth_logged_at is not None
                         and now - self._auth_logged_at < AUTH_LOG_S):
            return
        log.warning("dropped %d control message(s) that failed authentication (%d in all); "
                    "last on %s", count, self.counters["auth_failed"], last[:200])
        self._auth_unlogged, self._auth_logged_at = (0, ""), now

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
                self._on_claim(decode(payload, LeaderClaim))  # type: ignore[arg-type]
        elif topic == t.req:
            self._on_request(decode(payload, Request))  # type: ignore[arg-type]
        elif topic == t.state and payload:
            self._on_state(decode(payload, ClusterState))  # type: ignore[arg-type]

    def _on_heartbeat(self, node: str, hb: Heartbeat) -> None:
        if hb.node != node:
            raise MessageError(f"heartbeat for {hb.node!r} on the topic of {node!r}")
        if node == self.me:
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
        if not st.online and st.reason == "lost":
            self._wills[node] = (st, self.clock.monotonic())  # confirmed in tick()
            return
        self._wills.pop(node, None)
        self._apply_status(node, st)

    def _apply_status(self, node: str, st: Status) -> None:
        self.presence[node] = st
        if not st.online:
            if node == self.election.leader:
                self.election.leader_lost()
            if self.role is not None:
                self.role.on_status(st)
            self.detector.forget(node)
            return
        # "up" is a sign of life too: judge its silence from now on. This catches a node that
        # freezes before its first heartbeat, and it keeps a node that comes back (thawed,
        # reconnected) from being judged by the silence it has just ended.
        self.detector.heartbeat(node, seed=True)
        if self.role is not None:
            self.role.on_status(st)

    def _on_claim(self, claim: LeaderClaim) -> None:
        verdict = self.election.on_claim(claim.id, claim.term)
        if verdict.action is Action.CLAIM:
            self._queue_claim()
        elif verdict.action is Action.STEP_DOWN:
            log.warning("stepping down: %s holds term %d", claim.id, claim.term)
            self.role = None
        if verdict.action in (Action.FOLLOW, Action.STEP_DOWN):
            log.info("scheduler is %s (term %d)", verdict.leader, verdict.term)

    def _on_command(self, cmd: Command) -> None:
        if not self.election.admits(cmd.term, cmd.leader):
            self.counters["fenced"] += 1
            log.warning("fenced a command %r from %s: term %d < %d", cmd.op, cmd.leader,
                        cmd.term, self.election.term)
            return
        self.counters["commands"] += 1
        log.info("command %s from %s (term %d)", cmd.op, cmd.leader, cmd.term)
        op = member(cmd.op, COMMAND_OPS)
        if op is None:
            log.warning("ignoring unknown command %r from %s", cmd.op, cmd.leader)
        elif op == "reply":
            req_id = cmd.args.get("req_id")
            if isinstance(req_id, str):
                error = cmd.args.get("error")
                self.replies[req_id] = error if isinstance(error, str) else None
        elif op == "connect" or op == "disconnect" or op == "replicate":
            self.worker.push(op, cmd.args)
        else:
            assert_never(op)

    def _on_request(self, req: Request) -> None:
        if self.role is not None:
            self.counters["requests"] += 1
            self.role.on_request(req)

    def request(self, op: RequestOp, **args: Any) -> str:
        """Queue a request to the scheduler; returns its id (a reply may come back)."""
        self._req_seq += 1
        req_id = f"{self.me}-{self.incarnation}-{self._req_seq}"
        self.queue(self.topics.req, encode(Request(node=self.me, req_id=req_id, op=op,
                                                    args=args)))
        return req_id

    def _check_worker(self, paused: bool = False) -> None:
        """The attached worker's liveness: polls that stopped (a hang), or, for a worker
        started by hand (no supervisor sees it exit), a process that is gone."""
        w, now = self.worker, self.clock.monotonic()
        if paused:
            w.forgive(now)  # the silence was ours: nobody can poll a frozen daemon
        silent = unresponsive_for(w, now, self.cfg.worker.poll_silence_s)
        if silent is not None:
            self._worker_hung(silent)
        elif w.attached and not self.supervisor.running and not pid_alive(w.pid):
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
        if self.supervisor.refused is not None and reason == "worker-exit":
            reason = "state-refused"
        if self.worker.attached:
            self.worker.detach()
            self.request("worker-exit", code=code, reason=reason)

    def _on_state(self, st: ClusterState) -> None:
        claim = (st.term, st.leader)
        accepted = (self.election.term, self.election.leader or "")
        if self.role is not None:
            if claim != (self.role.term, self.me):
                # Someone else's snapshot overwrote the retained topic: repair it.
                self.role.sched.dirty = True
            return
        if better(accepted, claim) and self.election.leader is not None:
            self.counters["stale_states"] += 1
            return  # from a stale or losing scheduler
        if self.view is not None and (self.view.term, self.view.leader) == claim \
                and st.version <= self.view.version:
            return
        self.view = st
        self._merge_events(st.events)
        self._merge_policies(st)

    def _merge_policies(self, st: ClusterState) -> None:
        for pol in [*st.policies, st.policy]:
            version = pol.get("version") if isinstance(pol, dict) else None
            if isinstance(version, int):
                self.policies.setdefault(version, pol)
        for version in sorted(self.policies)[:-POLICY_KEEP]:
            del self.policies[version]

    def _merge_events(self, events: list[Event]) -> None:
        new = [ev for ev in events if (ev.seq, ev.ts) not in self.events]
        for ev in events:
            self.events.setdefault((ev.seq, ev.ts), ev)
        self.metrics.new_events(new)
        if len(self.events) > EVENTS_KEEP:
            for key in sorted(self.events)[: len(self.events) - EVENTS_KEEP]:
                del self.events[key]

    # --- decisions ----------------------------------------------------------------------
    def step_of(self, node: str) -> int:
        """``node``'s training step now: its last heartbeat's step tag, plus the steps it
        has likely made since at its recent rate (a heartbeat is up to 0.5 s old, and a
        policy must not take effect at a step the cluster has already passed)."""
        if node == self.me:
            return self.step
        hb = self.beats.get(node)
        if hb is None:
            return 0
        rate, heard = self._step_rates.get(node, (0.0, self.clock.monotonic()))
        return hb.step + int(rate * (self.clock.monotonic() - heard) + 0.999)

    def daemon_alive(self, node: str) -> bool:
        """Up as far as we know: no last will pending or applied, and heard recently."""
        if node == self.me:
            return True
        st = self.presence.get(node)
        return (node not in self._wills and (st is None or st.online)
                and self.detector.is_alive(node))

    def silence(self, node: str) -> float | None:
        """Seconds since ``node``'s last heartbeat: an upper bound on a detection delay."""
        heard = self.last_heard.get(node)
        return None if heard is None else self.clock.monotonic() - heard

    def live_peers(self) -> set[str]:
        """Peers we believe alive: online, and heard recently (or forgiven after reconnect)."""
        forgiving = self.clock.monotonic() < self._judge_after
        live = set()
        for node in self.detector.known():
            st = self.presence.get(node)
            if (forgiving or self.detector.is_alive(node)) and (st is None or st.online):
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
        elif self.bus.connected:
            self._decide(now)
        self._check_worker(paused=gap > SELF_PAUSE_S)
        self._log_auth_failures()
        if self._repair_retained and self.role is not None and self.bus.connected:
            self._queue_claim()
            self.role.sched.dirty = True
        self._repair_retained = False
        self._sync_probes()
        if self.role is not None:
            self.role.flush()
        await self.flush()
        if self.role is not None and self.bus.connected and (
                self.role.sched.dirty or now - self._last_publish > REPUBLISH_S):
            snap = self.role.snapshot()
            self.view = snap
            self._merge_events(snap.events)
            self._merge_policies(snap)
            self._last_publish = now
            await self.bus.publish(self.topics.state, encode(snap), qos=1, retain=True,
                                   reliable=True)
        self.metrics.update(self, now)
        # The pause check measures from here: time spent awaiting the broker above is ours,
        # not a sign that the process was frozen.
        self._last_tick = self.clock.monotonic()

    def _decide(self, now: float) -> None:
        for node, (will, heard) in list(self._wills.items()):
            if now - heard >= WILL_CONFIRM_S:
                del self._wills[node]
                self._apply_status(node, will)
        if self.election.leader not in (None, self.me):
            self._last_leader = self.election.leader
        live = self.live_peers()
        verdict = self.election.tick(live)
        if verdict.action is Action.CLAIM:
            self.role = SchedulerRole(self, self._last_leader)
            self._queue_claim()
        if self.role is not None:
            self.role.judge(live)
