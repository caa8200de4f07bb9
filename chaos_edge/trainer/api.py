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
is a round (:mod:`~chaos_edge.trainer.local`); :mod:`~chaos_edge.trainer.epochs` opens epochs and
reruns; :mod:`~chaos_edge.trainer.leaving` is the graceful leave.

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
from collections.abc import Mapping
from typing import Any

import torch

from chaos_edge.dataplane import AllReducer, RoundAborted
from chaos_edge.trainer.control import (
    StateDiverged,
    StateMismatch,
    TrainerError,
    UnserialisableState,
)
from chaos_edge.trainer.epochs import Epochs
from chaos_edge.trainer.joiner import Joiner
from chaos_edge.trainer.leaving import Leaving, _Left
from chaos_edge.trainer.objects import Registry
from chaos_edge.trainer.outer import Outer
from chaos_edge.trainer.poller import POLL_S
from chaos_edge.trainer.rendezvous import StateTransfer
from chaos_edge.trainer.replica import Replica
from chaos_edge.trainer.session import EXIT_EVENT, Session, install_signal_handlers
from chaos_edge.trainer.shares import SLOTS, SPEED_EMA, Shard, shard_of
from chaos_edge.trainer.source import Source
from chaos_edge.trainer.stepper import BufferMode, GradTransform, Stepper
from chaos_edge.trainer.timing import StepTiming, Timing
from daemon.contracts import protocol
from daemon.contracts.clock import Clock, SystemClock
from daemon.contracts.policy import SyncMode, SyncPolicy

__all__ = ["Shard", "StateDiverged", "StateMismatch", "StepTiming", "Trainer", "TrainerError",
           "UnserialisableState", "capture_exit_event"]
log = logging.getLogger("chaos.trainer")
DIGEST_EVERY = 100  # steps between the guard's comparisons (and whenever a member joins)


def capture_exit_event() -> bool:
    """True after SIGINT/SIGTERM in this process or a leave requested through chaosd."""
    return EXIT_EVENT.is_set()


class Trainer(Timing, Epochs, Leaving):
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
        timeout: Seconds one ``update()`` may spend on reruns before it raises.
        join_timeout: Seconds the constructor may wait to become a member.
        chunk_bytes: All-reduce pipeline chunk size in bytes; None (the default) sizes the
            chunks by the round's vector: about 12 chunks of 1 to 16 MiB. Every member must
            use the same.
        clock: The time source of deadlines and stall accounting (the seam tests use).

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
    ) -> None:
        if digest_every < 0 or (global_batch is not None and global_batch < 1):
            raise ValueError("digest_every must be >= 0 and global_batch >= 1")
        # Validated before attaching: a bad object fails here, not at the first join.
        self._objects = Registry(state, scaler)
        self._stepper = Stepper(model, optimizer, buffers=buffers, scaler=scaler,
                                clip_grad_norm=clip_grad_norm, grad_transform=grad_transform,
                                speeds=global_batch is not None)  # fmt: skip
        self._clock = clock or SystemClock()
        self.model, self.optimizer = model, optimizer
        self.samples_per_step = samples_per_step or 1
        self.global_batch, self.digest_every = global_batch, digest_every
        self.timeout, self.join_timeout = timeout, join_timeout
        self._replica = Replica(model, optimizer, self._objects, self._stepper)
        self.stalls: list[StepTiming] = []  # the last 10,000 updates
        self._agreed: tuple[int, int] | None = None
        self._attempt: dict[int, int] = {}
        self._state = "joining"
        self._was_member = False
        self._version = 0  # policy version of the last committed round
        self._timed_version = 0  # policy version of the step _account saw last
        self._checked = -1  # the last step whose digest the members compared
        self._agreed_members: tuple[str, ...] | None = None  # the members of that epoch
        self._diverged = False  # the guard found us out of line: no samples until rejoined
        self._joins = 0  # completed joins (a rejoin inside update() voids its gradient)
        self._speed = 0.0  # our samples/s (smoothed), for consistent mode's shares
        self._speeds: tuple[int, list[float]] | None = None  # (policy version, members' speeds)
        self._last_end: float | None = None  # when the last update() returned
        self._shard: Shard | None = None
        install_signal_handlers()
        self._s = Session(socket, call_timeout=10.0)
        rendezvous = StateTransfer(self._s.links, host=self._s.bind)
        try:
            self._s.attach()
            self.node_id = self._s.node_id
            # Both scale-out sides see the state only through the replica, and come back to
            # the Trainer only through the documented poll callback.
            self._source = Source(self.node_id, self._s, rendezvous, self._replica, self._clock,
                                  poll=self._poll)
            self._s.serves = self._source.knows
            self._joiner = Joiner(self.node_id, self._s, rendezvous, self._replica, self._clock,
                                  poll=self._poll)
            self.reducer = AllReducer(self._s.links, chunk_bytes=chunk_bytes, timeout=timeout / 4)
            self._s.poller.on_policy = self._on_policy
            self._join(self._clock.monotonic() + join_timeout)
        except BaseException:
            self._s.close()
            rendezvous.close()
            raise

    @property
    def step(self) -> int:
        """The number of committed updates, the same on every member (module docstring)."""
        return self._replica.step

    @property
    def _outer(self) -> Outer | None:
        """diloco mode's outer state (read by the diloco test worker and the slowlinks bench)."""
        return self._replica.outer

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
        pub = self._s.book.for_round(self.step + 1) or self._s.book.newest
        members = pub.members if pub is not None and self.node_id in pub.members else (
            self.node_id,)
        speeds = None
        if pub is not None and self._speeds is not None and self._speeds[0] == pub.version:
            speeds = self._speeds[1]
        self._shard = shard_of(self.step + 1, members, self.node_id,
                               per_member=self.samples_per_step, global_batch=self.global_batch,
                               speeds=speeds)  # fmt: skip
        return self._shard

    # -- public API ------------------------------------------------------------------------
    def update(self, samples: int | None = None) -> None:
        """All-reduce the gradients (and buffers), commit, then step: unscale, transform,
        clip, ``optimizer.step()`` (through the scaler), and zero the gradients.

        Args:
            samples: Samples behind this gradient (default: ``shard.size`` in consistent
                mode, else ``samples_per_step``).

        Raises:
            TrainerError: No round committed within ``timeout`` (the message says why).
            StateDiverged: This node cannot be reconciled; exit non-zero and rejoin.
            DaemonUnreachable: chaosd stopped answering.
        """
        t0 = self._clock.monotonic()
        n = self._samples(samples)
        if self._last_end is not None and n > 0 and t0 > self._last_end:
            # Our compute speed: samples per second between two updates (smoothed).
            seen = n / (t0 - self._last_end)
            self._speed = seen if not self._speed else (
                (1 - SPEED_EMA) * self._speed + SPEED_EMA * seen)
        self._poll()
        deadline = t0 + self.timeout
        reruns, spent, reason = 0, 0.0, ""
        joins = self._joins
        pub = self._policy(deadline)
        # diloco: the local step (none for a gradient of a state we just replaced by a rejoin)
        if self._replica.inner_step(pub, n if self._joins == joins else 0):
            self._account(t0, 0.0, 0, "")
            self._last_end = self._clock.monotonic()
            return
        while True:
            pub = self._policy(deadline)
            self._source.before_round(pub, self._version, deadline)
            if self._check_due() and self._epoch(pub) == self._agreed:
                # The guard's turn: a fresh epoch opens with an agreement that compares digests.
                # Every member is at this step in this epoch, so all bump alike.
                a = self._attempt.get(pub.version, 0)
                self._attempt[pub.version] = max(a + 1, self.reducer.newest_attempt(pub.version))
            epoch = self._epoch(pub)
            # A gradient of a state we no longer hold (rejoined in this call) or one the guard
            # found out of line counts for nothing.
            void = self._diverged or self._joins != joins
            rn = 0 if void else self._replica.round_samples(n)  # diloco: the window's samples
            flat = self._gather(pub, rn)
            self._replica.round_input(flat, rn)  # diloco: the pseudo-gradient
            try:
                # Our digest is local work, so it is timed as stall, not as the collective.
                # Only a member who was not in the last agreement brings a state that no
                # guard has compared yet; a link change or a scale-in opens an epoch of
                # members who agreed before and committed the same rounds since.
                compare = epoch != self._agreed and (
                    self._admits_newcomer(pub) or self._check_due())
                digest = self._own_digest() if compare else b""
                t1 = self._clock.monotonic()
                if epoch != self._agreed:
                    agreed = self._agree(pub, epoch[1], digest)
                    spent += self._clock.monotonic() - t1  # a collective: its waits are the peers'
                    if agreed:
                        self._version = pub.version
                        break  # the agreement committed the result we held for this round
                t1 = self._clock.monotonic()
                # The reused result buffer must never be the one a held result lives in.
                out = self._stepper.result if self._replica.held is None else None
                res = self.reducer.allreduce(flat, rn, step=self._replica.round_step() + 1,
                                             policy=pub, attempt=epoch[1], out=out,
                                             lossy=self._stepper.n_grad)  # fmt: skip
                spent += self._clock.monotonic() - t1
                self._version = pub.version
                self._apply(res.values, pub.version)
                break
            except RoundAborted as exc:
                reruns, reason = reruns + 1, exc.reason
                if exc.result is not None:
                    self._replica.held, self._replica.held_version = exc.result, exc.policy_version
                self._s.report(protocol.RoundAborted(step=self.step + 1, reason=exc.reason[:200]))
                nxt = self._next_epoch(pub, deadline, exc)
                if nxt is not None and self._catch_up(pub, nxt):
                    break  # the peers' next epoch committed the result we held
        # Every member of the epoch that committed has its state: it needs no offer any more.
        self._source.withdraw(pub.members)
        self._account(t0, spent, reruns, reason)
        self._last_end = self._clock.monotonic()

    def _samples(self, samples: int | None) -> int:
        if samples is not None:
            return samples
        if self.global_batch is None:
            return self.samples_per_step
        shard = self._shard if self._shard is not None and self._shard.step == self.step + 1 \
            else self.shard
        return shard.size

    def _gather(self, pub: SyncPolicy, n: int) -> Any:
        """Our input to the round under ``pub``."""
        slot = None
        if self.global_batch is not None:
            ms = sorted(pub.members)
            slot = ms.index(self.node_id) if ms.index(self.node_id) < SLOTS else None
        flat = self._stepper.gather(slot, self._speed, n)
        if not n:
            flat.zero_()  # times zero samples is zero, unless it is inf or NaN
        return flat

    def check_state_replication(self) -> None:
        """Serve a snapshot if a ``replicate`` command names this node as a source."""
        self._poll()

    def close(self) -> None:
        """Close links and the control connection (idempotent)."""
        self.reducer.close()
        self._s.close()
        self._source.close()

    @property
    def policy_version(self) -> int:
        """Version of the sync policy our last committed round ran under."""
        return self._version

    def state_digest(self) -> str:
        """SHA-256 of the whole state: parameters, buffers (as agreed at the last step),
        optimizer state and every registered object. Equal on every member at a step."""
        return self._replica.digest().hex()

    def _own_digest(self) -> bytes:
        """What this member brings to the guard's comparison (b"": nothing)."""
        # A leaver's script has stopped stepping its scheduler and counters: it is no longer
        # compared (the others' rounds ignore its samples anyway).
        return b"" if self._state == "leaving" else self._replica.digest()

    def _poll(self) -> None:
        """Take in what the poller fetched (no I/O). Every call happens at a step boundary,
        so a snapshot that a new replicate command asks for can be taken right here (waiting
        for the next commit could deadlock: that round may need the very node that waits
        for this snapshot)."""
        self._s.poll(self.step, self._state, self._version)
        self._s.settle(self.step + 1)
        for cmd in self._s.take_replications():
            # Ours to fetch (the joiner keeps it for the join under way or the next one), or
            # another node's, which we may be a source of.
            (self._joiner if cmd.new == self.node_id else self._source).offer(cmd)
        self._source.serve_due()

    def _on_policy(self, pub: SyncPolicy) -> None:
        """(The poller's thread.) A new policy that governs the round in flight aborts it
        now, so the round reruns under it at once: after a failure the policy without the
        silent node takes effect at once, and the round must not wait for its timeout. The
        links to the neighbours it dropped close, so a send blocked on one returns."""
        e, h = pub.effective_step, pub.sync.inner_steps
        # The data plane counts rounds: in diloco mode, outer steps (epochs.py).
        neighbours = self.reducer.supersede(pub.version, -(-e // h) if pub.sync.diloco else e)
        if neighbours and self.node_id in pub.members:
            gone = [p for p in neighbours if p not in pub.members]
            if gone:
                self._s.drop(gone, f"dropped by policy v{pub.version}")

    # -- joining ---------------------------------------------------------------------------
    def _join(self, deadline: float) -> None:
        """Block until this node is a member (:class:`~chaos_edge.trainer.joiner.Joiner`);
        then it trains as one: a fresh epoch, and nothing the guard held against it."""
        if self._joiner.join(deadline, self._was_member):
            self._speeds, self._shard = None, None  # measured before the restored step
        self._state, self._agreed, self._agreed_members = "active", None, None
        self._was_member = True
        self._joins += 1
        self._diverged = False

    def _policy(self, deadline: float) -> SyncPolicy:
        """The policy of round ``step + 1``; rejoins if this node was dropped from it."""
        while True:
            pub = self._s.book.for_round(self.step + 1)
            if pub is not None and self.node_id in pub.members:
                return pub
            if pub is not None:
                if self._state == "leaving":
                    raise _Left  # the policy without us governs: the leave is done
                # Dropped (declared failed, or on the losing side of a partition): our state
                # may be stale, so only a fresh replica lets us back in. That holds even when
                # a newer policy adds us back (a link back to a partitioned node): the rounds
                # before it run without us, and we used to wait for them until the step
                # timeout. A newer policy that leaves us out too changes nothing either.
                log.warning("%s is not in policy v%d; asking to rejoin", self.node_id,
                            pub.version)
                self._state = "joining"
                self._s.attach()  # a fresh join request: the scheduler sends a replicate
                self._join(self._clock.monotonic() + self.join_timeout)
                continue
            if self._clock.monotonic() > deadline:
                raise TrainerError(f"no sync policy for step {self.step + 1} arrived in time")
            self._s.wait(POLL_S)
            self._poll()

    def _apply(self, values: Any, version: int) -> None:
        """Apply the committed result of round ``step + 1`` (run under policy ``version``)."""
        mode = self._mode_of(version) if self._replica.outer is not None else None
        self._replica.commit(values, mode)
        if self.global_batch is not None:
            speeds = self._stepper.speeds(values)
            self._speeds = None if speeds is None else (version, speeds.tolist())

    def _mode_of(self, version: int) -> SyncMode:
        """The sync mode of the policy a round ran under (the newest if it is forgotten)."""
        pub = self._s.book.get(version) or self._s.book.newest
        assert pub is not None
        return pub.sync
