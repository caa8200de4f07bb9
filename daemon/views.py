"""Control-socket answers: the JSON shapes DESIGN.md fixes, built from a node's view."""

from __future__ import annotations

import dataclasses
from collections import Counter
from typing import Any

from daemon.errors import ControlError
from daemon.node import NodeAgent


def status(agent: NodeAgent, _args: dict[str, Any]) -> dict[str, Any]:
    el = agent.election
    counts = Counter(agent.node_state(n) for n in agent.node_ids())
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
    for node in agent.node_ids():
        rec = view_nodes.get(node)
        st = agent.presence.get(node)
        hb = agent.beats.get(node)
        age = 0.0 if node == agent.me else agent.detector.age(node)
        out.append({
            "id": node,
            "state": agent.node_state(node),
            "addr": (rec.addr if rec and rec.addr else (st.addr if st else
                     (agent.cfg.advertise if node == agent.me else ""))),
            "scheduler": node == agent.election.leader,
            "heartbeat_age_s": None if age is None else round(age, 3),
            "step": agent.step if node == agent.me else (hb.step if hb else 0),
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
    return agent.info()


def not_yet(op: str) -> Any:
    def handler(_agent: NodeAgent, _args: dict[str, Any]) -> Any:
        raise ControlError(f"'{op}' needs training support, which this chaosd build does not "
                           "have yet", code="failed")
    return handler


HANDLERS = {
    "status": status, "nodes": nodes, "links": links, "events": events, "ping": ping,
    "join": not_yet("join"), "leave": not_yet("leave"), "link": not_yet("link"),
    "probe": not_yet("probe"),
}
