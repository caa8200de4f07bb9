"""The new node's side of scale-out: become a member, with the cluster's state or alone.

:class:`Joiner` carries out one join at a time through a
:class:`~chaos_edge.trainer.scaleout.JoinMachine` (its phases are drawn there), which decides;
the joiner does the I/O. ``Fetch`` is the pull: each source (every neighbour the scheduler
gave us) offers its snapshot of the step the ``replicate`` command names, through the
rendezvous (:mod:`~chaos_edge.trainer.rendezvous`). We estimate each link from what the
scheduler knows, and measure the links that nobody has measured yet (iperf3 through our chaosd,
all at once and while the sources are still reaching that step). The strategy's planner splits
the bytes: ``chaos`` water-fills the bytes over the sources (the exact optimum of the cost
model), ``single`` takes everything from the fastest source.
:func:`~chaos_edge.replication.transfer.fetch.fetch` then pulls every range in parallel,
verifies each block, and re-plans the bytes of a source that fails onto the others. A state
that does not fit this script is refused and reported (``StateMismatch``);
``StartAlone`` keeps our own state; ``GiveUp`` is a :class:`TrainerError`.

The joiner sees the training state through :class:`Restorable` only.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from typing_extensions import assert_never

from chaos_edge.replication.manifest import Manifest
from chaos_edge.replication.planning.model import Neighbor, PlanInput
from chaos_edge.replication.planning.waterfill import lower_bound
from chaos_edge.replication.state import Loaded, StateSpace
from chaos_edge.replication.transfer.fetch_types import FetchOptions
from chaos_edge.replication.transfer.strategies import ScaleOutJob, run_strategy
from chaos_edge.trainer.control import StateMismatch, TrainerError
from chaos_edge.trainer.policy import parse_addr
from chaos_edge.trainer.poller import POLL_S
from chaos_edge.trainer.rendezvous import (
    LINK_WAIT_S,
    OFFER_WAIT_S,
    Offer,
    Refusal,
    StateTransfer,
    TransferFailed,
)
from chaos_edge.trainer.scaleout import (
    ASK_AGAIN_S,
    AskAgain,
    Fetch,
    GiveUp,
    Joined,
    JoinMachine,
    StartAlone,
    Wait,
)
from chaos_edge.trainer.session import Session
from daemon.contracts.clock import Clock
from daemon.contracts.errors import ChaosError, ControlFailure
from daemon.contracts.protocol import (
    Bootstrap,
    LinkEstimate,
    PlanInputRecord,
    Replicate,
    Replicated,
    SourceStats,
    StateRefused,
)
from daemon.contracts.records import plain

log = logging.getLogger("chaos.trainer")
pull_log = logging.getLogger("chaos.trainer.join")
DEFAULT_MBPS = 100.0  # a link nobody has measured: equal guesses give an even split
OFFER_GRACE_S = 2.0  # a source this far behind the first offer is left out of the plan
PROBE_TIMEOUT_S = 15.0
FETCH_IO_TIMEOUT_S = 10.0  # a source silent this long mid-transfer has failed


class Restorable(Protocol):
    """What a join needs of the training state (the Trainer's
    :class:`~chaos_edge.trainer.replica.Replica`)."""

    @property
    def step(self) -> int:
        """The last committed step."""
        ...

    def local_bytes(self) -> int:
        """Bytes of our own tensors (whether probing the links pays)."""
        ...

    def fit_error(self, loaded: Loaded) -> str | None:
        """Why ``loaded`` does not fit this script, or None."""
        ...

    def restore(self, loaded: Loaded) -> None:
        """Load ``loaded`` (it fits): model, optimizer, objects, outer state, step, held."""
        ...

    def start_alone(self) -> None:
        """Keep our own state as the cluster's (a bootstrap)."""
        ...


@dataclass(frozen=True)
class Pulled:
    """A verified state and what its replication did (the ``replicated`` report)."""

    manifest: Manifest
    buffer: bytearray
    report: Replicated


class Joiner:
    """Joins this node to the cluster whenever the Trainer must become a member.

    Args:
        me: This node's id.
        session: The worker's session (commands, links, reports, the policy book).
        rendezvous: Where the sources' offers arrive.
        state: The training state to restore.
        clock: The time source of the join's deadline.
        poll: Callback: take in what the poller fetched at this step boundary (the Trainer's
            ``_poll``); commands for this node come back through :meth:`offer`.
    """

    def __init__(self, me: str, session: Session, rendezvous: StateTransfer,
                 state: Restorable, clock: Clock, poll: Callable[[], None]) -> None:  # fmt: skip
        self.me, self._s, self._rendezvous = me, session, rendezvous
        self._state, self._clock, self._poll = state, clock, poll
        self._machine: JoinMachine | None = None  # the join under way
        self._held: Replicate | Bootstrap | None = None  # a command for the next join

    def offer(self, cmd: Replicate | Bootstrap) -> None:
        """A command for this node: for the join under way, else kept for the next one."""
        if self._machine is not None:
            self._machine.offer(cmd)
        else:
            self._held = cmd  # the newest replaces older ones

    def join(self, deadline: float, was_member: bool) -> bool:
        """Block until this node is a member: restore a replicated state, or bootstrap.

        Args:
            deadline: Monotonic time by which it must be a member.
            was_member: Whether this worker trained before (a rejoin), for the log.

        Returns:
            Whether a replicated state was restored (False: we started alone).

        Raises:
            StateMismatch: The cluster's state does not fit this script (reported as
                ``state-refused``, so that chaosd does not restart the script).
            TrainerError: The join did not finish in time (the message says where it stood).
        """
        m = JoinMachine(self.me, deadline)
        if self._held is not None:
            m.offer(self._held)
        self._machine, self._held = m, None
        restored = False
        try:
            while True:
                self._poll()
                match m.advance(self._clock.monotonic(), self._s.book.newest,
                                in_touch=self._s.poller.in_touch,
                                term=self._s.poller.term):
                    case Joined():
                        return restored
                    case GiveUp(reason=reason):
                        raise TrainerError(reason)
                    case StartAlone():
                        # The scheduler made us the only member: the cluster is new, or every
                        # member and source went. A former member's own state, perhaps a
                        # little behind, beats none.
                        log.info("%s bootstraps the cluster from its own %s", self.me,
                                 f"state of step {self._state.step}" if was_member else "model")
                        self._state.start_alone()
                    case Fetch(command=cmd):
                        # A failed fetch is retried (the source keeps its offer): a dial race
                        # that replaced the link used to lose the only command, and the join
                        # hung.
                        ok = self._fetch(cmd, m)
                        restored = restored or ok
                        m.fetched(ok, self._clock.monotonic())
                    case AskAgain():
                        log.warning("%s: no source has served the state for %gs; asking to "
                                    "join again", self.me, ASK_AGAIN_S)
                        self._s.attach(self._state.step)
                    case Wait():
                        self._s.wait(POLL_S)
                    case other:
                        assert_never(other)
        finally:
            self._machine, self._held = None, m.unused

    def _fetch(self, rep: Replicate, m: JoinMachine) -> bool:
        """Pull and restore the state ``rep`` names; False (logged) if this try failed.

        Raises:
            StateMismatch: The state does not fit this script (refused before anything
                was loaded, or by a registered object's ``load_state_dict``); reported.
        """
        try:
            got = self._pull(rep, m.deadline, lambda: self._superseded(m))
            loaded = StateSpace.load(got.manifest, got.buffer)
        except ChaosError as exc:  # TransferFailed among them
            log.warning("replicating the state from %s failed: %s", sorted(rep.sources), exc)
            return False
        try:
            why = self._state.fit_error(loaded)
            if why is not None:
                raise StateMismatch(why)
            self._state.restore(loaded)  # an object's load_state_dict may still refuse
        except StateMismatch as exc:
            msg = f"{self.me} cannot join cluster state of step {loaded.runtime.get('step')}: {exc}"
            self._s.report(StateRefused(reason=msg))
            # Sent before the raise ends the script: chaosd must not restart it.
            self._s.flush_reports()
            m.refused()
            raise StateMismatch(msg) from None
        log.info("restored step %d (%d bytes) from %s in %.0f ms", self._state.step,
                 got.report.bytes, ", ".join(got.report.sources), got.report.delay_ms)
        self._s.report(got.report)
        return True

    def _superseded(self, m: JoinMachine) -> bool:
        """(During a fetch.) A newer replicate command for us came: a new scheduler's, or
        the same one's plan with other sources. The next try fetches that one."""
        self._poll()
        return m.superseded

    def _pull(self, rep: Replicate, deadline: float, superseded: Callable[[], bool]) -> Pulled:
        """Replicate the state that ``rep`` names from its sources.

        ``superseded`` ends the wait for offers: a source waits up to a minute to reach the
        step a command names, and the step a deposed scheduler named may never come (the
        cluster's round can be waiting for us).

        Raises:
            TransferFailed: No source offered the state.
            ReplicationError: The pull failed (every source failed, corrupt beyond repair...).
        """
        s = self._s
        t0 = time.monotonic()
        sources = sorted(rep.sources)
        for src in sources:
            s.want(src, rep.sources[src])  # admit it; dial it if ours is the lower id
        self._rendezvous.ask(sources, rep.version_step, deadline)
        measured = self._measure(rep, sources)  # overlaps the sources' next steps
        # Bounded per try: a source answers within OFFER_WAIT_S (with a refusal at worst), so
        # silence beyond that means a lost request, and the caller's retry asks again.
        offers, errors = self._rendezvous.offers(
            min(deadline, t0 + OFFER_WAIT_S + LINK_WAIT_S + 5.0), OFFER_GRACE_S, superseded)
        for src, why in sorted(errors.items()):
            pull_log.warning("%s offers no state: %s", src, why)
        if not offers:
            raise TransferFailed("no source offered the state: " +
                                 "; ".join(f"{k}: {v}" for k, v in sorted(errors.items())))
        manifest, chosen = _agreeing(offers)
        neighbors = tuple(_neighbor(src, rep.links.get(src, LinkEstimate()),
                                    measured.get(src, {})) for src in chosen)  # fmt: skip
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
            declined={k: v[:200] for k, v in errors.items() if isinstance(v, Refusal)},
            plan=rep.policy_version)
        return Pulled(manifest, res.buffer, report)

    def _measure(self, rep: Replicate, sources: Sequence[str]) -> dict[str, Mapping[str, Any]]:
        """Fresh measurements of the source links nobody has measured, when the state is big
        enough for a better split to pay for the probe (about a second)."""
        if rep.strategy == "single" and len(sources) == 1:
            return {}
        need = [src for src in sources
                if not rep.links.get(src, LinkEstimate()).bandwidth_mbps]
        if not need or self._state.local_bytes() < self._s.limits.probe_min_bytes:
            return {}
        try:
            data = self._s.client.call("worker.probe", {"peers": need}, timeout=PROBE_TIMEOUT_S)
        except ControlFailure as exc:
            pull_log.warning("could not measure the links to %s: %s", need, exc)
            return {}
        out = {str(k): v for k, v in dict(data or {}).items() if isinstance(v, Mapping)}
        for peer, v in out.items():
            if v.get("error"):
                pull_log.warning("probing %s: %s", peer, v["error"])
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
            pull_log.error("sources %s offer another state than %s; leaving them out", group,
                           best)
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
