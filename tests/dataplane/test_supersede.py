"""A newer policy that governs the round in flight aborts it at once (AllReducer.supersede).

The silent peer is a socket that authenticated and then never reads or sends, which is what a
SIGSTOPped box looks like: no reset, no data. Without the abort, each round below would wait
for its (long) timeout.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable

import numpy as np
import pytest

from chaos_edge.dataplane import AllReducer, RoundAborted, SyncPolicy
from chaos_edge.dataplane.fences import Fences
from chaos_edge.dataplane.frames import FrameHeader, Kind, encode_frame, phase_flags
from chaos_edge.dataplane.rounds import Phase

pytestmark = pytest.mark.timeout(60)
LONG = 30.0  # a round's timeout that the tests must never reach



def _later(delay: float, fn: Callable[..., object], *args: object) -> threading.Timer:
    t = threading.Timer(delay, fn, args)
    t.start()
    return t


def test_a_round_waiting_for_a_silent_peer_aborts_when_superseded(
        trio: dict[str, AllReducer], mute: socket.socket) -> None:
    solo = trio["solo"]
    policy = SyncPolicy.build(5, ["solo", "mute"], [("mute", "solo")], "solo")
    got: list[tuple[str, ...]] = []
    t = _later(0.3, lambda: got.append(solo.supersede(6, 0)))
    with pytest.raises(RoundAborted, match="superseded by policy v6") as info:
        solo.allreduce(np.ones(1000, np.float32), 1, step=4, policy=policy, timeout=LONG)
    t.join(5)
    assert info.value.step == 4 and info.value.policy_version == 5
    assert got == [("mute",)]  # the neighbours of the phase it aborted
    # The round reruns at once under the newer policy (here without the silent peer).
    alone = SyncPolicy.build(6, ["solo"], [], "solo")
    assert solo.allreduce(np.ones(1000, np.float32), 1, step=4, policy=alone).step == 4


def test_a_round_waiting_on_a_new_node_we_must_serve_first_is_interrupted(
        trio: dict[str, AllReducer], mute: socket.socket) -> None:
    """A replicate command that came after the round began (Trainer._on_command): the round
    waits on the new node, the new node on our offer, which is made between rounds."""
    solo = trio["solo"]
    policy = SyncPolicy.build(5, ["solo", "mute"], [("mute", "solo")], "solo")
    got: list[bool] = []

    def late() -> None:
        got.append(solo.interrupt_for("other", 5, "not a neighbour"))
        got.append(solo.interrupt_for("mute", 6, "a newer policy's new node"))
        got.append(solo.interrupt_for("mute", 5, "serving mute first"))
        got.append(solo.interrupt_for("mute", 5, "once"))

    t = _later(0.3, late)
    with pytest.raises(RoundAborted, match="serving mute first") as info:
        solo.allreduce(np.ones(1000, np.float32), 1, step=4, policy=policy, timeout=LONG)
    t.join(5)
    assert got == [False, False, True, False]
    assert info.value.step == 4 and info.value.policy_version == 5
    assert solo.interrupt_for("mute", 5, "nothing in flight") is False


def test_an_agreement_waiting_for_a_silent_peer_aborts_too(
        trio: dict[str, AllReducer], mute: socket.socket) -> None:
    solo = trio["solo"]
    policy = SyncPolicy.build(5, ["solo", "mute"], [("mute", "solo")], "solo")
    t = _later(0.3, solo.supersede, 6, 8)  # governs round 8, the one this agreement opens
    with pytest.raises(RoundAborted, match="superseded"):
        solo.agree(policy=policy, committed=7, holds=False, timeout=LONG)
    t.join(5)


def test_a_phase_started_after_the_policy_arrived_aborts_before_it_waits(
        trio: dict[str, AllReducer], mute: socket.socket) -> None:
    """The Trainer may start a round under the old policy in the moment before it takes in
    the new one its poller fetched: the fence catches that phase at its start."""
    solo = trio["solo"]
    old = SyncPolicy.build(5, ["solo", "mute"], [("mute", "solo")], "solo")
    assert solo.supersede(6, 3) == ()  # nothing in flight
    with pytest.raises(RoundAborted, match="superseded by policy v6"):
        solo.allreduce(np.ones(10, np.float32), 1, step=3, policy=old, timeout=LONG)


def test_rounds_the_newer_policy_does_not_govern_run_on(trio: dict[str, AllReducer]) -> None:
    solo = trio["solo"]
    v5 = SyncPolicy.build(5, ["solo"], [], "solo")
    solo.supersede(6, 10)  # a planned change, effective at step 10
    solo.supersede(4, 0)  # an older policy changes nothing for v5
    assert solo.allreduce(np.ones(10, np.float32), 1, step=9, policy=v5).step == 9
    with pytest.raises(RoundAborted, match="superseded"):
        solo.allreduce(np.ones(10, np.float32), 1, step=10, policy=v5)
    v6 = SyncPolicy.build(6, ["solo"], [], "solo")
    assert solo.allreduce(np.ones(10, np.float32), 1, step=10, policy=v6).step == 10


def test_a_send_blocked_on_a_silent_peer_returns_once_its_link_closes(
        trio: dict[str, AllReducer], mute: socket.socket) -> None:
    """A leaf whose silent parent stopped reading blocks in a send; supersede marks the
    round aborted and closing the link (what the Trainer does with the neighbours a failure
    policy dropped) ends the send."""
    solo = trio["solo"]
    policy = SyncPolicy.build(5, ["solo", "mute"], [("mute", "solo")], "mute")
    grad = np.ones(16 << 20, np.float32)  # 64 MiB: far more than the socket buffers hold

    def drop() -> None:  # by now the leaf is stuck in a send
        for peer in solo.supersede(6, 0):
            solo.links.disconnect(peer, reason="dropped by policy v6")

    t = _later(2.0, drop)  # the buffers (MiBs) fill well within this
    with pytest.raises(RoundAborted, match="superseded by policy v6"):  # not the timeout
        solo.allreduce(grad, 1, step=1, policy=policy, timeout=LONG)
    t.join(5)


def test_fences_pick_the_newer_policy_that_governs_the_round() -> None:
    cond = threading.Condition()
    f = Fences()
    f.add(7, 20)
    f.add(6, 5)
    assert f.over(Phase((5, 0, 4), None, (), cond)) is None  # before both
    assert f.over(Phase((5, 0, 5), None, (), cond)) == (6, 5)
    assert f.over(Phase((5, 1, 25), None, (), cond)) == (7, 20)
    assert f.over(Phase((6, 0, 25), None, (), cond)) == (7, 20)
    assert f.over(Phase((7, 0, 25), None, (), cond)) is None  # not older
    assert f.over(Phase((5, 0, -1), None, (), cond, round_step=5)) == (6, 5)  # an agreement
    for v in range(8, 40):
        f.add(v, 1000)
    assert f.over(Phase((5, 0, 5), None, (), cond)) is None  # only recent fences are kept


@pytest.mark.parametrize("serves, aborts", [(4, True), (5, False)])
def test_a_newer_epoch_ends_the_round_only_if_it_is_for_that_round(
        trio: dict[str, AllReducer], mute: socket.socket, serves: int, aborts: bool) -> None:
    """A peer's frame of a newer epoch for the same round means the round runs under a
    newer policy there: ours can never complete, so it ends at once. One for the next round
    comes from a peer that committed ours (its agreement for the next round's policy, or the
    guard's attempt bump): our COMMIT is on its way, and ending the round then left a node a
    round behind in an epoch every peer had left (the demo's 75 s stall)."""
    solo = trio["solo"]
    policy = SyncPolicy.build(5, ["solo", "mute"], [("mute", "solo")], "solo")
    ahead = encode_frame(FrameHeader(Kind.AGREE_UP, serves, 6, 0, 0, 4, phase_flags(0, True)),
                         b"\0" * 4)  # fmt: skip
    t = _later(0.3, mute.sendall, ahead)
    t0 = time.monotonic()
    with pytest.raises(RoundAborted) as info:
        solo.allreduce(np.ones(10, np.float32), 1, step=4, policy=policy, timeout=3.0)
    t.join(5)
    if aborts:
        assert "policy version mismatch: mute is at epoch (6, 0)" in info.value.reason
        assert time.monotonic() - t0 < 2.5  # at once, not at the round's timeout
    else:
        assert "timed out" in info.value.reason  # it waited for mute, as for a slow peer
    # The frame was kept for its own phase, not dropped: the next agreement replays it.
    assert solo.newest_epoch() == (6, 0)
