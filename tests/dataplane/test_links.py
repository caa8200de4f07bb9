"""PeerLinks: authentication, neighbour-only links, and robustness to bad frames."""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Callable, Iterator

import numpy as np
import pytest

from chaos_edge.dataplane import AllReducer, AuthError, LinkConfig, PeerLinks, SyncPolicy
from chaos_edge.dataplane.auth import Identity, initiate
from chaos_edge.dataplane.frames import FORMAT_VERSION, HEADER, MAGIC, MAX_PAYLOAD

pytestmark = pytest.mark.timeout(60)
SECRET = b"s3cret"
FAST = LinkConfig(handshake_timeout=1.0, io_poll=0.2)


@pytest.fixture
def make_links() -> Iterator[Callable[..., PeerLinks]]:
    made: list[PeerLinks] = []

    def make(node: str, secret: bytes = SECRET, members: frozenset[str] | None = None) -> PeerLinks:
        ok = members if members is not None else frozenset({"a", "b", "c", "evil"})
        links = PeerLinks(node, "test", secret, is_member=ok.__contains__, config=FAST)
        links.start()
        made.append(links)
        return links

    yield make
    for links in made:
        links.close()


def _wait(pred: Callable[[], bool], timeout: float = 10.0) -> bool:
    end = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > end:
            return False
        time.sleep(0.02)
    return True


def _two_node_round(x: PeerLinks, y: PeerLinks, version: int) -> None:
    """An all-reduce between x and y succeeds with identical results."""
    pol = SyncPolicy.build(
        version, [x.me.node_id, y.me.node_id], [(x.me.node_id, y.me.node_id)], x.me.node_id
    )
    out: dict[str, np.ndarray] = {}

    def run(links: PeerLinks, value: float) -> None:
        red = AllReducer(links, chunk_bytes=4096, timeout=10.0)
        out[links.me.node_id] = red.allreduce(
            np.full(5000, value, np.float32), 1, step=0, policy=pol
        ).values

    ts = [threading.Thread(target=run, args=(n, v)) for n, v in ((x, 1.0), (y, 3.0))]
    for t in ts:
        t.start()
    for t in ts:
        t.join(20)
    assert (
        all(np.array_equal(v, np.full(5000, 2.0, np.float32)) for v in out.values())
        and len(out) == 2
    )


def test_neighbours_connect_and_reconnecting_is_a_no_op(
    make_links: Callable[..., PeerLinks],
) -> None:
    a, b = make_links("a"), make_links("b")
    b.allow("a")
    a.connect_to("b", *b.address)
    a.connect_to("b", *b.address)
    assert a.wait_connected(["b"], 5) and b.wait_connected(["a"], 5)
    assert a.connected() == {"b"} and b.connected() == {"a"}
    _two_node_round(a, b, 1)


def test_wrong_secret_is_refused(
    make_links: Callable[..., PeerLinks], caplog: pytest.LogCaptureFixture
) -> None:
    a, b = make_links("a", secret=b"wrong"), make_links("b")
    b.allow("a")
    with caplog.at_level(logging.WARNING), pytest.raises(AuthError):
        a.connect_to("b", *b.address)
    assert _wait(
        lambda: any("does not know the cluster secret" in r.message for r in caplog.records)
    )
    assert not a.connected() and not b.connected()


@pytest.mark.parametrize("allowed", [True, False], ids=["non-member", "not-a-neighbour"])
def test_non_member_or_non_neighbour_is_refused(
    make_links: Callable[..., PeerLinks], allowed: bool
) -> None:
    b = make_links("b", members=frozenset({"b", "c"}) if allowed else None)
    a = make_links("a")
    if allowed:
        b.allow("a")
    with pytest.raises(AuthError, match="refused"):
        a.connect_to("b", *b.address)
    assert not b.connected() and b.state("a") == "unknown"


@pytest.mark.parametrize(
    "junk", [b"GET / HTTP/1.1\r\n\r\n" * 4, b"",
             HEADER.pack(MAGIC, FORMAT_VERSION, 1, 0, 0, 0, 0, 0, 1 << 30)]
)
def test_garbage_or_silence_before_auth_closes_only_that_socket(
    make_links: Callable[..., PeerLinks], junk: bytes
) -> None:
    a, b = make_links("a"), make_links("b")
    raw = socket.create_connection(b.address)
    raw.sendall(junk)
    raw.settimeout(5)
    try:
        while raw.recv(4096):  # the server may send its hello first; then it closes
            pass
    except ConnectionResetError:
        pass
    raw.close()
    b.allow("a")
    a.connect_to("b", *b.address)  # the server still serves others
    _two_node_round(a, b, 1)


@pytest.mark.parametrize(
    "frame",
    [
        HEADER.pack(b"JUNK", 1, 18, 0, 0, 0, 0, 0, 0),
        HEADER.pack(MAGIC, FORMAT_VERSION, 18, 0, 0, 0, 0, 0, MAX_PAYLOAD + 1),
        HEADER.pack(MAGIC, FORMAT_VERSION, 1, 0, 0, 0, 0, 0, 0),  # HELLO after the handshake
    ],
    ids=["bad-magic", "oversized", "handshake-kind"],
)
def test_malformed_frame_after_auth_closes_only_that_link(
    make_links: Callable[..., PeerLinks], frame: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    a, b = make_links("a"), make_links("b")
    b.allow("a", "evil")
    a.connect_to("b", *b.address)
    down: list[str] = []
    b.add_down_listener(lambda peer, reason: down.append(peer))
    raw = socket.create_connection(b.address)
    initiate(raw, Identity("evil", "test", SECRET, "x" * 16), "b")
    assert b.wait_connected(["evil"], 5)
    with caplog.at_level(logging.WARNING):
        raw.sendall(frame)
        assert _wait(lambda: b.state("evil") == "down")
        # Listeners run on the reader thread just after the state flips: wait, don't race.
        assert _wait(lambda: down == ["evil"])
    assert any("malformed frame" in r.message for r in caplog.records)
    raw.close()
    assert b.state("a") == "up"
    _two_node_round(a, b, 1)


def test_a_new_link_comes_up_only_after_the_lost_ones_listeners_heard_it(
    make_links: Callable[..., PeerLinks],
) -> None:
    """A listener that hears of a lost link late (its thread starved on a loaded box) must
    not take the loss for the new link to the same peer: the allreduce would abort a round
    on a link that is up. The new link waits for the old one's listeners."""
    a, b = make_links("a"), make_links("b")
    b.allow("a")
    a.connect_to("b", *b.address)
    assert b.wait_connected(["a"], 5)
    hearing, heard = threading.Event(), threading.Event()
    seen: list[str] = []

    def slow(peer: str, reason: str) -> None:
        hearing.set()
        assert _wait(lambda: reconnecting.is_set())
        time.sleep(0.3)  # the new connection is dialled and handshaken meanwhile
        seen.append(b.state(peer))
        heard.set()

    reconnecting = threading.Event()
    b.add_down_listener(slow)
    a.disconnect("b", reason="finished training")
    assert hearing.wait(5)
    b.allow("a")
    reconnecting.set()
    a.connect_to("b", *b.address)
    assert b.wait_connected(["a"], 5)
    assert heard.is_set() and seen == ["down"]  # the listener ran before b's link was up


def test_peer_closing_is_reported_as_state_and_callback(
    make_links: Callable[..., PeerLinks],
) -> None:
    a, b = make_links("a"), make_links("b")
    b.allow("a")
    a.connect_to("b", *b.address)
    down: list[tuple[str, str]] = []
    b.add_down_listener(lambda peer, reason: down.append((peer, reason)))
    assert b.wait_connected(["a"], 5)
    a.close()
    assert _wait(lambda: b.state("a") == "down")
    assert down and down[0][0] == "a"
    b.set_allowed([])
    assert b.connected() == frozenset()
