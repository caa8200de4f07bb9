"""The scale-out rendezvous over real PeerLinks: offers, refusals and the memory guard."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
import torch

from chaos_edge.dataplane import LinkConfig, PeerLinks
from chaos_edge.replication.state import StateSpace, tensor_bytes
from chaos_edge.trainer.rendezvous import Refusal, StateTransfer, snapshot_room

pytestmark = pytest.mark.timeout(60)
MIB = 1 << 20


@pytest.fixture
def pair() -> Iterator[tuple[StateTransfer, StateTransfer]]:
    """A source and a new node, linked (the source dials: its id is the lower)."""
    links = {n: PeerLinks(n, "t", b"k", is_member=lambda p: True,
                          config=LinkConfig(io_poll=0.2)) for n in ("a-src", "b-new")}  # fmt: skip
    for lk in links.values():
        lk.start()
    links["b-new"].allow("a-src")
    links["a-src"].connect_to("b-new", *links["b-new"].address)
    assert links["b-new"].wait_connected(["a-src"], 5)
    src, new = StateTransfer(links["a-src"], "127.0.0.1"), StateTransfer(links["b-new"])
    yield src, new
    for t in (src, new):
        t.close()
    for lk in links.values():
        lk.close()


def _state(step: int) -> tuple[torch.nn.Module, torch.optim.Optimizer, StateSpace]:
    model = torch.nn.Linear(64, 32)
    opt = torch.optim.Adam(model.parameters())
    model(torch.randn(4, 64)).sum().backward()
    opt.step()
    return model, opt, StateSpace.capture(model, opt, {"step": step})


def test_the_guard_keeps_the_reserve_free() -> None:
    assert snapshot_room(100 * MIB, 256 * MIB, available=400 * MIB) is None
    why = snapshot_room(100 * MIB, 256 * MIB, available=300 * MIB)
    assert why is not None and "100 MiB snapshot: 300 MiB available" in why
    assert "snapshot_reserve_mib" in why


def test_tensor_bytes_counts_what_a_snapshot_copies() -> None:
    model, opt, state = _state(3)
    # Parameters plus Adam's two moments (and its step counters): all but the metadata.
    params = sum(p.numel() * 4 for p in model.parameters())
    assert 3 * params <= tensor_bytes(model, opt) <= state.manifest.total_bytes


def test_an_offer_comes_once_the_source_has_the_step(
        pair: tuple[StateTransfer, StateTransfer]) -> None:
    src, new = pair
    new.ask(["a-src"], 7, time.monotonic() + 10)  # before the source reached step 7
    time.sleep(0.3)
    _, _, state = _state(7)
    src.offer("b-new", state)
    offers, errors = new.offers(time.monotonic() + 10, grace_s=1.0)
    assert not errors and offers["a-src"].manifest.version == 7
    assert offers["a-src"].manifest.total_bytes == state.manifest.total_bytes
    assert src.answered() == {"b-new"}
    src.withdraw(["b-new"])
    assert src.answered() == set()


def test_a_source_short_of_memory_declines_with_the_reason(
        pair: tuple[StateTransfer, StateTransfer]) -> None:
    src, new = pair
    why = snapshot_room(64 * MIB, 256 * MIB, available=200 * MIB)
    assert why is not None
    src.decline("b-new", why)
    new.ask(["a-src"], 7, time.monotonic() + 10)
    offers, errors = new.offers(time.monotonic() + 10, grace_s=1.0)
    assert offers == {} and errors == {"a-src": why}
    # Told apart from a lost link, so the new node can report who declined.
    assert isinstance(errors["a-src"], Refusal)


def test_a_newer_command_ends_the_wait_for_a_step_that_may_never_come(
        pair: tuple[StateTransfer, StateTransfer]) -> None:
    """A deposed scheduler's command named a step the source has not reached (its round may
    wait for the very node that asks): a newer command for the same node ends the wait at
    once, not after the source's minute, and the newer ask is answered from the snapshot."""
    src, new = pair
    _, _, state = _state(319)
    src.offer("b-new", state)
    new.ask(["a-src"], 333, time.monotonic() + 90)
    calls = []

    def newer_command_came() -> bool:
        calls.append(time.monotonic())
        return len(calls) >= 3

    offers, errors = new.offers(time.monotonic() + 90, grace_s=1.0, stop=newer_command_came)
    assert len(calls) == 3  # asked until it said stop, then no more
    assert not offers and errors == {"a-src": "superseded by a newer replicate command"}
    new.ask(["a-src"], 319, time.monotonic() + 10)
    offers, errors = new.offers(time.monotonic() + 10, grace_s=1.0)
    assert not errors and offers["a-src"].manifest.version == 319


def test_a_source_no_command_names_refuses_at_its_next_boundary(
        pair: tuple[StateTransfer, StateTransfer]) -> None:
    """A source whose chaosd never got the replicate command (a broker restart lost it) held
    the new node's request open for its full minute, and the new node could not ask to join
    again meanwhile (soak fault 20). At its next step boundary with still no command naming
    it, it refuses; a request from a node it does expect waits on."""
    src, new = pair
    new.ask(["a-src"], 7, time.monotonic() + 10)
    deadline = time.monotonic() + 5
    while not src._waiting and time.monotonic() < deadline:  # the request is in
        time.sleep(0.01)
    src.refuse_unnamed({"b-new"})  # a command names us its source: the request waits
    time.sleep(0.3)
    assert new.offers(time.monotonic() + 0.2, grace_s=1.0) == (
        {}, {"a-src": "no answer in time"})
    new.ask(["a-src"], 7, time.monotonic() + 10)  # asked again (the real joiner re-asks)
    src.refuse_unnamed(set())  # the boundary's commands named nobody
    offers, errors = new.offers(time.monotonic() + 10, grace_s=1.0)
    assert offers == {} and isinstance(errors["a-src"], Refusal)
    assert errors["a-src"] == "no replicate command names a-src a source of b-new"
    # Once the command came and the source served, a new ask gets the offer.
    _, _, state = _state(7)
    src.offer("b-new", state)
    src.refuse_unnamed(set())  # served: no longer a stranger
    new.ask(["a-src"], 7, time.monotonic() + 10)
    offers, errors = new.offers(time.monotonic() + 10, grace_s=1.0)
    assert not errors and offers["a-src"].manifest.version == 7
