"""Control-socket actions: join, leave, link, and the worker's ops (docs/training-protocol.md).

Reads live in :mod:`daemon.agent.views`. Handlers validate their arguments (a bad one is a
``usage`` error naming the argument), change the local state or queue a request to the
scheduler, and answer at once, except ``link``, which waits for the scheduler's reply.

Handlers see the agent through :class:`AgentContext`: the worker's session and supervisor,
the link monitor, the cluster as last seen, and a way to ask the scheduler. Nothing else of
:class:`~daemon.agent.node.NodeAgent` (its bus, election internals, role, timers) is theirs.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from daemon.agent.memory import Job
from daemon.agent.metrics import AgentMetrics
from daemon.agent.probes import LinkMonitor, PeerEndpoint
from daemon.agent.worker import WorkerSession, WorkerSupervisor
from daemon.contracts.clock import Clock
from daemon.contracts.config import NAME_RE, Config
from daemon.contracts.errors import ControlError, MessageError
from daemon.contracts.kinds import WORKER_STATES, ActionOp, WorkerOp, member
from daemon.contracts.messages import ClusterState, Status
from daemon.contracts.protocol import (
    WORKER_REPORTS,
    JoinRequest,
    LeaveRequest,
    LinkMetrics,
    LinkRequest,
    PolicyRequest,
    Replicated,
    RequestBody,
    StateRefused,
    parse_report,
)
from daemon.contracts.records import build

REPLY_TIMEOUT_S = 5.0
MAX_PROBE_PEERS = 64


class AgentContext(Protocol):
    """What a control handler may use of its agent (``NodeAgent`` is one)."""

    step: int  # the worker's last committed step, as its polls say

    @property
    def me(self) -> str: ...
    @property
    def cfg(self) -> Config: ...
    @property
    def clock(self) -> Clock: ...
    @property
    def incarnation(self) -> int: ...
    @property
    def worker(self) -> WorkerSession: ...
    @property
    def supervisor(self) -> WorkerSupervisor: ...
    @property
    def monitor(self) -> LinkMonitor | None: ...
    @property
    def metrics(self) -> AgentMetrics: ...
    @property
    def presence(self) -> Mapping[str, Status]: ...
    @property
    def view(self) -> ClusterState | None: ...
    @property
    def policies(self) -> Mapping[int, dict[str, Any]]: ...
    @property
    def leader(self) -> str | None:
        """The scheduler this node follows, if any."""
        ...

    @property
    def term(self) -> int:
        """The newest term this node knows (``worker.poll``'s ``term``)."""
        ...

    def endpoint(self, node: str) -> PeerEndpoint | None:
        """Where ``node``'s probe servers listen."""
        ...

    def in_touch(self) -> bool:
        """Connected, and our own heartbeats come back (``worker.poll``'s ``in_touch``)."""
        ...

    def check_worker(self) -> None:
        """Judge the attached worker's liveness now; one that is gone is said to have exited."""
        ...

    def request(self, body: RequestBody, reply: bool = False) -> str:
        """Queue a request to the scheduler (sent by :meth:`flush` or the next tick)."""
        ...

    async def flush(self) -> None:
        """Publish what is queued now."""
        ...

    async def ask(self, body: RequestBody, timeout: float) -> str | None:
        """A request the scheduler answers: None (done) or its error."""
        ...


def _node_id(value: Any, what: str) -> str:
    if not isinstance(value, str) or not NAME_RE.match(value):
        raise ControlError(f"{what} must be a node id (A-Z a-z 0-9 _ . -, 1-64)")
    return value


def _int(args: dict[str, Any], key: str, default: int = 0) -> int:
    value = args.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ControlError(f"'{key}' must be a non-negative integer")
    return value


def join(agent: AgentContext, args: dict[str, Any]) -> dict[str, Any]:
    neighbors = args.get("neighbors") or []
    command = args.get("command") or []
    if not isinstance(neighbors, list):
        raise ControlError("'neighbors' must be a list of node ids")
    nbrs = [_node_id(n, "each neighbor") for n in neighbors]
    if agent.me in nbrs:
        raise ControlError("a node cannot be its own neighbor")
    if not isinstance(command, list) or not all(isinstance(a, str) for a in command):
        raise ControlError("'command' must be a list of strings")
    cwd, env = args.get("cwd", ""), args.get("env") or {}
    if not isinstance(cwd, str) or (cwd and not (os.path.isabs(cwd) and os.path.isdir(cwd))):
        raise ControlError(f"'cwd' must be an existing directory's absolute path: {cwd!r}")
    if not isinstance(env, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
        raise ControlError("'env' must map names to strings")
    if agent.supervisor.running or agent.worker.attached:
        raise ControlError("this node is already training; 'chaosctl leave' first",
                           code="failed")
    agent.worker.neighbors = nbrs
    if command:
        try:  # the job is remembered: a reboot starts it again (memory.JobMemory)
            agent.supervisor.start(Job(argv=command, cwd=cwd, env=env, neighbors=nbrs))
        except RuntimeError as exc:
            raise ControlError(str(exc), code="failed") from None
        return {"node": agent.me, "state": "joining"}
    # No command: a worker started by hand attaches with these neighbours.
    return {"node": agent.me, "state": "standby"}


async def leave(agent: AgentContext, _args: dict[str, Any]) -> dict[str, Any]:
    if agent.worker.attached or agent.supervisor.supervising:
        agent.supervisor.forget()  # the operator's word: no restart after a reboot either
    if agent.worker.attached:
        agent.worker.leave_requested = True
        return {"node": agent.me, "state": "leaving"}
    if agent.supervisor.supervising:  # not attached (starting, or restarting): stop it
        await agent.supervisor.stop()
        return {"node": agent.me, "state": "standby"}
    raise ControlError("this node is not training", code="failed")


async def link(agent: AgentContext, args: dict[str, Any]) -> dict[str, Any]:
    action = args.get("action")
    if action not in ("add", "del"):
        raise ControlError("'action' must be add or del")
    peer = _node_id(args.get("peer"), "'peer'")
    if peer == agent.me:
        raise ControlError("a node cannot link to itself")
    if agent.leader is None:
        raise ControlError("no scheduler is elected yet; try again in a few seconds",
                           code="failed")
    try:
        error = await agent.ask(LinkRequest(peer=peer, action=action), REPLY_TIMEOUT_S)
    except TimeoutError:
        raise ControlError(f"the scheduler did not answer within {REPLY_TIMEOUT_S:g} s",
                           code="failed") from None
    if error:
        raise ControlError(f"link {action} {peer}: {error}", code="failed")
    return {"a": agent.me, "b": peer, "state": "up" if action == "add" else "down"}


async def policy(agent: AgentContext, args: dict[str, Any]) -> dict[str, Any]:
    """``chaosctl policy set|auto``: the scheduler applies it (or says why not)."""
    try:
        body = build(PolicyRequest, args, "policy")
    except MessageError as exc:
        raise ControlError(str(exc)) from None
    if agent.leader is None:
        raise ControlError("no scheduler is elected yet; try again in a few seconds",
                           code="failed")
    try:
        error = await agent.ask(body, REPLY_TIMEOUT_S)
    except TimeoutError:
        raise ControlError(f"the scheduler did not answer within {REPLY_TIMEOUT_S:g} s",
                           code="failed") from None
    if error:
        raise ControlError(f"policy: {error}", code="failed")
    return {"requested": {k: v for k, v in args.items() if v not in ("", 0, False, None)}}


async def worker_attach(agent: AgentContext, args: dict[str, Any]) -> dict[str, Any]:
    port = _int(args, "port")
    pid = _int(args, "pid")
    step = _int(args, "step", 0)  # the state the worker holds (0: a fresh model)
    host = args.get("host") or agent.cfg.advertise
    if not isinstance(host, str) or not 0 < port < 65536 or not pid:
        raise ControlError("worker.attach needs 'pid', 'host' and a 'port' in 1..65535")
    w = agent.worker
    if w.attached and w.pid != pid:
        # A script killed and started again by hand before the next tick: the old worker's
        # exit reaches the scheduler first, so the new one joins as a newcomer, not as a
        # member whose rounds still wait on the dead process.
        agent.check_worker()
    if w.attached and w.pid != pid:
        raise ControlError(f"another worker (pid {w.pid}) is attached", code="failed")
    w.pid, w.data_addr, w.state, w.step = pid, f"{host}:{port}", "joining", step
    w.attached_at = w.last_poll = w.asked_at = agent.clock.monotonic()
    w.answer = None
    rtts: dict[str, float] = {}
    if agent.monitor is not None and not w.neighbors:
        # The scheduler picks neighbours by RTT: measure to every live peer at once.
        peers = {n: ep for n in agent.presence if (ep := agent.endpoint(n)) is not None}
        with w.serving(agent.clock):  # the worker waits on us: no hang
            rtts = await agent.monitor.rtts(peers)
    agent.request(JoinRequest(addr=w.data_addr, neighbors=w.neighbors, rtts=rtts, step=step))
    await agent.flush()
    rep = agent.cfg.replication
    return {"node": agent.me, "cluster": agent.cfg.cluster, "secret": agent.cfg.data_key.hex(),
            "incarnation": agent.incarnation,
            "replication": {"serve_mbps": rep.serve_mbps, "probe_min_mib": rep.probe_min_mib,
                            "snapshot_reserve_mib": rep.snapshot_reserve_mib}}


def worker_poll(agent: AgentContext, args: dict[str, Any]) -> dict[str, Any]:
    w = agent.worker
    if not w.attached:
        raise ControlError("no worker is attached; call worker.attach first", code="failed")
    before = (w.step, w.state)
    w.step = agent.step = _int(args, "step", agent.step)
    if "committed_version" in args:  # from the first committed round on
        w.version = _int(args, "committed_version")
    if "compute_ms" in args:  # the policy controller's inputs (daemon.cluster.controller)
        compute = args["compute_ms"]
        if isinstance(compute, bool) or not isinstance(compute, (int, float)) or compute < 0:
            raise ControlError("'compute_ms' must be a number >= 0")
        w.compute_ms, w.elements = float(compute), max(0, _int(args, "elements"))
        w.cannot_diloco = str(args.get("cannot_diloco") or "")[:200]
    state = member(args.get("state", w.state), WORKER_STATES)
    if state is not None and state != "standby":
        w.state = state
    w.last_poll = agent.clock.monotonic()
    agent.metrics.polled(before, (w.step, w.state), args)
    known = args.get("policy_version", -1)
    if isinstance(known, bool) or not isinstance(known, int):
        raise ControlError("'policy_version' must be an integer")
    policy = agent.view.policy if agent.view is not None and agent.view.policy else None
    newer = [agent.policies[v] for v in sorted(agent.policies) if v > known]
    # in_touch: a worker starts no round while its daemon is out of touch with the cluster
    # (cut off, or just back from a freeze): a member alone in its policy would otherwise
    # train on by itself while the others elected anew (the simulator's seed 1909).
    return {"policy": policy, "policies": newer, "commands": w.drain(),
            "leave": w.leave_requested, "in_touch": agent.in_touch(),
            # term: a bootstrap of an ended term is not carried out (Bootstrap.ended)
            "term": agent.term}


async def worker_report(agent: AgentContext, args: dict[str, Any]) -> dict[str, Any]:
    try:
        rep = parse_report(args, WORKER_REPORTS)
    except MessageError as exc:
        raise ControlError(f"{exc}; a worker reports one of {', '.join(WORKER_REPORTS)}"
                           ) from None
    if isinstance(rep, StateRefused):
        # The script cannot load the cluster's state: restarting it would only be refused
        # again, each time at the cost of a scale-out and a scale-in for the others.
        agent.supervisor.refuse(rep.reason or "state mismatch")
    if isinstance(rep, Replicated):
        # Its worker holds that state now, whatever its next poll says: our heartbeats say so
        # at once. A box frozen while it pulled thawed with the replica of 577, its heartbeat
        # still said the 540 of its disk, and a holder of 560 started the cluster over
        # (the simulator's seed 2153).
        agent.worker.step = agent.step = max(agent.worker.step, rep.version)
    agent.metrics.reported(rep)
    agent.request(rep)
    await agent.flush()
    return {}


async def worker_leave(agent: AgentContext, args: dict[str, Any]) -> dict[str, Any]:
    # The worker stays attached: it polls on and takes part in the rounds (with no samples)
    # until the policy without it takes effect, then detaches.
    step = _int(args, "step", agent.step)
    agent.worker.state = "leaving"
    agent.request(LeaveRequest(step=step))
    await agent.flush()
    return {}


def worker_detach(agent: AgentContext, args: dict[str, Any]) -> dict[str, Any]:
    pid = _int(args, "pid")
    if agent.worker.attached and agent.worker.pid == pid:
        agent.worker.detach()  # it has left: its exit is no failure
    return {}


async def _probe_one(agent: AgentContext, peer: str, nbytes: int | None = None,
                     reverse: bool = False) -> dict[str, Any]:
    """A fresh RTT and bandwidth measurement of the path to ``peer``, told to the scheduler."""
    if agent.monitor is None:
        raise ControlError("probes are disabled on this node ([probe] enabled = false)",
                           code="failed")
    ep = agent.endpoint(peer)
    if ep is None or not ep.probe_port:
        raise ControlError(f"{peer} is not online or advertises no probe server",
                           code="failed")
    result = await agent.monitor.probe(peer, ep, nbytes=nbytes, reverse=reverse)
    if result["rtt_ms"] is None and result["bandwidth_mbps"] is None:
        raise ControlError(f"no answer from {peer}'s probes at {ep.host}", code="failed")
    agent.request(LinkMetrics(peer=peer, rtt_ms=result["rtt_ms"],
                              bandwidth_mbps=result["bandwidth_mbps"]))
    return result


async def probe(agent: AgentContext, args: dict[str, Any]) -> dict[str, Any]:
    peer = _node_id(args.get("peer"), "'peer'")
    if peer == agent.me:
        raise ControlError("a node cannot probe itself")
    return await _probe_one(agent, peer)


async def worker_probe(agent: AgentContext, args: dict[str, Any]) -> dict[str, Any]:
    """Measure the links to a joining node's sources, all at once (they will be loaded at
    once by the parallel fetch, so a joint measurement is the one the planner needs)."""
    peers = args.get("peers")
    if not isinstance(peers, list) or not peers or len(peers) > MAX_PROBE_PEERS:
        raise ControlError(f"'peers' must be a list of 1..{MAX_PROBE_PEERS} node ids")
    ids = [_node_id(p, "each peer") for p in peers]
    nbytes = _int(args, "bytes") or None
    # reverse: the state flows from each source to us.
    with agent.worker.serving(agent.clock):  # iperf3 tests take seconds; the worker waits
        results = await asyncio.gather(
            *(_probe_one(agent, p, nbytes, reverse=True) for p in ids), return_exceptions=True)
    out: dict[str, Any] = {}
    for peer, res in zip(ids, results, strict=True):
        out[peer] = res if isinstance(res, dict) else {"error": str(res)}
    return out


HANDLERS: dict[ActionOp | WorkerOp, Callable[[AgentContext, dict[str, Any]], Any]] = {
    "join": join, "leave": leave, "link": link, "worker.attach": worker_attach,
    "worker.poll": worker_poll, "worker.report": worker_report, "worker.leave": worker_leave,
    "probe": probe, "worker.probe": worker_probe, "worker.detach": worker_detach,
    "policy": policy,
}
