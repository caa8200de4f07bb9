"""The replication wire's batched receive on real TCP sockets: it never waits for bytes that
will not come (the last bytes of a frame are fewer than ``SO_RCVLOWAT``), it still times out
on a silent peer, and it reports a closed one."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator

import pytest

from chaos_edge.dataplane.errors import PeerGone
from chaos_edge.replication.transfer import wire

pytestmark = pytest.mark.timeout(20)
Pair = tuple[socket.socket, socket.socket]


@pytest.fixture
def pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    """A connected TCP pair on loopback: (sender, receiver with kernel timeouts of 60 s)."""
    with socket.create_server(("127.0.0.1", 0)) as lsock:
        tx = socket.create_connection(lsock.getsockname())
        rx, _ = lsock.accept()
    wire.kernel_timeouts(rx, 60.0)  # a hang shows as this test's timeout, not a pass
    try:
        yield tx, rx
    finally:
        tx.close()
        rx.close()


def warm_up(tx: socket.socket, rx: socket.socket, nbytes: int = 256 << 20) -> None:
    """Stream ``nbytes`` through the pair in 1 MiB frames, as a long transfer does: receive
    autotuning then opens a wide window, so the kernel no longer wakes a receiver because the
    window is nearly full, only for the low-water mark."""
    sender = threading.Thread(target=tx.sendall, args=(bytes(nbytes),))
    sender.start()
    frame = memoryview(bytearray(1 << 20))
    for _ in range(nbytes >> 20):
        wire.recv_into(rx, frame, "peer", batch=True)
    sender.join()


def test_the_tail_of_a_frame_arrives_after_a_partial_read(pair: Pair) -> None:
    tx, rx = pair
    warm_up(tx, rx)
    head, tail = b"a" * 300_000, b"b" * 500_000
    tx.sendall(head)
    while len(rx.recv(len(head), socket.MSG_PEEK)) < len(head):
        pass  # the head is queued before the receive starts
    # The receive copies the head, then waits for the tail, which is fewer bytes than its
    # low-water mark (the whole frame), and nothing follows it. Under MSG_WAITALL the kernel
    # would not wake it before the 60 s receive timeout.
    timer = threading.Timer(0.2, tx.sendall, args=(tail,))
    timer.start()
    buf = bytearray(len(head) + len(tail))
    wire.recv_into(rx, memoryview(buf), "peer", batch=True)
    timer.join()
    assert bytes(buf) == head + tail
    # The low-water mark is back to 1: a header read after the frame is not held back.
    assert rx.getsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT) == 1


def test_a_silent_peer_times_out(pair: Pair) -> None:
    tx, rx = pair
    wire.kernel_timeouts(rx, 0.3)
    tx.sendall(b"x" * 1000)
    with pytest.raises(TimeoutError):
        wire.recv_into(rx, memoryview(bytearray(5000)), "peer", batch=True)


def test_a_closed_peer_is_gone(pair: Pair) -> None:
    tx, rx = pair
    tx.sendall(b"x" * 1000)
    tx.close()
    with pytest.raises(PeerGone):
        wire.recv_into(rx, memoryview(bytearray(5000)), "peer", batch=True)
