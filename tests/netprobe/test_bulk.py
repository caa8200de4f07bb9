"""The bulk-probe fallback and the BandwidthProber facade that picks it when iperf3 is missing."""

from __future__ import annotations

import asyncio
import logging
import shutil
import uuid

import pytest

from netprobe.bandwidth import BandwidthProber
from netprobe.bulk import BulkProbeServer, bulk_measure
from netprobe.errors import BulkProbeError, IperfMissing, ProbeTimeout
from netprobe.iperf_server import IperfServer

pytestmark = pytest.mark.timeout(60)

LOCAL = "127.0.0.1"


async def test_bulk_measure_by_bytes() -> None:
    async with BulkProbeServer(LOCAL, 0) as server:
        result = await bulk_measure(LOCAL, server.port, nbytes=8 << 20)
        assert result.tool == "bulk"
        assert result.bytes == 8 << 20
        assert result.bits_per_second > 0 and result.seconds > 0
        assert server.tests == 1


async def test_bulk_measure_tiny_and_by_duration() -> None:
    async with BulkProbeServer(LOCAL, 0) as server:
        tiny = await bulk_measure(LOCAL, server.port, nbytes=100)
        assert tiny.bytes == 100 and tiny.bits_per_second > 0
        timed = await bulk_measure(LOCAL, server.port, duration_s=0.3)
        assert timed.bytes > 0 and timed.bits_per_second > 0


async def test_bulk_server_survives_garbage_and_half_open_clients() -> None:
    async with BulkProbeServer(LOCAL, 0, idle_timeout_s=0.5) as server:
        for payload in (b"GET / HTTP/1.0\r\n\r\n", b"", b"CHBK\x09\x00\x00\x00"):
            reader, writer = await asyncio.open_connection(LOCAL, server.port)
            writer.write(payload)
            await writer.drain()
            writer.write_eof()
            assert await asyncio.wait_for(reader.read(), 3) == b""  # server hung up
            writer.close()
        result = await bulk_measure(LOCAL, server.port, nbytes=1 << 20)
        assert result.bits_per_second > 0


async def test_bulk_refused_is_a_clear_error(free_tcp_port: int) -> None:
    with pytest.raises(BulkProbeError, match="BulkProbeServer"):
        await bulk_measure(LOCAL, free_tcp_port, nbytes=10)


async def test_bulk_timeout() -> None:
    # A server that accepts and never replies.
    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await asyncio.sleep(30)

    srv = await asyncio.start_server(silent, LOCAL, 0)
    port = srv.sockets[0].getsockname()[1]
    try:
        with pytest.raises(ProbeTimeout):
            await bulk_measure(LOCAL, port, nbytes=10, timeout_s=0.5)
    finally:
        srv.close()


async def test_prober_falls_back_and_warns_once(caplog: pytest.LogCaptureFixture) -> None:
    missing = f"iperf3-missing-{uuid.uuid4().hex[:8]}"
    with caplog.at_level(logging.WARNING, logger="netprobe.bandwidth"):
        prober = BandwidthProber(binary=missing)
        BandwidthProber(binary=missing)  # a second facade does not warn again
    warnings = [r for r in caplog.records if "not found" in r.getMessage()]
    assert len(warnings) == 1
    assert "apt-get install iperf3" in warnings[0].getMessage()
    assert prober.kind == "bulk"
    server = prober.make_server(LOCAL, 0)
    assert isinstance(server, BulkProbeServer)
    async with server:
        result = await prober.measure(LOCAL, server.port, nbytes=1 << 20)
    assert result.tool == "bulk" and result.bits_per_second > 0


async def test_peer_serving_iperf3_needs_it_here() -> None:
    prober = BandwidthProber(binary=f"iperf3-missing-{uuid.uuid4().hex[:8]}")
    with pytest.raises(IperfMissing):
        await prober.measure(LOCAL, 5201, peer_kind="iperf3")


@pytest.mark.skipif(shutil.which("iperf3") is None, reason="iperf3 is not installed")
async def test_prober_uses_iperf3_when_present(free_tcp_port: int) -> None:
    prober = BandwidthProber()
    assert prober.kind == "iperf3"
    with pytest.raises(ValueError):
        prober.make_server(LOCAL, 0)
    server = prober.make_server(LOCAL, free_tcp_port)
    assert isinstance(server, IperfServer)
    async with server:
        result = await prober.measure(LOCAL, free_tcp_port, nbytes=1 << 20)
        assert result.tool == "iperf3" and result.bits_per_second > 0
    # A node with iperf3 can still probe a peer that only serves the bulk probe.
    async with BulkProbeServer(LOCAL, 0) as bulk_server:
        result = await prober.measure(LOCAL, bulk_server.port, nbytes=1 << 16, peer_kind="bulk")
        assert result.tool == "bulk"
