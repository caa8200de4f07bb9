"""Control-socket answers: the JSON shapes DESIGN.md fixes, built from a node's view."""

from __future__ import annotations

import dataclasses
import os
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from daemon.agent.node import NodeAgent
from daemon.contracts.config import Config
from daemon.contracts.errors import ControlError
from daemon.contracts.kinds import ReadOp
from daemon.contracts.snapshots import SNAPSHOT_DIR


def node_ids(agent: NodeAgent) -> list[str]:
    """Every node this one knows of: from the snapshot, presence and heartbeats."""
    ids = set(agent.presence) | set(agent.beats) | {agent.me}
    if agent.view is not None:
        ids |= set(agent.view.nodes)
    return sorted(ids)


def node_state(agent: NodeAgent, node: str) -> str:
    """The scheduler's word if we have it, else what presence says."""
    if agent.view is not None and node in agent.view.nodes:
        return agent.view.nodes[node].state
    if node == agent.me:
        return agent.state
    st = agent.presence.get(node)
    if st is None or st.online:
        return "standby"
    return "left" if st.reason == "left" else "failed"


def status(agent: NodeAgent, _args: dict[str, Any]) -> dict[str, Any]:
    el = agent.election
    counts = Counter(node_state(agent, n) for n in node_ids(agent))
    view = agent.view
    steps = [hb.step for hb in agent.beats.values()] + [agent.step]
    return {
        "cluster": agent.cfg.cluster,
        "node": agent.me,
        "scheduler": {"id": el.leader, "term": el.term} if el.leader else None,
        "nodes": dict(sorted(counts.items())),
        "step": max([view.step if view else 0, *steps]),
        "policy_version": view.policy_version if view else 0,
    }


def nodes(agent: NodeAgent, _args: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    view_nodes = agent.view.nodes if agent.view else {}
    for node in node_ids(agent):
        rec = view_nodes.get(node)
        st = agent.presence.get(node)
        hb = agent.beats.get(node)
        age = 0.0 if node == agent.me else agent.detector.age(node)
        if age is None and rec is not None and rec.heard_at is not None:
            # A follower does not hear this node: the scheduler's word, as of its snapshot.
            age = max(0.0, agent.clock.wall() - rec.heard_at)
        out.append({
            "id": node,
            "state": node_state(agent, node),
            "addr": (rec.addr if rec and rec.addr else (st.addr if st else
                     (agent.cfg.advertise if node == agent.me else ""))),
            "scheduler": node == agent.election.leader,
            "heartbeat_age_s": None if age is None else round(age, 3),
            "step": agent.step if node == agent.me else (hb.step if hb else
                                                         rec.step if rec else 0),
            "neighbors": list(rec.neighbors) if rec else [],
        })
    return out


def links(agent: NodeAgent, _args: dict[str, Any]) -> list[dict[str, Any]]:
    if agent.view is None:
        return []
    return [dataclasses.asdict(lk) for lk in agent.view.links]


def events(agent: NodeAgent, args: dict[str, Any]) -> list[dict[str, Any]]:
    since, limit = args.get("since", 0), args.get("limit", 200)
    for key, value in (("since", since), ("limit", limit)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ControlError(f"events: '{key}' must be a non-negative integer")
    chosen = [ev for key, ev in sorted(agent.events.items()) if ev.seq > since]
    if limit:
        chosen = chosen[-limit:]
    out = []
    for ev in chosen:
        row = dataclasses.asdict(ev)
        row.update(row.pop("detail"))
        out.append(row)
    return out


def ping(agent: NodeAgent, _args: dict[str, Any]) -> dict[str, Any]:
    el = agent.election
    return {"node": agent.me, "pid": os.getpid(), "incarnation": agent.incarnation,
            "uptime_s": round(agent.clock.monotonic() - agent.started, 3),
            "connected": agent.bus.connected, "queued": agent.bus.queued,
            "leader": el.is_leader and agent.scheduler is not None,
            "term": el.term, "scheduler": el.leader, "counters": dict(agent.counters),
            "worker": {"pid": agent.worker.pid or agent.supervisor.pid,
                       "data_addr": agent.worker.data_addr, "step": agent.worker.step,
                       "restarts": agent.supervisor.restarts,
                       "refused": agent.supervisor.refused},
            "cluster": agent.cfg.cluster, "snapshots": snapshot_settings(agent.cfg)}


def policy_show(agent: NodeAgent, _args: dict[str, Any]) -> dict[str, Any] | None:
    """The newest sync policy this node knows (the scheduler's), as published; None before
    the first."""
    return dict(agent.policies[max(agent.policies)]) if agent.policies else None


def snapshot_settings(cfg: Config) -> dict[str, Any]:
    """Where and when the worker snapshots (``[snapshots]``; ``dir`` empty: off)."""
    snaps = cfg.snapshots
    return {"dir": str(Path(cfg.data_dir) / SNAPSHOT_DIR) if snaps.enabled else "",
            "every_steps": snaps.every_steps, "every_s": snaps.every_s, "keep": snaps.keep}


HANDLERS: dict[ReadOp, Callable[[NodeAgent, dict[str, Any]], Any]] = {
    "status": status, "nodes": nodes, "links": links, "events": events, "ping": ping,
    "policy.show": policy_show,
}
