"""The Joiner and the Source over fakes at their seams: the session, the rendezvous and the
training state. The machines decide (test_scaleout_machines.py); these check what the owners
do with each decision: serve or decline, bootstrap, give up, keep a command for the next join."""

from __future__ import annotations

from types import SimpleNamespace
from types import SimpleNamespace as Loaded_
from typing import Any

import pytest

import chaos_edge.trainer.joiner as joiner_mod
from chaos_edge.trainer.control import StateMismatch, TrainerError
from chaos_edge.trainer.joiner import Joiner, Pulled
from chaos_edge.trainer.policy import PolicyBook
from chaos_edge.trainer.rendezvous import TransferFailed
from chaos_edge.trainer.scaleout import ASK_AGAIN_S
from chaos_edge.trainer.session import ReplicationLimits
from chaos_edge.trainer.source import Source
from daemon.contracts.clock import FakeClock
from daemon.contracts.policy import SyncPolicy
from daemon.contracts.protocol import (
    Bootstrap,
    Replicate,
    Replicated,
    ServeDeclined,
    StateRefused,
)

pytestmark = pytest.mark.timeout(30)


def policy(version: int, members: tuple[str, ...], effective: int = 0) -> SyncPolicy:
    edges = [(members[0], m) for m in members[1:]]
    return SyncPolicy.build(version, list(members), edges, members[0], effective,
                            {m: f"127.0.0.1:{7000 + i}" for i, m in enumerate(members)})


class FakeSession:
    def __init__(self, clock: FakeClock, limits: ReplicationLimits | None = None) -> None:
        self.book, self.clock = PolicyBook(), clock
        self.limits = limits or ReplicationLimits()
        self.reports: list[Any] = []
        self.poller = SimpleNamespace(in_touch=True, term=0)  # chaosd's word at the last poll
        self.attached: list[int] = []  # the steps of each worker.attach (a join asked again)

    def attach(self, step: int = 0) -> None:
        self.attached.append(step)

    def report(self, rep: Any) -> None:
        self.reports.append(rep)

    def flush_reports(self) -> None:
        pass

    def wait(self, timeout: float) -> None:
        self.clock.advance(timeout)


class FakeRendezvous:
    def __init__(self) -> None:
        self.offered: dict[str, Any] = {}
        self.declined: dict[str, str] = {}
        self.named: list[set[str]] = []  # what each refuse_unnamed call was told

    def refuse_unnamed(self, named: Any) -> None:
        self.named.append(set(named))

    def offer(self, new: str, state: Any, serve_bps: float | None = None) -> None:
        self.offered[new] = (state, serve_bps)

    def decline(self, new: str, why: str) -> None:
        self.declined[new] = why

    def answered(self) -> set[str]:
        return {*self.offered, *self.declined}

    def withdraw(self, nodes: Any) -> None:
        for n in nodes:
            self.offered.pop(n, None)


class FakeState:
    def __init__(self, step: int) -> None:
        self.step, self.alone = step, 0

    def last_round_step(self) -> int:
        return self.step

    def local_bytes(self) -> int:
        return 1 << 20

    def snapshot(self) -> str:
        return f"state of step {self.step}"

    def start_alone(self) -> None:
        self.alone += 1


def serve_cmd(new: str = "c") -> Replicate:
    return Replicate(version_step=10, new=new, policy_version=5,
                     sources={"a": "127.0.0.1:7000", "b": "127.0.0.1:7001"})


def test_a_source_offers_its_snapshot_once_the_new_policy_governs() -> None:
    clock = FakeClock()
    s = FakeSession(clock, ReplicationLimits(serve_bps=1e6))
    rv, state = FakeRendezvous(), FakeState(10)
    src = Source("a", s, rv, state, clock, poll=lambda: None)  # type: ignore[arg-type]
    src.offer(serve_cmd())
    assert src.knows("c")
    src.serve_due()  # no policy with c yet: the command waits
    assert rv.offered == {} and src.knows("c")
    s.book.put(policy(5, ("a", "b", "c"), effective=11))
    src.serve_due()
    assert rv.offered == {"c": ("state of step 10", 1e6)} and not src.knows("c")
    # At each boundary the rendezvous hears whom we may yet serve: c while its command
    # waited, nobody once it was served (the offer answers c's requests from then on).
    assert rv.named == [{"c"}, set()]


def test_a_command_for_a_node_that_already_trains_with_us_is_dropped() -> None:
    """Its policy came after a round we committed with it (others served it): the waiting
    command must not come due later and snapshot the state for nobody."""
    clock = FakeClock()
    s = FakeSession(clock)
    rv, state = FakeRendezvous(), FakeState(10)
    src = Source("a", s, rv, state, clock, poll=lambda: None)  # type: ignore[arg-type]
    src.offer(serve_cmd())
    src.withdraw(["a", "b", "c"])  # we committed a round with c
    assert not src.knows("c")
    s.book.put(policy(5, ("a", "b", "c"), effective=11))
    src.serve_due()
    assert rv.offered == {} and rv.declined == {}


def test_a_source_short_of_memory_declines_and_reports_it() -> None:
    clock = FakeClock()
    s = FakeSession(clock, ReplicationLimits(reserve_bytes=1 << 60))
    rv = FakeRendezvous()
    src = Source("a", s, rv, FakeState(10), clock, poll=lambda: None)  # type: ignore[arg-type]
    s.book.put(policy(5, ("a", "b", "c"), effective=11))
    src.offer(serve_cmd())
    src.serve_due()
    assert not rv.offered and "snapshot_reserve_mib" in rv.declined["c"]
    assert [type(r) for r in s.reports] == [ServeDeclined] and s.reports[0].new == "c"


def test_before_the_first_round_with_a_new_neighbour_a_source_waits_bounded() -> None:
    clock = FakeClock()
    s = FakeSession(clock)
    rv = FakeRendezvous()
    src = Source("a", s, rv, FakeState(10), clock, poll=lambda: None)  # type: ignore[arg-type]
    old, new = policy(4, ("a", "b")), policy(5, ("a", "b", "c"), effective=11)
    s.book.put(old)
    s.book.put(new)
    t0 = clock.monotonic()
    src.before_round(new, last_version=4, deadline=t0 + 100)  # no command ever came
    assert 5.0 <= clock.monotonic() - t0 < 5.5
    src.before_round(new, last_version=5, deadline=t0 + 100)  # the policy we ran: nobody new
    assert clock.monotonic() - t0 < 5.5


def test_only_a_late_command_to_serve_a_node_not_yet_answered_may_end_a_round() -> None:
    """Source.late, on the poller's thread: what the Trainer aborts the round in flight for."""
    clock = FakeClock()
    s = FakeSession(clock)
    rv = FakeRendezvous()
    src = Source("a", s, rv, FakeState(10), clock, poll=lambda: None)  # type: ignore[arg-type]

    assert src.late(serve_cmd(), committed_version=4) == serve_cmd()
    # Committed under its policy already: c took part in that round, it holds the state.
    assert src.late(serve_cmd(), committed_version=5) is None
    # Not ours to serve, ours to pull, or no replicate at all (the poller parsed each once
    # and dropped a malformed one: tests/training/test_poller.py).
    assert src.late(Replicate(version_step=10, new="c", policy_version=5,
                              sources={"b": "127.0.0.1:7001"}), 4) is None
    assert src.late(serve_cmd(new="a"), 4) is None
    assert src.late(Bootstrap(new="c", policy_version=5), 4) is None
    # Served (or declined) already: the round waits on nothing of ours.
    rv.offered["c"] = "state"
    assert src.late(serve_cmd(), 4) is None


def joiner(session: FakeSession, state: FakeState, clock: FakeClock,
           poll: Any = lambda: None) -> Joiner:
    return Joiner("c", session, FakeRendezvous(), state, clock, poll)  # type: ignore[arg-type]


def test_a_bootstrap_starts_alone_once_its_policy_arrives() -> None:
    clock = FakeClock()
    s, state = FakeSession(clock), FakeState(7)
    polls = []

    def poll() -> None:
        polls.append(clock.monotonic())
        if len(polls) == 3:
            s.book.put(policy(1, ("c",)))

    j = joiner(s, state, clock, poll)
    j.offer(Bootstrap(new="c", policy_version=1))  # between joins: kept for the next one
    assert j.join(clock.monotonic() + 10, was_member=True) is False
    assert state.alone == 1 and len(polls) == 3


def test_a_join_with_no_command_gives_up_at_its_deadline() -> None:
    clock = FakeClock()
    j = joiner(FakeSession(clock), FakeState(0), clock)
    with pytest.raises(TrainerError, match="no replicate command arrived"):
        j.join(clock.monotonic() + 1.0, was_member=False)


def test_a_command_that_came_while_awaiting_the_policy_is_kept_for_the_next_join() -> None:
    clock = FakeClock()
    s, state = FakeSession(clock), FakeState(7)
    late = Bootstrap(new="c", policy_version=2)
    holder: list[Joiner] = []
    polls = []

    def poll() -> None:
        polls.append(1)
        if len(polls) == 2:  # the first join started alone, and awaits its policy
            holder[0].offer(late)
            s.book.put(policy(1, ("c",)))

    j = joiner(s, state, clock, poll)
    holder.append(j)
    j.offer(Bootstrap(new="c", policy_version=1))
    j.join(clock.monotonic() + 10, was_member=False)
    assert state.alone == 1
    s.book.put(policy(2, ("c",)))
    j.join(clock.monotonic() + 10, was_member=True)  # the kept command: no new one needed
    assert state.alone == 2


class RefusingState(FakeState):
    """Its fit check passes, but a registered object's ``load_state_dict`` refuses."""

    def fit_error(self, loaded: Any) -> str | None:
        return None

    def restore(self, loaded: Any) -> None:
        raise StateMismatch("state 'sampler' (Sampler) does not load the cluster's state: k")


def test_a_state_an_object_refuses_on_load_is_reported_as_refused(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The fit check cannot see everything; a refusal while loading must also reach the
    scheduler as ``state-refused``, or chaosd restarts a script that is refused again."""
    clock = FakeClock()
    s, state = FakeSession(clock), RefusingState(0)
    pulled = Pulled(manifest=None, buffer=bytearray(), report=None)  # type: ignore[arg-type]
    monkeypatch.setattr(Joiner, "_pull", lambda self, rep, deadline, superseded: pulled)
    monkeypatch.setattr(joiner_mod.StateSpace, "load",
                        staticmethod(lambda manifest, buffer: Loaded_(runtime={"step": 12})))
    j = joiner(s, state, clock)
    j.offer(Replicate(version_step=12, new="c", policy_version=3,
                      sources={"a": "127.0.0.1:7000"}))
    with pytest.raises(StateMismatch, match=r"c cannot join cluster state of step 12: .*sampler"):
        j.join(clock.monotonic() + 10, was_member=False)
    refused = [r for r in s.reports if isinstance(r, StateRefused)]
    assert len(refused) == 1 and "sampler" in refused[0].reason, s.reports


def test_pulls_no_source_serves_ask_the_join_again_until_one_does(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A source cut off from the broker when the command went out refuses the pull (the
    soak's 256-s stall): the Joiner asks to join again every ASK_AGAIN_S of failed pulls,
    saying the state it holds, so that the scheduler resends the command to every source."""
    clock = FakeClock()
    s, state = FakeSession(clock), FakeState(40)
    pulls: list[float] = []
    t0 = clock.monotonic()

    def pull(self: Joiner, rep: Any, deadline: float, superseded: Any) -> Pulled:
        pulls.append(clock.monotonic() - t0)
        if clock.monotonic() - t0 < 2.5 * ASK_AGAIN_S:
            raise TransferFailed("no source offered the state")
        done = Replicated(version=12, bytes=1, delay_ms=1.0, sources=["a"])
        return Pulled(manifest=None, buffer=bytearray(), report=done)  # type: ignore[arg-type]

    monkeypatch.setattr(Joiner, "_pull", pull)
    monkeypatch.setattr(joiner_mod.StateSpace, "load",
                        staticmethod(lambda manifest, buffer: Loaded_(runtime={"step": 12})))
    monkeypatch.setattr(FakeState, "fit_error", lambda self, loaded: None, raising=False)
    monkeypatch.setattr(FakeState, "restore", lambda self, loaded: None, raising=False)
    j = joiner(s, state, clock, lambda: s.book.put(policy(3, ("a", "c"))))
    j.offer(Replicate(version_step=12, new="c", policy_version=3,
                      sources={"a": "127.0.0.1:7000"}))
    assert j.join(clock.monotonic() + 100, was_member=False) is True
    assert s.attached == [40, 40], pulls  # at ASK_AGAIN_S and 2 * ASK_AGAIN_S of failing pulls
