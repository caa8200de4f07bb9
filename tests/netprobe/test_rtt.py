"""RTT probing over real UDP sockets on 127.0.0.1 (port 0 everywhere)."""

from __future__ import annotations

import asyncio
import math
import socket
from collections.abc import Callable

import pytest

from netprobe.clock import FakeClock
from netprobe.linkstate import PeerStats
from netprobe.rtt import KIND_PING, KIND_PONG, PACKET_SIZE, RttPacket, RttProber, RttResponder

pytestmark = pytest.mark.timeout(60)

LOCAL = "127.0.0.1"


async def eventually(cond: Callable[[], bool], timeout_s: float = 5.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not cond():
        assert loop.time() < deadline, "condition not met in time"
        await asyncio.sleep(0.01)


def test_packet_roundtrip_and_rejects() -> None:
    packet = RttPacket(KIND_PING, nonce=2**64 - 1, seq=42)
    data = packet.encode()
    assert len(data) == PACKET_SIZE
    assert RttPacket.decode(data) == packet
    assert RttPacket.decode(b"") is None
    assert RttPacket.decode(data + b"x") is None
    assert RttPacket.decode(b"XXXX" + data[4:]) is None
    assert RttPacket.decode(data[:4] + b"\x09" + data[5:]) is None  # unknown version
    assert RttPacket.decode(data[:5] + b"\x07" + data[6:]) is None  # unknown kind


async def test_responder_binds_port_zero_and_reports_it() -> None:
    responder = RttResponder(LOCAL, 0)
    with pytest.raises(RuntimeError):
        _ = responder.port
    async with responder:
        assert responder.port > 0


async def test_real_rtt_measurement_on_loopback() -> None:
    async with (
        RttResponder(LOCAL, 0) as responder,
        RttProber(bind_host=LOCAL, interval_s=0.05) as prober,
    ):
        prober.add_peer("b", LOCAL, responder.port)
        await eventually(lambda: prober.stats("b").received >= 5)
        stats = prober.stats("b")
        assert stats.state == "up"
        # A measured, positive RTT; its size on a loaded box is timing, not correctness.
        assert stats.rtt_ewma_s is not None and 0 < stats.rtt_ewma_s < math.inf
        assert responder.echoed >= 5


async def test_peers_can_be_added_and_removed_at_runtime() -> None:
    async with (
        RttResponder(LOCAL, 0) as r1,
        RttResponder(LOCAL, 0) as r2,
        RttProber(bind_host=LOCAL, interval_s=0.05) as prober,
    ):
        prober.add_peer("one", LOCAL, r1.port)
        await eventually(lambda: prober.stats("one").received >= 2)
        prober.add_peer("two", LOCAL, r2.port)
        await eventually(lambda: prober.stats("two").received >= 2)
        prober.remove_peer("one")
        echoed = r1.echoed
        await asyncio.sleep(0.3)
        assert r1.echoed <= echoed + 1  # at most one probe was already in flight
        assert set(prober.snapshot()) == {"two"}


async def test_garbage_datagrams_are_counted_and_ignored() -> None:
    async with (
        RttResponder(LOCAL, 0) as responder,
        RttProber(bind_host=LOCAL, bind_port=0, interval_s=0.05) as prober,
    ):
        prober.add_peer("b", LOCAL, responder.port)
        await eventually(lambda: prober.stats("b").received >= 1)
        prober_port = prober._transport.get_extra_info("sockname")[1]  # type: ignore[union-attr]
        junk = [
            b"",
            b"hello",
            b"\x00" * PACKET_SIZE,
            RttPacket(KIND_PONG, nonce=1, seq=1).encode(),  # a pong: responders never echo it
            RttPacket(KIND_PING, nonce=0, seq=0).encode()[:-1],
            bytes(range(256)) * 4,
        ]
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            for payload in junk:
                s.sendto(payload, (LOCAL, responder.port))
            # A forged pong with the wrong nonce, straight at the prober.
            for payload in [*junk, RttPacket(KIND_PONG, nonce=12345, seq=1).encode()]:
                s.sendto(payload, (LOCAL, prober_port))
        await eventually(lambda: responder.garbage >= len(junk) and prober.garbage >= len(junk))
        received = prober.stats("b").received
        await eventually(lambda: prober.stats("b").received > received + 2)
        assert prober.stats("b").state == "up"


async def test_fail_and_recover_callbacks_with_manual_clock() -> None:
    clock = FakeClock(0.0)
    failed: list[PeerStats] = []
    recovered: list[PeerStats] = []
    prober = RttProber(
        bind_host=LOCAL,
        interval_s=1.0,
        timeout_s=0.5,
        fail_after=3,
        on_fail=failed.append,
        on_recover=recovered.append,
        clock=clock,
    )
    async with RttResponder(LOCAL, 0) as responder:
        await prober.start(run_loop=False)
        try:
            prober.add_peer("b", LOCAL, responder.port)
            prober.poll()
            await eventually(lambda: prober.stats("b").received == 1)
            responder.drop = True  # the link dies
            for _ in range(3):
                clock.advance(1.0)
                prober.poll()  # sends a probe that will be dropped
                await asyncio.sleep(0.02)
                clock.advance(0.5)
                prober.poll()  # expires it
            assert [s.peer for s in failed] == ["b"]
            assert failed[0].state == "down" and failed[0].consecutive_misses == 3
            assert recovered == []
            responder.drop = False  # the link heals
            clock.advance(1.0)
            prober.poll()
            await eventually(lambda: len(recovered) == 1)
            assert recovered[0].state == "up" and len(failed) == 1
        finally:
            await prober.stop()


async def test_real_clock_detects_failure_within_bound() -> None:
    events: list[tuple[str, float]] = []
    loop = asyncio.get_running_loop()
    async with (
        RttResponder(LOCAL, 0) as responder,
        RttProber(
            bind_host=LOCAL,
            interval_s=0.1,
            timeout_s=0.1,
            fail_after=3,
            on_fail=lambda s: events.append(("failed", loop.time())),
            on_recover=lambda s: events.append(("recovered", loop.time())),
        ) as prober,
    ):
        prober.add_peer("b", LOCAL, responder.port)
        await eventually(lambda: prober.stats("b").received >= 2)
        responder.drop = True
        dropped_at = loop.time()
        await eventually(lambda: len(events) == 1)
        assert events[0][0] == "failed"
        # Bound 0.1 * 3 + 0.1 = 0.4 s; allow scheduling slack on a shared 2-core box.
        assert events[0][1] - dropped_at <= prober.detection_bound_s + 0.5
        responder.drop = False
        await eventually(lambda: len(events) == 2)
        assert events[1][0] == "recovered"


async def test_callback_exceptions_do_not_stop_probing() -> None:
    def boom(stats: PeerStats) -> None:
        raise RuntimeError("observer bug")

    async with (
        RttResponder(LOCAL, 0) as responder,
        RttProber(
            bind_host=LOCAL, interval_s=0.05, timeout_s=0.05, fail_after=1, on_fail=boom
        ) as prober,
    ):
        responder.drop = True
        prober.add_peer("b", LOCAL, responder.port)
        await eventually(lambda: prober.stats("b").state == "down")
        responder.drop = False
        await eventually(lambda: prober.stats("b").state == "up")


async def test_unreachable_port_is_a_miss_not_an_error() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind((LOCAL, 0))
        closed_port = s.getsockname()[1]
    failed: list[PeerStats] = []
    async with RttProber(
        bind_host=LOCAL, interval_s=0.05, timeout_s=0.05, fail_after=2, on_fail=failed.append
    ) as prober:
        prober.add_peer("gone", LOCAL, closed_port)
        await eventually(lambda: len(failed) == 1)
        assert prober.stats("gone").received == 0
