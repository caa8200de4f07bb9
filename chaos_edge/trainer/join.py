"""The new node's side of scale-out: gather offers, estimate the links, plan, pull, verify.

Each source (every neighbour the scheduler gave us) offers its snapshot of the step that the
``replicate`` command names. We estimate each link from what the scheduler knows, and we
measure the links that nobody has measured yet (iperf3 through our chaosd, all at once and
while the sources are still reaching that step). The strategy's planner splits the bytes:
``chaos`` water-fills the bytes over the sources (the exact optimum of the cost model),
``single`` takes everything from the fastest source.
:func:`~chaos_edge.replication.transfer.fetch.fetch` then pulls every range in parallel, verifies
each block, and re-plans the bytes of a source that fails onto the others.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from chaos_edge.replication.manifest import Manifest
from chaos_edge.replication.planning.model import Neighbor, PlanInput
from chaos_edge.replication.planning.waterfill import lower_bound
from chaos_edge.replication.transfer.fetch_types import FetchOptions
from chaos_edge.replication.transfer.strategies import ScaleOutJob, run_strategy
from chaos_edge.trainer.policy import parse_addr
from chaos_edge.trainer.session import Session
from chaos_edge.trainer.transfer import LINK_WAIT_S, OFFER_WAIT_S, Offer, Refusal, TransferFailed
from daemon.contracts.errors import ControlFailure
from daemon.contracts.protocol import (
    LinkEstimate,
    PlanInputRecord,
    Replicate,
    Replicated,
    SourceStats,
)
from daemon.contracts.records import plain

log = logging.getLogger("chaos.trainer.join")
DEFAULT_MBPS = 100.0  # a link nobody has measured: equal guesses give an even split
OFFER_GRACE_S = 2.0  # a source this far behind the first offer is left out of the plan
PROBE_TIMEOUT_S = 15.0
FETCH_IO_TIMEOUT_S = 10.0  # a source silent this long mid-transfer has failed


@dataclass(frozen=True)
class Pulled:
    """A verified state and what its replication did (the ``replicated`` report)."""

    manifest: Manifest
    buffer: bytearray
    report: Replicated


def pull_state(s: Session, rep: Replicate, deadline: float, local_bytes: int,
               superseded: Callable[[], bool] | None = None) -> Pulled:
    """Replicate the state that ``rep`` names from its sources.

    Args:
        s: The worker's session.
        rep: Our ``replicate`` command.
        deadline: Monotonic time by which the state must be here.
        local_bytes: Size of our own model and optimizer tensors, to decide whether probing pays.
        superseded: Whether a newer command replaced ``rep``: the wait for offers ends then.
            A source waits up to a minute to reach the step a command names, and the step a
            deposed scheduler named may never come: the cluster's round can be waiting for us.

    Raises:
        TransferFailed: No source offered the state.
        ReplicationError: The pull failed (every source failed, corrupt beyond repair...).
    """
    t0 = time.monotonic()
    sources = sorted(rep.sources)
    for src in sources:
        s.want(src, rep.sources[src])  # admit it; dial it if ours is the lower id
    s.transfer.ask(sources, rep.version_step, deadline)
    measured = _measure(s, rep, sources, local_bytes)  # overlaps the sources' next steps
    # Bounded per try: a source answers within OFFER_WAIT_S (with a refusal at worst), so
    # silence beyond that means a lost request, and the caller's retry asks again.
    offers, errors = s.transfer.offers(min(deadline, t0 + OFFER_WAIT_S + LINK_WAIT_S + 5.0),
                                       OFFER_GRACE_S, superseded)
    for src, why in sorted(errors.items()):
        log.warning("%s offers no state: %s", src, why)
    if not offers:
        raise TransferFailed("no source offered the state: " +
                             "; ".join(f"{k}: {v}" for k, v in sorted(errors.items())))
    manifest, chosen = _agreeing(offers)
    neighbors = tuple(_neighbor(src, rep.links.get(src, LinkEstimate()), measured.get(src, {}))
                      for src in chosen)  # fmt: skip
    addresses = {src: (parse_addr(rep.sources[src])[0], offers[src].port) for src in chosen}
    options = FetchOptions(deadline_s=max(1.0, deadline - time.monotonic()),
                           io_timeout=FETCH_IO_TIMEOUT_S)  # fmt: skip
    t_pull = time.monotonic()
    res = run_strategy(rep.strategy, ScaleOutJob(manifest, s.links.me, neighbors, addresses,
                                                 options=options))  # fmt: skip
    done = time.monotonic()
    fetched = res.fetch
    per_source = {} if fetched is None else {
        t.id: SourceStats(bytes=t.bytes, end_s=None if t.end_s is None else round(t.end_s, 4),
                          failed=t.failed[:200] if t.failed else None)
        for t in fetched.sources.values()}  # fmt: skip
    inputs = PlanInput.create(neighbors, manifest.segments(), align_bytes=manifest.block_size)
    report = Replicated(
        version=manifest.version, bytes=manifest.total_bytes,
        delay_ms=round((done - t0) * 1e3, 3),
        transfer_ms=round((done - t_pull) * 1e3, 3),
        decision_ms=round(res.decision_s * 1e3, 3),
        strategy=rep.strategy,
        sources=[k for k, v in per_source.items() if v.bytes > 0],
        per_source=per_source,
        # The planner's inputs, so that every plan can be re-run and judged afterwards.
        plan_inputs=[PlanInputRecord(n.id, n.t_prop_s, n.t_trans_s_per_byte, n.tau_sync_s)
                     for n in neighbors],
        predicted_ms=None if res.plan is None else round(res.plan.makespan_s * 1e3, 3),
        lower_bound_ms=round(lower_bound(inputs) * 1e3, 3),
        replans=0 if fetched is None else len(fetched.replans),
        refetched_blocks=0 if fetched is None else len(fetched.refetched_blocks),
        left_out={k: v[:200] for k, v in errors.items()},
        declined={k: v[:200] for k, v in errors.items() if isinstance(v, Refusal)})
    return Pulled(manifest, res.buffer, report)


def _measure(s: Session, rep: Replicate, sources: Sequence[str], local_bytes: int
             ) -> dict[str, Mapping[str, Any]]:
    """Fresh measurements of the source links nobody has measured, when the state is big
    enough for a better split to pay for the probe (about a second)."""
    if rep.strategy == "single" and len(sources) == 1:
        return {}
    need = [src for src in sources
            if not rep.links.get(src, LinkEstimate()).bandwidth_mbps]
    if not need or local_bytes < s.probe_min_bytes:
        return {}
    try:
        data = s.client.call("worker.probe", {"peers": need}, timeout=PROBE_TIMEOUT_S)
    except ControlFailure as exc:
        log.warning("could not measure the links to %s: %s", need, exc)
        return {}
    out = {str(k): v for k, v in dict(data or {}).items() if isinstance(v, Mapping)}
    for peer, v in out.items():
        if v.get("error"):
            log.warning("probing %s: %s", peer, v["error"])
    return out


def _agreeing(offers: Mapping[str, Offer]) -> tuple[Manifest, list[str]]:
    """The manifest most sources offer, and those sources. Members at one step hold
    bit-identical states, so a source that differs is left out, loudly."""
    groups: dict[str, list[str]] = {}
    for src in sorted(offers):
        groups.setdefault(offers[src].manifest.to_json(), []).append(src)
    best = max(groups.values(), key=lambda g: (len(g), offers[g[0]].manifest.version))
    for group in groups.values():
        if group is not best:
            log.error("sources %s offer another state than %s; leaving them out", group, best)
    return offers[best[0]].manifest, best


def _neighbor(src: str, known: LinkEstimate, fresh: Mapping[str, Any]) -> Neighbor:
    def pick(key: str) -> float | None:
        for doc in (fresh, plain(known)):
            value = doc.get(key)
            if isinstance(value, (int, float)) and value > 0:
                return float(value)
        return None

    rtt_ms = pick("rtt_ms") or 0.0
    mbps = pick("bandwidth_mbps") or DEFAULT_MBPS
    return Neighbor(src, t_prop_s=rtt_ms / 2000.0, t_trans_s_per_byte=8.0 / (mbps * 1e6))
