"""The Trainer API (DESIGN.md, from section V-B of "Learning in Chaos").

    trainer = Trainer(model, optimizer, state={"sched": scheduler})  # attach, join (scale-out)
    while trainer.step < total_steps:
        loss = ...; loss.backward()
        trainer.update()                     # all-reduce, commit, optimizer.step()
        scheduler.step()                     # registered objects change here, and only here
        trainer.check_state_replication()    # serve a snapshot if a plan names this node
        if capture_exit_event():
            trainer.request_node_exit()
            break

``trainer.step`` is the number of committed updates, the same on every member; round ``s``
(the one ``update()`` runs when ``step == s - 1``) produces state ``s``. In the protocol's
words, ``step`` is the *last committed step*. The data plane's commit protocol
(``chaos_edge.dataplane.allreduce``) keeps every member bit-identical; this module drives it:
pick the policy, open each epoch with an agreement, rerun aborted rounds in a newer epoch,
bounded by ``timeout``, and account the stall. :mod:`~chaos_edge.trainer.stepper` lays out each
round and applies its result; :mod:`~chaos_edge.trainer.objects` carries the registered objects;
the divergence guard compares digests of the whole state inside the agreement. In ``diloco``
mode (the policy's ``sync``) most ``update()`` calls are local steps and every ``inner_steps``-th
is a round. The Trainer owns its collaborators and is made of none of them: the
:class:`~chaos_edge.trainer.replica.Replica` (the state, and what a round does to it),
:class:`~chaos_edge.trainer.epochs.Epochs` (agreements, the guard, reruns), the
:class:`~chaos_edge.trainer.membership.Membership` (the worker's states: joining, active,
leaving), the :class:`~chaos_edge.trainer.joiner.Joiner` and
:class:`~chaos_edge.trainer.source.Source` (scale-out's two sides),
:class:`~chaos_edge.trainer.shares.Shares` (consistent mode) and the
:class:`~chaos_edge.trainer.timing.StallMeter`. They call back into the Trainer only through the
callbacks their constructors document (``poll``, ``commit``, ...).

**The step boundary.** The state of step ``t`` is the model and optimizer as ``update()`` left
them (the buffers as averaged in round ``t``), plus the registered objects as the script
leaves them when it calls ``check_state_replication()``. A snapshot for a new node, and the
digest the guard compares, are taken at ``check_state_replication()`` or at the start of the
next ``update()``; so registered objects must change only between ``update()`` and
``check_state_replication()`` (a forward pass since then has changed the live BatchNorm
statistics, which is why the agreed copies are used).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from chaos_edge.dataplane import AllReducer, InputFeed, RoundAborted
from chaos_edge.trainer.control import (
    StateDiverged,
    StateMismatch,
    TrainerError,
    UnserialisableState,
)
from chaos_edge.trainer.epochs import Epochs
from chaos_edge.trainer.inflight import InFlight
from chaos_edge.trainer.joiner import Joiner
from chaos_edge.trainer.membership import Membership
from chaos_edge.trainer.objects import Registry
from chaos_edge.trainer.outer import Outer
from chaos_edge.trainer.overlap import BackgroundRound
from chaos_edge.trainer.rendezvous import StateTransfer
from chaos_edge.trainer.replica import Replica
from chaos_edge.trainer.session import EXIT_EVENT, Session, install_signal_handlers
from chaos_edge.trainer.shares import Shard, Shares
from chaos_edge.trainer.snapshots import SnapshotSettings, Snapshotter
from chaos_edge.trainer.source import Source
from chaos_edge.trainer.stepper import BufferMode, GradFeed, GradTransform, Stepper
from chaos_edge.trainer.timing import StallMeter, StepAlarm, StepTiming
from daemon.contracts import protocol
from daemon.contracts.clock import Clock, SystemClock
from daemon.contracts.policy import POLICY_KEEP, SyncMode, SyncPolicy

log = logging.getLogger("chaos.trainer")
__all__ = ["Shard", "StateDiverged", "StateMismatch", "StepTiming", "Trainer", "TrainerError",
           "UnserialisableState", "capture_exit_event"]
DIGEST_EVERY = 100  # steps between the guard's comparisons (and whenever a member joins)


def capture_exit_event() -> bool:
    """True after SIGINT/SIGTERM in this process or a leave requested through chaosd."""
    return EXIT_EVENT.is_set()


class Trainer:
    """Synchronous data-parallel training on the Chaos overlay.

    Args:
        model: The model; every node builds it the same way.
        optimizer: Its optimizer. ``update()`` steps it: the script never does.
        state: Everything else the run's state is made of, by name: LR schedulers, an EMA
            model, samplers, the script's own counters. Anything with ``state_dict()`` /
            ``load_state_dict()``, or a JSON value (read and written through
            :attr:`state`). It is replicated with the model at scale-out (a joiner's scheduler
            and LR are the cluster's) and compared by the divergence guard.
        scaler: The ``torch.amp.GradScaler`` the script scales its loss with. ``update()``
            unscales the averaged gradient, steps through the scaler and updates it, so an inf
            or NaN on any member skips the step on every member. Registered as
            ``state["grad_scaler"]``.
        clip_grad_norm: Clip the *averaged* gradient to this global L2 norm (after
            unscaling). Clipping before ``update()`` would clip each member's own gradient,
            which is not the same thing.
        grad_transform: Any other transform of the averaged gradient: called with the
            parameters (their ``.grad`` hold the average) after unscaling, before clipping
            and the step. It must be deterministic: every member runs it on the same values.
        buffers: ``"average"`` (default): buffers such as BatchNorm's running statistics
            are averaged over the members every step, weighted by samples, so they are
            identical everywhere (see :mod:`chaos_edge.trainer.stepper` for why averaged rather
            than broadcast). ``"local"``: each member keeps its own, and the guard ignores them.
        digest_every: Every this many steps (and whenever a member joins or rejoins) the
            members compare a digest of their whole state inside the agreement; a member that
            differs reports ``state-diverged`` and is re-replicated. 0: joins only.
        global_batch: Consistent mode: the global batch stays this many samples whoever
            comes and goes, split by the members' measured speeds (:attr:`shard`).
        samples_per_step: Samples behind one local gradient (weights the global average);
            ``update(samples=...)`` overrides it per step. Default 1: nodes weigh equally.
        socket: chaosd's control socket (default ``$CHAOS_SOCKET``).
        timeout: The step timeout: each time one ``update()`` has waited this long for its
            round, the worker logs a warning and reports ``round-stuck`` (an event), then
            waits on. It never exits for a stuck round: it holds the state, serves it to
            joiners, and goes on when the round commits or the cluster re-forms.
        join_timeout: Seconds the constructor may wait to become a member.
        chunk_bytes: All-reduce pipeline chunk size in bytes; None (the default) sizes the
            chunks by the round's vector: about 12 chunks of 1 to 16 MiB. Every member must
            use the same.
        clock: The time source of deadlines and stall accounting (the seam tests use).
        overlap: Start each round during ``backward()``, beside it: every parameter's
            gradient goes to the round as soon as backward finishes it, and ``update()``
            waits for the commit and steps. The result is the same bit for bit; the step is
            shorter by up to the backward pass. It asks two things of the script: every
            ``backward()`` is followed by ``update()`` (no accumulation over several
            backward passes: that is refused in one line), and nothing changes the
            gradients in between (use ``grad_transform``, ``clip_grad_norm``). The samples
            are ``samples_per_step`` (or the shard's size), fixed before backward.
        step_optimizer: False: ``update()`` leaves the averaged gradient (and the agreed
            buffers) in place and the script runs its own ``optimizer.step()`` after it, as
            after a DDP backward; then ``scaler``, ``clip_grad_norm`` and ``grad_transform``
            belong in the script, and only every-step sync runs. :mod:`chaos_edge.ddp` builds
            the Trainer so.

    Raises:
        UnserialisableState: A ``state`` object cannot be replicated (checked before anything
            else; the message names it).
        StateMismatch: The cluster's state does not fit this script (another model shape,
            another scheduler type...); nothing was loaded.
        DaemonUnreachable: chaosd's control socket cannot be reached (a ``ControlFailure``).
        TrainerError: Joining did not finish in time.

    All derive from ``ChaosError``, the one class a script needs to catch.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        *,
        state: Mapping[str, Any] | None = None,
        scaler: Any = None,
        clip_grad_norm: float | None = None,
        grad_transform: GradTransform | None = None,
        buffers: BufferMode = "average",
        digest_every: int = DIGEST_EVERY,
        global_batch: int | None = None,
        samples_per_step: int | None = None,
        socket: str | os.PathLike[str] | None = None,
        timeout: float = 120.0,
        join_timeout: float = 300.0,
        chunk_bytes: int | None = None,
        clock: Clock | None = None,
        overlap: bool = False,
        step_optimizer: bool = True,
    ) -> None:
        if digest_every < 0 or (global_batch is not None and global_batch < 1):
            raise ValueError("digest_every must be >= 0 and global_batch >= 1")
        # Validated before attaching: a bad object fails here, not at the first join.
        self._objects = Registry(state, scaler)
        self._clock = clock or SystemClock()
        self._stepper = Stepper(model, optimizer, buffers=buffers, scaler=scaler,
                                clip_grad_norm=clip_grad_norm, grad_transform=grad_transform,
                                speeds=global_batch is not None, steps=step_optimizer,
                                clock=self._clock)  # fmt: skip
        self.model, self.optimizer = model, optimizer
        self.digest_every, self.timeout, self.join_timeout = digest_every, timeout, join_timeout
        self._replica = Replica(model, optimizer, self._objects, self._stepper)
        self._replica.settled = self._backward_done
        self._version = 0  # policy version of the last committed round
        install_signal_handlers()
        self._s = Session(socket, call_timeout=10.0)
        self._meter = StallMeter(self._s, self._clock)
        rendezvous = StateTransfer(self._s.links, host=self._s.bind)
        self._snapshots: Snapshotter | None = None
        self._snapshot_due = False  # a commit the script's own step completes (step_optimizer)
        self._writing: GradFeed | None = None  # the feed of an update() beside backward
        self._background: BackgroundRound | None = None  # overlap: this backward's round
        self._inflight: InFlight | None = None  # streaming overlap: our last round's all-reduce
        try:
            # Before the join: a worker started again after a power cut (or any restart)
            # holds the newest snapshot of its box, and its join says which step that is.
            info = self._s.client.call("ping", {})
            settings = SnapshotSettings.from_reply(info.get("snapshots"))
            if settings.directory:
                self._snapshots = Snapshotter(settings, str(info.get("cluster") or ""),
                                              self._replica, self._clock,
                                              self._snapshot_failed)
            self._s.attach(self._snapshots.restore() if self._snapshots else 0)
            self.node_id = me = self._s.node_id
            self._shares = Shares(me, samples_per_step or 1, global_batch)
            # Both sides of scale-out see the state only through the replica, and come back
            # to the Trainer only through the poll callback.
            self._source = Source(me, self._s, rendezvous, self._replica, self._clock,
                                  poll=self._poll)
            self._s.serves = self._source.knows
            self._joiner = Joiner(me, self._s, rendezvous, self._replica, self._clock,
                                  poll=self._poll)
            self.reducer = AllReducer(self._s.links, chunk_bytes=chunk_bytes, timeout=timeout / 4)
            self._epochs = Epochs(me, self.reducer, self._s, self._replica, self._clock,
                                  digest_every=digest_every, poll=self._poll,
                                  commit=self._apply)  # fmt: skip
            self._membership = Membership(me, self._s, self._joiner, self._clock,
                                          join_timeout=join_timeout,
                                          step=lambda: self._replica.step,
                                          poll=self._poll, joined=self._joined)  # fmt: skip
            # (The poller's thread.) Each policy's effective step and mode: a switch
            # pending moves where the data plane's rounds fall (_on_policy).
            self._modes: dict[int, tuple[int, SyncMode]] = {}
            self._s.poller.on_policy = self._on_policy
            self._s.poller.cannot_diloco = self._replica.cannot_step_locally()
            self._s.poller.on_command = self._on_command
            self._membership.join(self._clock.monotonic() + join_timeout)
            if step_optimizer:
                optimizer.register_step_pre_hook(self._script_stepped)
            if overlap:
                for p in self._stepper.params:
                    if p.requires_grad:
                        p.register_post_accumulate_grad_hook(self._grad_ready)
        except BaseException:
            self._s.close()
            rendezvous.close()
            if self._snapshots is not None:
                self._snapshots.close()
            raise

    @property
    def step(self) -> int:
        """The number of committed updates, the same on every member (module docstring).
        A streaming round still in flight (``overlap``) counts: its step is done here, and
        its result lands in the next ``update()``."""
        return self._replica.step + (self._inflight is not None)

    @property
    def stalls(self) -> Sequence[StepTiming]:
        """Where each of the last 10,000 ``update()`` calls spent its time, oldest first."""
        return self._meter.stalls

    @property
    def state(self) -> dict[str, Any]:
        """The registered state by name (``state=`` and the scaler). JSON values are read and
        written here; after a join they hold the cluster's values."""
        return self._objects.values

    @property
    def shard(self) -> Shard:
        """This member's part of the next step: the members, its index, the global batch and
        its slice of it (see :mod:`chaos_edge.trainer.shares`). Read it before loading the batch;
        ``update()`` then counts ``shard.size`` samples by default."""
        return self._shares.shard(self.step + 1, self._next_policy())

    @property
    def samples_per_step(self) -> int:
        """Samples behind one local gradient when ``update()`` names none (no global batch)."""
        return self._shares.per_member

    @samples_per_step.setter
    def samples_per_step(self, n: int) -> None:
        self._shares.per_member = n

    @property
    def global_batch(self) -> int | None:
        """The fixed global batch of consistent mode, or None."""
        return self._shares.global_batch

    @property
    def policy_version(self) -> int:
        """Version of the sync policy our last committed round ran under."""
        return self._version

    @property
    def joins(self) -> int:
        """Joins this process completed: 1 once it is a member, then one more per rejoin (a
        rejoin restores the cluster's state, so the step may jump ahead)."""
        return self._membership.joins

    @property
    def _outer(self) -> Outer | None:
        """diloco mode's outer state (read by the diloco test worker and the slowlinks bench)."""
        return self._replica.outer

    # -- public API ------------------------------------------------------------------------
    def update(self, samples: int | None = None, *, feed: GradFeed | None = None) -> None:
        """All-reduce the gradients (and buffers), commit, then step: unscale, transform,
        clip, ``optimizer.step()`` (through the scaler), and zero the gradients. A round
        that cannot commit is waited on, however long (see ``timeout``).

        Args:
            samples: Samples behind this gradient (default: ``shard.size`` in consistent
                mode, else ``samples_per_step``).
            feed: The gradients are still being computed (:meth:`grad_feed`; this call then
                runs beside the backward pass, on another thread): the round's first
                attempt sends each chunk as the feed fills it. A rerun, or a round that
                counts no samples from us, waits for the whole gradient first.

        Raises:
            StateDiverged: This node cannot be reconciled; exit non-zero and rejoin.
            DaemonUnreachable: chaosd stopped answering.
        """
        if feed is None and self._background is not None:  # overlap: begun in backward
            bg, self._background = self._background, None
            bg.join()
            if samples is not None:
                raise TrainerError("with overlap=True the round begins in backward(), before "
                                   "update() is called: set trainer.samples_per_step (or use "
                                   "global_batch) instead of update(samples=...)")
            return
        self._writing = feed
        try:
            self._update(samples, feed)
        finally:
            self._writing = None

    def _grad_ready(self, param: torch.Tensor) -> None:
        """(overlap; autograd's thread.) ``param``'s gradient is final for this backward."""
        bg = self._background
        if bg is None:
            bg = self._background = BackgroundRound(self.grad_feed(), self._fed_update)
        elif bg.feed.has(param):
            # The round goes on with the first backward's gradients, and ends before the
            # error does: a round thread left running in torch aborts the interpreter's exit.
            self._background = None
            bg.join()
            raise TrainerError("overlap=True needs update() after every backward(): a second "
                               "backward before it would change gradients already sent "
                               "(accumulate without overlap)")
        bg.feed.ready([param])

    def _script_stepped(self, _opt: torch.optim.Optimizer, _args: Any, _kwargs: Any) -> None:
        """Only update() steps the optimizer: a step of the script's would step every member
        twice (the same everywhere, so nothing else would tell)."""
        if not self._stepper.stepping:
            raise TrainerError("the Trainer steps the optimizer in update(): remove the "
                               "script's optimizer.step() (and scaler.step()), or use "
                               "chaos_edge.ddp to keep them")

    def _fed_update(self, feed: GradFeed) -> None:
        self.update(feed=feed)

    def _update(self, samples: int | None, feed: GradFeed | None) -> None:
        landed = self._land() if self._inflight is not None else (0.0, 0, "")
        t0 = self._clock.monotonic()
        n = self._shares.samples(self.step + 1, self._next_policy) if samples is None else samples
        self._shares.began(t0, n)
        self._poll()
        alarm = StepAlarm(self._s, self._clock, self.timeout)
        joins = self._membership.joins
        pub = self._membership.policy(alarm)
        # diloco: the local step (none for a gradient of a state we just replaced by a rejoin)
        if self._replica.inner_step(pub, n if self._membership.joins == joins else 0):
            self._account(t0, *landed, rejoined=self._membership.joins != joins)
            return
        if self._launch(pub, n):  # streaming with overlap: the round runs beside our next step
            self._account(t0, *landed, rejoined=self._membership.joins != joins)
            return
        spent, reruns, reason = self._round(n, feed, alarm, joins)
        self._account(t0, spent + landed[0], reruns + landed[1], reason or landed[2],
                      rejoined=self._membership.joins != joins)

    def _round(self, n: int, feed: GradFeed | None, alarm: StepAlarm, joins: int,
               aborted: tuple[SyncPolicy, RoundAborted] | None = None
               ) -> tuple[float, int, str]:  # fmt: skip
        """Run round ``step + 1`` until it commits (``aborted``: its first attempt, run in
        flight under that policy, aborted so); returns the seconds spent in collectives, the
        reruns and the last abort's reason."""
        reruns, spent, reason = 0, 0.0, ""
        epochs = self._epochs
        if aborted is not None:
            pub, exc = aborted
            reruns, reason = 1, exc.reason
            if self._aborted(pub, alarm, exc):
                self._committed(pub)
                return spent, reruns, reason
        while True:
            book = self._membership.policy(alarm)
            self._source.before_round(book, self._version, alarm.at)
            pub = epochs.governing(book)  # a newer one if we began catching up in it
            epochs.guard_turn(pub)
            epoch = epochs.epoch(pub)
            # A gradient of a state we no longer hold (rejoined in this call) or one the guard
            # found out of line counts for nothing.
            void = epochs.diverged or self._membership.joins != joins
            rn = 0 if void else self._replica.round_samples(n)  # diloco: the window's samples
            overlap = feed is not None and not reruns and rn > 0 and self._replica.outer is None
            if feed is not None and not overlap:
                feed.feed.complete.wait()  # the whole gradient first (see ``feed``)
            ready = feed.feed if overlap and feed is not None else None
            flat, lossy = self._replica.round_input(self._gather(pub, rn, grads=not overlap),
                                                    rn)  # diloco: the pseudo-gradient
            try:
                # Our digest is local work, so it is timed as stall, not as the collective.
                digest = self._own_digest() if epochs.compares(pub) else b""
                t1 = self._clock.monotonic()
                if epoch != epochs.agreed:
                    agreed = epochs.agree(pub, epoch[1], digest)
                    spent += self._clock.monotonic() - t1  # a collective: its waits are the peers'
                    if agreed:
                        self._version = pub.version
                        break  # the agreement committed the result we held for this round
                t1 = self._clock.monotonic()
                res = self._allreduce(flat, rn, lossy, pub, epoch[1], ready)
                spent += self._clock.monotonic() - t1
                self._version = pub.version
                self._apply(res.values, pub.version, pub.sync)
                break
            except RoundAborted as exc:
                reruns, reason = reruns + 1, exc.reason
                if self._aborted(pub, alarm, exc):
                    break  # the peers' next epoch committed the result we held
        self._committed(pub)
        return spent, reruns, reason

    def _allreduce(self, flat: Any, n: int, lossy: int, pub: SyncPolicy, attempt: int,
                   feed: InputFeed | None = None, own_buffer: bool = True) -> Any:
        """The all-reduce of round ``step + 1`` (``own_buffer`` False: the result goes to a
        fresh buffer, as one still in flight when the next round starts must)."""
        # The controller's bytes per round: the whole layout (a streaming round's vector is
        # one fragment of it; the controller knows the fragments).
        self._s.poller.elements = self._stepper.size
        # The reused result buffer must never be the one a held result lives in (nor a
        # streaming round's, which carries one fragment).
        out = (self._stepper.result if own_buffer and self._replica.held is None
               and flat is self._stepper.flat else None)  # fmt: skip
        return self.reducer.allreduce(flat, n, step=self._replica.round_step() + 1,
                                      policy=pub, attempt=attempt, out=out, lossy=lossy,
                                      lane=self._replica.lane(), feed=feed)  # fmt: skip

    def _aborted(self, pub: SyncPolicy, alarm: StepAlarm, exc: RoundAborted) -> bool:
        """After an abort of round ``step + 1`` under ``pub``: keep an uncertain result, say
        so, and wait for the next epoch; True if catching up in it committed the round."""
        if exc.result is not None:
            self._replica.hold(exc.result, exc.policy_version, self._mode_of(exc.policy_version))
        self._s.report(protocol.RoundAborted(step=self._replica.step + 1,
                                             reason=exc.reason[:200]))
        nxt = self._epochs.next_epoch(pub, alarm, exc)
        if nxt is not None and self._epochs.catch_up(nxt):
            self._version = pub.version
            return True
        return False

    def _committed(self, pub: SyncPolicy) -> None:
        """Round ``step`` committed under ``pub`` (or a later policy)."""
        # Every member of the epoch that committed has its state: it needs no offer any more.
        self._source.withdraw(pub.members)
        if self._snapshots is not None:
            if self._stepper.steps:
                self._snapshots.committed()
            else:  # the state of this step is complete only after the script's step
                self._snapshot_due = True

    def _account(self, t0: float, spent: float, reruns: int, reason: str,
                 rejoined: bool = False) -> None:
        self._meter.account(t0, spent, reruns, reason, step=self.step, version=self._version,
                            optimizer_s=self._stepper.take_step_s(), rejoined=rejoined)
        self._shares.ended(self._clock.monotonic())

    def _launch(self, pub: SyncPolicy, n: int) -> bool:
        """Start round ``step + 1`` in flight if its policy overlaps rounds and it is a plain
        one: its epoch agreed, no guard comparison due, no new node to serve before it, no
        uncertain result, this member active and in line. True if started."""
        rep, epochs = self._replica, self._epochs
        # A round under a policy of another mode switches the mode when it commits: it runs
        # here, so the next step follows the new mode.
        if (not pub.sync.overlap or rep.outer is None or rep.held is not None
                or pub.sync != rep.rhythm.mode
                or self._membership.state != "active" or epochs.diverged
                or pub.version != self._version or epochs.governing(pub) is not pub
                or epochs.epoch(pub) != epochs.agreed or epochs.check_due()):
            return False
        rn = rep.round_samples(n)
        flat, lossy = rep.round_input(self._gather(pub, rn), rn)
        attempt = epochs.epoch(pub)[1]
        self._inflight = InFlight(pub, n, lambda: self._allreduce(flat, rn, lossy, pub, attempt,
                                                                   own_buffer=False))
        return True

    def _land(self, rerun: bool = True) -> tuple[float, int, str]:
        """Land the round in flight: apply its result, or (``rerun``) run it again here if
        its all-reduce aborted. Returns as :meth:`_round` does."""
        fl, t1 = self._inflight, self._clock.monotonic()
        assert fl is not None
        fl.wait()
        self._inflight = None
        waited = self._clock.monotonic() - t1
        if fl.error is None:
            self._version = fl.pub.version
            self._apply(fl.result.values, fl.pub.version, fl.pub.sync)
            self._committed(fl.pub)
            return waited, 0, ""
        if not isinstance(fl.error, RoundAborted):
            raise fl.error
        if not rerun:
            return waited, 0, fl.error.reason
        alarm = StepAlarm(self._s, self._clock, self.timeout)
        spent, reruns, reason = self._round(fl.n, None, alarm, self._membership.joins,
                                            aborted=(fl.pub, fl.error))
        return waited + spent, reruns, reason

    def grad_feed(self) -> GradFeed:
        """A feed for ``update(feed=...)``: hand it each parameter as backward finishes its
        gradient (:mod:`chaos_edge.ddp` does, bucket by bucket)."""
        return GradFeed(self._stepper)

    def check_state_replication(self) -> None:
        """Serve a snapshot if a ``replicate`` command names this node as a source."""
        self._poll()

    def request_node_exit(self) -> None:
        """Leave gracefully (scale-in), then close the links. Until the policy without us
        governs our next round we take part in the rounds with no samples, so the leave
        costs the others no stall (:meth:`Membership.leave`)."""
        if self._inflight is not None:
            self._land()  # the leave names our last committed step: every round landed
        try:
            self._membership.leave(self.timeout, self._empty_round,
                                   lambda: sum(self._source.rendezvous.serving().values()))
        finally:
            self.close()

    def close(self) -> None:
        """Close links and the control connection (idempotent); a round in flight and a
        snapshot being written are finished first (the round is not rerun if it aborted)."""
        if self._inflight is not None:
            self._land(rerun=False)
        if self._snapshots is not None:
            self._snapshots.close()
        self.reducer.close()
        self._s.close()
        self._source.close()

    def _snapshot_failed(self, reason: str) -> None:
        """The disk refused a snapshot (full, read-only): said once; training goes on."""
        self._s.report(protocol.SnapshotFailed(reason=reason[:300]))

    def state_digest(self) -> str:
        """SHA-256 of the whole state: parameters, buffers (as agreed at the last step),
        optimizer state and every registered object. Equal on every member at a step (a
        round in flight lands first)."""
        if self._inflight is not None:
            self._land()
        return self._replica.digest().hex()

    # -- the round's parts -----------------------------------------------------------------
    def _next_policy(self) -> SyncPolicy | None:
        """The policy of round ``step + 1``, else the newest (what a shard is computed for)."""
        return self._s.book.for_round(self.step + 1) or self._s.book.newest

    def _gather(self, pub: SyncPolicy, n: int, grads: bool = True) -> Any:
        """Our input to the round under ``pub`` (``grads=False``: a feed writes those)."""
        flat = self._stepper.gather(self._shares.slot(pub), self._shares.speed, n, grads)
        if not n:
            flat.zero_()  # times zero samples is zero, unless it is inf or NaN
        return flat

    def _own_digest(self) -> bytes:
        """What this member brings to the guard's comparison (b"": nothing)."""
        # A leaver's script has stopped stepping its scheduler and counters: it is no longer
        # compared (the others' rounds ignore its samples anyway).
        return b"" if self._membership.state == "leaving" else self._replica.digest()

    def _backward_done(self) -> None:
        """(The replica's ``settled``.) Wait while a backward pass still writes gradients."""
        if self._writing is not None:
            self._writing.feed.complete.wait()

    def _apply(self, values: Any, version: int, mode: SyncMode | None) -> None:
        """Apply the committed result of round ``step + 1``, run under policy ``version`` of
        sync ``mode`` (None: a held result from a snapshot that did not record it)."""
        mode = mode or self._mode_of(version)
        lead = self._replica.lead()  # the round's gradients' segment, before commit moves on
        self._replica.commit(values, mode)
        pub = self._s.book.get(version)  # the round's members lay out its speed slots
        self._shares.committed(pub.members if pub is not None else None,
                               self._stepper.speeds(values, lead))

    def _mode_of(self, version: int) -> SyncMode:
        """The sync mode of policy ``version``; the mode in force if it is forgotten (the
        newest policy's mode would switch early whenever a switch is pending)."""
        pub = self._s.book.get(version)
        return pub.sync if pub is not None else self._replica.rhythm.mode

    def _empty_round(self) -> None:
        """One round with no samples (a leaver's drain)."""
        self.optimizer.zero_grad(set_to_none=True)
        self.update(samples=0)

    # -- the callbacks its collaborators are given -----------------------------------------
    def _poll(self) -> None:
        """Take in what the poller fetched (no I/O). Every call happens at a step boundary,
        so a snapshot that a new replicate command asks for can be taken right here (waiting
        for the next commit could deadlock: that round may need the very node that waits
        for this snapshot)."""
        if self._snapshot_due and self._snapshots is not None:
            self._snapshot_due = False
            self._snapshots.committed()
        committed = self._replica.step  # a round in flight keeps its links and its state
        self._s.poll(committed, self._membership.state, self._version)
        self._s.settle(committed + 1)
        for cmd in self._s.take_replications():
            # Ours to fetch (the joiner keeps it for the join under way or the next one), or
            # another node's, which we may be a source of.
            (self._joiner if cmd.new == self.node_id else self._source).offer(cmd)
        if self._inflight is None:  # a new node gets a state with every round landed
            self._source.serve_due()

    def _joined(self, restored: bool) -> None:
        """(After each join.) A fresh epoch, nothing the guard held against us, and no
        speeds or shard measured before a restored state."""
        if restored:
            self._shares.forget()
        self._epochs.joined()

    def _on_command(self, cmd: protocol.WorkerCommand) -> None:
        """(The poller's thread.) A ``replicate`` naming us a source of a new node that the
        round in flight waits on aborts that round: we serve only between rounds, so the
        round and the new node would each wait for the other. The command normally comes
        before that round (:meth:`Source.before_round` waits for it); one that came late (a
        broker restart lost it, and the scheduler sent it again) stalled the round until its
        phase timed out (a quarter of ``timeout``: 30 s by default). The rerun's step
        boundary serves it."""
        rep = self._source.late(cmd, self._version)
        if rep is not None and self.reducer.interrupt_for(
                rep.new, rep.policy_version, f"serving {rep.new}, whose replicate command came "
                "after the round began"):
            log.warning("the replicate command for %s came after round %d began: rerunning "
                        "it once %s is served", rep.new, self.step + 1, rep.new)

    def _on_policy(self, pub: SyncPolicy) -> None:
        """(The poller's thread.) A new policy that governs the round in flight aborts it
        now, so the round reruns under it at once: after a failure the policy without the
        silent node takes effect at once, and the round must not wait for its timeout. The
        links to the neighbours it dropped close, so a send blocked on one returns."""
        # The data plane counts rounds, where the mode in force puts them (rhythm.py); a
        # policy of another mode governs the next round of this one, and the switch follows.
        rhythm = self._replica.rhythm
        self._modes[pub.version] = (pub.effective_step, pub.sync)
        for old in sorted(self._modes)[:-POLICY_KEEP]:
            del self._modes[old]
        pending = [m.period for e, m in self._modes.values()
                   if e > rhythm.anchor_step and not rhythm.same_rounds(m)]
        neighbours = self.reducer.supersede(
            pub.version, rhythm.fence(pub.effective_step, self._replica.step, pending))
        if neighbours and self.node_id in pub.members:
            gone = [p for p in neighbours if p not in pub.members]
            if gone:
                self._s.drop(gone, f"dropped by policy v{pub.version}")
