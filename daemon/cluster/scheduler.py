"""The cluster scheduler's state: membership, links, policy versions and the event log.

Only the elected node runs a :class:`Scheduler`. It starts from the retained ``cluster/state``
that the previous scheduler left, so a failover loses nothing that was published. Its methods
are plain state transitions driven by what the node agent observes; publishing is the agent's
job (it calls :meth:`Scheduler.snapshot` when :attr:`Scheduler.dirty` is set).
"""

from __future__ import annotations

import logging
from collections import deque
from dataclasses import replace
from typing import Any

from daemon.contracts.clock import Clock
from daemon.contracts.kinds import LIVE_STATES, EventKind
from daemon.contracts.messages import ClusterState, Event, Heartbeat, LinkRecord, NodeRecord, Status
from daemon.contracts.policy import POLICY_KEEP, TERM_POLICY_SPAN, SyncPolicy, parse

log = logging.getLogger("chaosd.scheduler")
EVENT_KEEP = 100          # events carried in the retained snapshot
FORGET_AFTER_S = 600.0    # failed/left nodes drop out of the snapshot after this long


class Scheduler:
    """Authoritative cluster state while this node holds ``term``."""

    def __init__(self, me: str, term: int, base: ClusterState | None, clock: Clock) -> None:
        self.me = me
        self.term = term
        self._clock = clock
        self.nodes: dict[str, NodeRecord] = dict(base.nodes) if base else {}
        self.links: list[LinkRecord] = list(base.links) if base else []
        # Each term numbers its policies from a floor of its own: the schedulers of two terms
        # (the two sides of a partition, each electing one) never issue the same version, and
        # when the sides meet the newer term's policies are the newest everywhere.
        self.policy_version = max(base.policy_version if base else 0,
                                  (term - 1) * TERM_POLICY_SPAN)
        self.policy: SyncPolicy | None = parse(base.policy) if base else None
        self.policies: deque[SyncPolicy] = deque(
            (p for doc in (base.policies if base else ()) if (p := parse(doc)) is not None),
            maxlen=POLICY_KEEP)
        self.step = base.step if base else 0
        self.version = base.version if base else 0
        self.events: deque[Event] = deque(base.events if base else (), maxlen=EVENT_KEEP)
        self._seq = max((e.seq for e in self.events), default=0)
        self.dirty = True

    def now_ms(self) -> float:
        """Wall time to the millisecond: what the snapshot's records keep (whole
        milliseconds pack into a few bytes, daemon/contracts/statepack.py)."""
        return round(self._clock.wall(), 3)

    # --- events -------------------------------------------------------------------------
    def record(self, kind: EventKind, node: str | None = None, peer: str | None = None,
               delay_ms: float | None = None, **detail: Any) -> Event:
        """Append an event to the log that every node mirrors."""
        self._seq += 1
        event = Event(seq=self._seq, ts=self._clock.wall(), kind=kind, node=node, peer=peer,
                      term=self.term, delay_ms=None if delay_ms is None else round(delay_ms, 3),
                      detail=detail)
        self.events.append(event)
        self.dirty = True
        log.info("event %s node=%s peer=%s delay_ms=%s %s", kind, node, peer, event.delay_ms,
                 detail or "")
        return event

    # --- membership ---------------------------------------------------------------------
    def set_node(self, node: str, **changes: Any) -> None:
        rec = self.nodes.get(node) or NodeRecord(state="standby", joined_at=self.now_ms())
        if "state" in changes and changes["state"] != rec.state:
            changes.setdefault("since", self.now_ms())
        new = replace(rec, **changes)
        if new != self.nodes.get(node):
            self.nodes[node] = new
            self.dirty = True

    def observe_status(self, st: Status) -> str | None:
        """Apply a presence message: ``"lost"`` (a failure to declare), ``"left"``,
        ``"restarted"`` (a member came back as a new process: fail it, then observe again)
        or None."""
        rec = self.nodes.get(st.node)
        if rec is not None and st.incarnation < rec.incarnation:
            return None  # an older process of that node: its news is stale
        if st.online and rec is not None and rec.state in LIVE_STATES \
                and rec.state != "standby" and st.incarnation > rec.incarnation:
            # Its old process died unannounced (its will lost with a broker that restarted):
            # it is still in the sync policy, and must be scaled in before it can rejoin.
            return "restarted"
        if st.online:
            if rec is None or rec.state in ("failed", "left") or st.incarnation > rec.incarnation:
                # A new process (or one back from failed/left) has no worker attached yet.
                self.set_node(st.node, state="standby", addr=st.addr, incarnation=st.incarnation,
                              neighbors=[], data_addr="")
            else:
                self.set_node(st.node, addr=st.addr)
            return None
        if rec is None or rec.state in ("failed", "left"):
            return None
        if st.reason == "left":
            self.set_node(st.node, state="left")
            return "left"
        return "lost"

    def observe_heartbeat(self, hb: Heartbeat, addr: str = "") -> None:
        """A heartbeat from a node we don't list (or listed as gone) re-admits it as standby."""
        rec = self.nodes.get(hb.node)
        if rec is None or (rec.state in ("failed", "left") and hb.incarnation >= rec.incarnation):
            self.set_node(hb.node, state="standby", incarnation=hb.incarnation, neighbors=[],
                      addr=addr or (rec.addr if rec else ""))
        if hb.step > self.step and self.nodes[hb.node].state == "active":
            self.step = hb.step

    def fail(self, node: str, reason: str, silence_s: float | None) -> None:
        """Declare ``node`` failed and log a ``node-failed`` event."""
        rec = self.nodes.get(node)
        if rec is None or rec.state not in LIVE_STATES:
            return
        self.set_node(node, state="failed")
        self.record("node-failed", node=node,
                    delay_ms=None if silence_s is None else silence_s * 1000.0,
                    reason=reason, previous=rec.state)

    def live(self) -> list[str]:
        return sorted(n for n, r in self.nodes.items() if r.state in LIVE_STATES)

    def prune(self) -> None:
        """Forget nodes that have been failed or left for a long time."""
        cutoff = self._clock.wall() - FORGET_AFTER_S
        for node, rec in list(self.nodes.items()):
            if rec.state in ("failed", "left") and rec.since < cutoff:
                del self.nodes[node]
                self.dirty = True

    # --- publishing ---------------------------------------------------------------------
    def snapshot(self) -> ClusterState:
        self.version += 1
        self.dirty = False
        return ClusterState(term=self.term, leader=self.me, version=self.version,
                            nodes=dict(self.nodes), links=list(self.links),
                            policy_version=self.policy_version, step=self.step,
                            events=list(self.events),
                            policy=self.policy.to_dict() if self.policy else {},
                            policies=[p.to_dict() for p in self.policies])
