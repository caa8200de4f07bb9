"""The Trainer API (DESIGN.md, from section V-B of "Learning in Chaos").

    trainer = Trainer(model, optimizer)      # attach to chaosd, join (scale-out)
    while trainer.step < total_steps:
        loss = ...; loss.backward()
        trainer.update()                     # all-reduce, commit, optimizer.step()
        trainer.check_state_replication()    # serve a snapshot if a plan names this node
        if capture_exit_event():
            trainer.request_node_exit()
            break

``trainer.step`` is the number of committed updates, the same on every member; round ``s``
(the one ``update()`` runs when ``step == s - 1``) produces state ``s``. In the protocol's
words, ``step`` is the *last committed step*. The data plane's commit protocol
(``daemon.dataplane.allreduce``) keeps every member bit-identical; this module drives it:
pick the policy, open each epoch with an agreement, rerun aborted rounds in a newer epoch,
bounded by ``timeout``, and account the stall.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from typing import Any, NamedTuple

import torch

from daemon.contracts.clock import Clock, SystemClock
from daemon.contracts.errors import ChaosError, ControlFailure
from daemon.contracts.policy import SyncPolicy
from daemon.dataplane import AllReducer, RoundAborted
from daemon.dataplane.tensors import flatten_grads, unflatten_into
from daemon.replication.manifest import Manifest
from daemon.replication.state import StateSpace, state_digest, tensor_bytes
from daemon.trainer.control import StateDiverged, TrainerError
from daemon.trainer.join import pull_state
from daemon.trainer.poller import POLL_S
from daemon.trainer.session import EXIT_EVENT, Session, install_signal_handlers
from daemon.trainer.transfer import snapshot_room

__all__ = ["StateDiverged", "StepTiming", "Trainer", "TrainerError", "capture_exit_event"]
log = logging.getLogger("chaos.trainer")
FETCH_RETRY_S = 0.5  # pause before fetching a replicated state again
LEAVE_LINGER_S = 0.5  # after the drain, before closing the links
DRAIN_MAX_S = 30.0  # a leaver waits at most this long for the policy that drops it
RERUN_WAIT_S = 1.0  # after an abort, wait this long for a newer policy before retrying as is
SERVE_WAIT_S = 5.0  # a source waits this long for the replicate command of a new neighbour


class StepTiming(NamedTuple):
    """Where one ``update()`` spent its time.

    Attributes:
        step: The step it committed.
        stall_ms: Time beyond the collectives (polling chaosd, waiting for a policy, reruns'
            overhead, ``optimizer.step()``, a snapshot for a new node).
        reruns: Rounds aborted and rerun before it committed.
        total_ms: The whole call.
        sync_ms: Time in the collectives (agreement and all-reduce), waits for peers included.
    """

    step: int
    stall_ms: float
    reruns: int
    total_ms: float
    sync_ms: float


class _Left(Exception):
    """While leaving, the policy without this node took over (ends the drain)."""


class _WithHeld(torch.nn.Module):
    """The model plus a held (uncertain) round result, captured and restored as one state.

    A source that is uncertain about round ``step + 1`` when it must serve its snapshot gives
    the new node that result too, so both enter the next agreement in the same position.
    """

    NAME = "model/held"  # the buffer's manifest entry
    held: torch.Tensor

    def __init__(self, model: torch.nn.Module, held: torch.Tensor) -> None:
        super().__init__()
        self.model = model
        self.register_buffer("held", held.detach().clone())

    @classmethod
    def for_manifest(cls, model: torch.nn.Module, manifest: Manifest) -> _WithHeld | None:
        """A wrapper to restore into if the snapshot carries a held result, else None."""
        for e in manifest.entries:
            if e.name == cls.NAME:
                return cls(model, torch.zeros(e.shape, dtype=getattr(torch, e.dtype)))
        return None


def capture_exit_event() -> bool:
    """True after SIGINT/SIGTERM in this process or a leave requested through chaosd."""
    return EXIT_EVENT.is_set()


class Trainer:
    """Synchronous data-parallel training on the Chaos overlay.

    Args:
        model: The model; every node builds it the same way.
        optimizer: Its optimizer.
        samples_per_step: Samples behind one local gradient (weights the global average);
            ``update(samples=...)`` overrides it per step. Default 1: nodes weigh equally.
        socket: chaosd's control socket (default ``$CHAOS_SOCKET``).
        timeout: Seconds one ``update()`` may spend on reruns before it raises.
        join_timeout: Seconds the constructor may wait to become a member.
        chunk_bytes: All-reduce pipeline chunk size.
        clock: The time source of deadlines and stall accounting (the seam tests use).

    Raises:
        DaemonUnreachable: chaosd's control socket cannot be reached (a ``ControlFailure``).
        TrainerError: Joining did not finish in time.

    Both derive from ``ChaosError``, the one class a script needs to catch.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        *,
        samples_per_step: int | None = None,
        socket: str | os.PathLike[str] | None = None,
        timeout: float = 120.0,
        join_timeout: float = 300.0,
        chunk_bytes: int = 1 << 20,
        clock: Clock | None = None,
    ) -> None:
        self._clock = clock or SystemClock()
        self.model, self.optimizer = model, optimizer
        self.samples_per_step = samples_per_step or 1
        self.timeout, self.join_timeout = timeout, join_timeout
        self.step = 0
        self.runtime: dict[str, Any] = {}  # user state replicated with the model (JSON types)
        self.stalls: list[StepTiming] = []  # the last 10,000 updates
        self._params = [p for p in model.parameters()]
        # Reused every step: the flat gradient and the all-reduce result (a fresh buffer the
        # size of the model per step cost a quarter of the CPU of a 100 MB round).
        size = sum(p.numel() for p in self._params)
        self._flat = torch.empty(size, dtype=torch.float32)
        self._result = torch.empty(size, dtype=torch.float32)
        self._pending: Any = None  # uncertain result of round step + 1
        self._agreed: tuple[int, int] | None = None
        self._attempt: dict[int, int] = {}
        self._state = "joining"
        self._was_member = False
        self._version = 0  # policy version of the last committed round
        self._timed_version = 0  # policy version of the step _account saw last
        install_signal_handlers()
        self._s = Session(socket, call_timeout=10.0)
        try:
            self._s.attach()
            self.node_id = self._s.node_id
            self.reducer = AllReducer(self._s.links, chunk_bytes=chunk_bytes, timeout=timeout / 4)
            self._s.poller.on_policy = self._on_policy
            self._join(self._clock.monotonic() + join_timeout)
        except BaseException:
            self._s.close()
            raise

    # -- public API ------------------------------------------------------------------------
    def update(self, samples: int | None = None) -> None:
        """All-reduce the gradients, commit, ``optimizer.step()``, then zero the gradients.

        Raises:
            TrainerError: No round committed within ``timeout`` (the message says why).
            StateDiverged: This node cannot be reconciled; exit non-zero and rejoin.
            DaemonUnreachable: chaosd stopped answering.
        """
        t0 = self._clock.monotonic()
        n = self.samples_per_step if samples is None else samples
        flat = flatten_grads(self._params, out=self._flat)
        self._poll()
        deadline = t0 + self.timeout
        reruns, spent, reason = 0, 0.0, ""
        while True:
            pub = self._policy(deadline)
            self._serve_first(pub, deadline)
            epoch = (pub.version, self._attempt.get(pub.version, 0))
            try:
                t1 = self._clock.monotonic()
                if epoch != self._agreed:
                    agreed = self._agree(pub, epoch[1])
                    spent += self._clock.monotonic() - t1  # a collective: its waits are the peers'
                    if agreed:
                        self._version = pub.version
                        break  # the agreement committed the result we held for this round
                t1 = self._clock.monotonic()
                # The reused result buffer must never be the one a held result lives in.
                out = self._result if self._pending is None else None
                res = self.reducer.allreduce(flat, n, step=self.step + 1, policy=pub,
                                             attempt=epoch[1], out=out)  # fmt: skip
                spent += self._clock.monotonic() - t1
                self._version = pub.version
                self._apply(res.values)
                break
            except RoundAborted as exc:
                reruns, reason = reruns + 1, exc.reason
                if exc.result is not None:
                    self._pending = exc.result
                self._s.report("round-aborted", step=self.step + 1, reason=exc.reason[:200])
                self._next_epoch(pub, deadline, exc)
        # Every member of the epoch that committed has its state: it needs no offer any more.
        self._s.transfer.withdraw(pub.members)
        self._account(t0, spent, reruns, reason)

    def check_state_replication(self) -> None:
        """Serve a snapshot if a ``replicate`` command names this node as a source."""
        self._poll()

    def request_node_exit(self) -> None:
        """Leave gracefully (scale-in), then close the links.

        The scheduler publishes the policy without us for a step boundary a step or two
        ahead, as for every planned change. Until it governs our next round we take part in
        the rounds with no samples (a zero gradient that the global sample count ignores),
        so that no neighbour ever waits for us: the leave costs the others no stall. Then we
        linger briefly, so that neighbours drop their links to us first, and close.
        """
        try:
            self._s.flush_reports()
            self._s.client.call("worker.leave", {"step": self.step})
            self._state = "leaving"
            if not self._drain(self._clock.monotonic() + min(self.timeout, DRAIN_MAX_S)):
                return  # still attached: our exit is a worker-exit, which drops us at once
            deadline = self._clock.monotonic() + LEAVE_LINGER_S
            while self._s.links.connected() and self._clock.monotonic() < deadline:
                time.sleep(POLL_S)
            self._s.poller.stop()  # a poll after the detach would be refused
            with contextlib.suppress(ControlFailure):  # a daemon that is gone detached us
                self._s.client.call("worker.detach", {"pid": os.getpid()})
        finally:
            self.close()

    def _drain(self, deadline: float) -> bool:
        """Run no-sample rounds until a policy without us governs our next round; False if
        that did not happen in time."""
        while self._clock.monotonic() < deadline:
            self._poll()
            pub, newest = self._s.book.for_round(self.step + 1), self._s.book.newest
            if pub is None or self.node_id not in pub.members:
                return True
            if newest is not None and newest.members == (self.node_id,):
                return True  # the last member: nobody waits for us
            self.optimizer.zero_grad(set_to_none=True)
            try:
                self.update(samples=0)
            except _Left:
                return True
        log.warning("%s left without the policy that drops it (the scheduler did not "
                    "answer in time); the others will see a failure", self.node_id)
        return False

    def close(self) -> None:
        """Close links and the control connection (idempotent)."""
        self.reducer.close()
        self._s.close()

    @property
    def policy_version(self) -> int:
        """Version of the sync policy our last committed round ran under."""
        return self._version

    def state_digest(self) -> str:
        """SHA-256 of parameters and optimizer state (equal on every member at a step)."""
        return state_digest(self.model, self.optimizer)

    def _poll(self) -> None:
        """Take in what the poller fetched (no I/O). Every call happens at a step boundary,
        so a snapshot that a new replicate command asks for can be taken right here (waiting
        for the next commit could deadlock: that round may need the very node that waits
        for this snapshot)."""
        self._s.poll(self.step, self._state)
        self._s.settle(self._s.book.for_round(self.step + 1))
        self._serve_due()

    def _on_policy(self, pub: SyncPolicy) -> None:
        """(The poller's thread.) A new policy that governs the round in flight aborts it
        now, so the round reruns under it at once: after a failure the policy without the
        silent node takes effect at once, and the round must not wait for its timeout. The
        links to the neighbours it dropped close, so a send blocked on one returns."""
        neighbours = self.reducer.supersede(pub.version, pub.effective_step)
        if neighbours and self.node_id in pub.members:
            gone = [p for p in neighbours if p not in pub.members]
            if gone:
                self._s.drop(gone, f"dropped by policy v{pub.version}")

    # -- joining ---------------------------------------------------------------------------
    def _join(self, deadline: float) -> None:
        """Block until this node is a member: bootstrap alone, or restore a replicated state."""
        rep = None  # the newest replicate command for us; kept until a fetch succeeds
        while True:
            self._poll()
            mine = [r for r in self._s.replications if r.new == self.node_id]
            if mine:
                self._s.replications = [r for r in self._s.replications if r not in mine]
                rep = mine[-1]
            if rep is not None:
                # A failed fetch is retried (the source keeps its offer): a dial race that
                # replaced the link used to lose the only command, and the join hung.
                if self._fetch(rep, deadline):
                    self._await_policy(rep, deadline)
                    break
                time.sleep(FETCH_RETRY_S)
            newest = self._s.book.newest
            if (newest is not None and newest.members == (self.node_id,)
                    and not self._was_member):  # fmt: skip
                log.info("%s bootstraps the cluster from its own model", self.node_id)
                self._pending = None
                break
            if self._clock.monotonic() > deadline:
                raise TrainerError(
                    f"{self.node_id} did not become a member within {self.join_timeout:g}s: "
                    "no replicate command arrived; check `chaosctl nodes` and the scheduler"
                )
            self._s.wait(POLL_S)
        self._state, self._agreed = "active", None  # _pending: what the snapshot held
        self._was_member = True  # from now on only a fresh replica may let us back in

    def _await_policy(self, rep: Any, deadline: float) -> None:
        """Wait until we know the policy that makes us a member: the command that brought the
        state may have outrun it (another MQTT topic), and without it the first round would
        find us in no policy and ask to join once more."""
        while True:
            newest = self._s.book.newest
            if newest is not None and (newest.version >= rep.policy_version if
                                       rep.policy_version >= 0 else
                                       self.node_id in newest.members):  # fmt: skip
                return
            if self._clock.monotonic() > deadline:
                raise TrainerError(f"{self.node_id} restored step {self.step}, but the policy "
                                   f"v{rep.policy_version} that adds it never arrived")
            self._s.wait(POLL_S)
            self._poll()

    def _fetch(self, rep: Any, deadline: float) -> bool:
        """Pull and restore the state ``rep`` names; False (logged) if this try failed."""
        local = tensor_bytes(self.model, self.optimizer)
        try:
            got = pull_state(self._s, rep, deadline, local)
            held = _WithHeld.for_manifest(self.model, got.manifest)
            runtime = StateSpace.restore(self.model if held is None else held, self.optimizer,
                                         got.manifest, got.buffer)  # fmt: skip
        except ChaosError as exc:  # TransferFailed among them
            log.warning("replicating the state from %s failed: %s", sorted(rep.sources), exc)
            return False
        self.step = int(runtime.pop("step"))
        self._pending = held.held.clone() if held is not None else None
        self.runtime = dict(runtime.get("user", {}))
        log.info("restored step %d (%d bytes) from %s in %.0f ms", self.step,
                 got.report["bytes"], ", ".join(got.report["sources"]),
                 got.report["delay_ms"])  # fmt: skip
        self._s.report("replicated", **got.report)
        return True

    # -- rounds ----------------------------------------------------------------------------
    def _policy(self, deadline: float) -> SyncPolicy:
        """The policy of round ``step + 1``; rejoins if this node was dropped from it."""
        while True:
            pub = self._s.book.for_round(self.step + 1)
            if pub is not None and self.node_id in pub.members:
                return pub
            newest = self._s.book.newest
            if pub is not None and newest is not None and self.node_id not in newest.members:
                if self._state == "leaving":
                    raise _Left  # the policy without us governs: the leave is done
                # Dropped (declared failed, or on the losing side of a partition): our state
                # may be stale, so only a fresh replica lets us back in. (A newer policy that
                # leaves us out too, say one for a later scale-out, changes nothing: our step
                # cannot reach it without us in the rounds before.)
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

    def _serve_first(self, pub: SyncPolicy, deadline: float) -> None:
        """Before the first round with a new tree neighbour, wait (bounded) for the replicate
        command that names us its source, and serve it. The command and the policy travel
        on different topics: a round started first waits for the new node, which waits for
        our offer, and both stall until the round times out."""
        if pub.version == self._version:
            return  # the policy of our last round: nobody new (the common, per-step case)
        prev = self._s.book.for_round(self.step)
        if prev is None or prev is pub or self.node_id not in prev.members:
            return  # no change, or we are new ourselves (a new node is nobody's source)
        p = pub
        near = (p.parent(self.node_id), *p.children(self.node_id))
        new = [m for m in near if m and m not in prev.members]
        until = min(deadline, self._clock.monotonic() + SERVE_WAIT_S)
        while new and not set(new) <= self._s.transfer.answered():
            if self._clock.monotonic() > until:
                log.warning("no replicate command for %s arrived in %gs; running round %d "
                            "without serving it", new, SERVE_WAIT_S, self.step + 1)
                return
            self._s.wait(POLL_S)
            self._poll()

    def _agree(self, pub: SyncPolicy, attempt: int) -> bool:
        """Open the epoch; True if it committed the held result of round ``step + 1``.

        The decision is the newest committed step among the members. A member at it goes on;
        one a step behind applies the result it holds. A member that cannot reach it (further
        behind, or one behind without the result) is stale: only it raises StateDiverged and
        is re-replicated; the others keep their state (they are at the agreed step), and
        their next round reruns once the scheduler has dropped the stale member.
        """
        dec = self.reducer.agree(policy=pub, committed=self.step,
                                 holds=self._pending is not None, attempt=attempt)  # fmt: skip
        self._agreed = (pub.version, attempt)
        if dec.step == self.step + 1 and self._pending is not None:
            self._apply(self._pending)
            return True
        if dec.step == self.step:
            self._pending = None  # nobody alive applied it: everyone reruns the step
            return False
        if dec.step > self.step:
            lacks = " and lacks the result of the next one" if dec.step == self.step + 1 else ""
            raise StateDiverged(f"{self.node_id} is at step {self.step}{lacks} but the cluster "
                                f"agreed on step {dec.step}; restart the worker to rejoin")
        raise StateDiverged(f"{self.node_id} is at step {self.step}, ahead of the step the "
                            f"cluster agreed on ({dec.step}); restart the worker to rejoin")

    def _next_epoch(self, pub: SyncPolicy, deadline: float, exc: RoundAborted) -> None:
        """After an abort: wait (bounded) for a newer policy, else rerun with a newer attempt."""
        self._s.redial()
        wait_until = min(deadline, self._clock.monotonic() + RERUN_WAIT_S)
        while self._s.book.for_round(self.step + 1) is pub:
            # First: past the deadline, every rerun would abort at once (a spin), not wait.
            if self._clock.monotonic() > deadline:
                raise TrainerError(f"step {self.step + 1} could not complete within "
                                   f"{self.timeout:g}s; last abort: {exc.reason}")  # fmt: skip
            # A newer version on the wire means its policy is on its way to us too.
            now = self._clock.monotonic()
            if self.reducer.newest_epoch()[0] <= pub.version and now >= wait_until:
                # Join the newest attempt a neighbour started, else open the next one; taking
                # the larger of the two never leapfrogs, so the members converge.
                own = self._attempt.get(pub.version, 0)
                self._attempt[pub.version] = max(own + 1, self.reducer.newest_attempt(pub.version))
                return
            self._s.wait(POLL_S)
            self._poll()

    def _apply(self, values: Any) -> None:
        unflatten_into(values, self._params)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.step += 1
        self._pending = None
        self._serve_due()

    def _serve_due(self) -> None:
        """Snapshot at the boundary where the new node becomes a member, and offer it.

        The snapshot's step must be the last step the cluster commits without the new node:
        the new node's first round is the one after it. Two things decide that boundary, and
        both must hold here: (1) we committed ``version_step`` (or more, if the command came
        late), and (2) the policy that adds the new node governs our next round. Without (2),
        a command that outran its policy (they travel on different MQTT topics) made us serve
        step ``t`` and then commit ``t + 1, t + 2, ...`` with the old members, and the new
        node's first agreement found it steps behind everyone (``StateDiverged`` on every node).
        Once (2) holds, no round without the new node can commit any more: we are a member of
        every such round and run the next one under the new policy.
        """
        keep = []
        nxt = self._s.book.for_round(self.step + 1)
        for rep in self._s.replications:
            if rep.new == self.node_id:
                keep.append(rep)  # ours to fetch (a rejoin); handled by _join
                continue
            if self.node_id not in rep.sources:
                continue
            if (rep.version_step > self.step or nxt is None or nxt.version < rep.policy_version
                    or rep.new not in nxt.members):  # fmt: skip
                keep.append(rep)
                continue
            if rep.version_step < self.step:
                # The command or its policy came late: every member ran the rounds since
                # under the old policy (rounds are synchronous), so the new one takes effect
                # for all of them at our next round, and the new node starts from our step.
                log.info("replicate for %s names step %d; serving step %d", rep.new,
                         rep.version_step, self.step)
            why = snapshot_room(tensor_bytes(self.model, self.optimizer),
                                self._s.transfer.reserve_bytes)  # fmt: skip
            if why is not None:
                self._s.transfer.decline(rep.new, why)  # the new node plans without us
                self._s.report("serve-declined", new=rep.new, reason=why)
                continue
            runtime: dict[str, Any] = {"step": self.step, "user": self.runtime}
            model: torch.nn.Module = self.model
            if self._pending is not None:
                # We are uncertain about round step + 1 (held, not committed): so is the new
                # node, with the same held result, and the first agreement settles it for
                # both exactly as for us.
                model = _WithHeld(self.model, self._pending)
                runtime["held"] = True
            self._s.transfer.offer(rep.new, StateSpace.capture(model, self.optimizer, runtime))
        self._s.replications = keep

    def _account(self, t0: float, spent: float, reruns: int, reason: str) -> None:
        total_ms = (self._clock.monotonic() - t0) * 1e3
        stall_ms = max(0.0, total_ms - spent * 1e3)
        self.stalls.append(StepTiming(self.step, stall_ms, reruns, total_ms, spent * 1e3))
        del self.stalls[:-10_000]
        # The scheduler adds a stall to the event that made its policy, so only the first
        # step under a new policy (or a rerun) says something. Reporting every slow step
        # charged every event with the worst step of its whole policy, and cost each step a
        # control call and an MQTT message.
        first = self._version != self._timed_version
        self._timed_version = self._version
        if reruns or (first and stall_ms > 1.0):
            self._s.report("stall", step=self.step, ms=round(stall_ms, 3), reruns=reruns,
                           policy_version=self._version, reason=reason[:200])  # fmt: skip
