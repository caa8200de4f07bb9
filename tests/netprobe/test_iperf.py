"""The iperf3 driver against a real iperf3 server on 127.0.0.1."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import shutil
import signal
from collections.abc import AsyncIterator

import pytest

from netprobe import iperf
from netprobe.errors import IperfBusy, IperfError, IperfMissing, ProbeTimeout
from netprobe.iperf_server import IperfServer

pytestmark = [
    pytest.mark.timeout(60),
    pytest.mark.skipif(shutil.which("iperf3") is None, reason="iperf3 is not installed"),
]

LOCAL = "127.0.0.1"


@pytest.fixture
async def server(free_tcp_port: int) -> AsyncIterator[IperfServer]:
    srv = IperfServer(LOCAL, free_tcp_port)
    await srv.start()
    try:
        yield srv
    finally:
        await srv.stop()


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


async def test_measure_by_bytes_parses_json(server: IperfServer) -> None:
    result = await iperf.measure(LOCAL, server.port, nbytes=1 << 20, timeout_s=20)
    assert result.tool == "iperf3"
    assert result.bits_per_second > 0
    assert result.bytes >= 1 << 20
    assert result.seconds > 0
    assert result.retransmits is not None and result.retransmits >= 0
    assert result.mean_rtt_ms is None or result.mean_rtt_ms >= 0


async def test_measure_by_duration_and_reverse(server: IperfServer) -> None:
    result = await iperf.measure(LOCAL, server.port, duration_s=1, reverse=True, timeout_s=20)
    assert result.bits_per_second > 0 and result.seconds > 0.5


async def test_busy_server_is_retried_until_free(
    server: IperfServer, caplog: pytest.LogCaptureFixture
) -> None:
    # Another node (a raw iperf3 client outside our per-server lock) holds the server.
    other = await asyncio.create_subprocess_exec(
        "iperf3",
        "-c",
        LOCAL,
        "-p",
        str(server.port),
        "-t",
        "2",
        "--json",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL,
    )
    try:
        await asyncio.sleep(0.5)  # let it get going
        with caplog.at_level(logging.DEBUG, logger="netprobe.iperf"):
            result = await iperf.measure(LOCAL, server.port, nbytes=1 << 20, timeout_s=20)
        assert result.bits_per_second > 0
        assert any("busy" in r.getMessage() for r in caplog.records), "no busy retry happened"
        out, _ = await other.communicate()
        assert "error" not in json.loads(out)
    finally:
        if other.returncode is None:
            other.kill()
            await other.wait()


async def test_busy_until_deadline_raises_iperf_busy(server: IperfServer) -> None:
    other = await asyncio.create_subprocess_exec(
        "iperf3",
        "-c",
        LOCAL,
        "-p",
        str(server.port),
        "-t",
        "4",
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
    )
    try:
        await asyncio.sleep(0.5)
        with pytest.raises(IperfBusy, match="busy"):
            await iperf.measure(LOCAL, server.port, nbytes=1 << 16, timeout_s=1.0)
    finally:
        other.kill()
        await other.wait()


async def test_concurrent_clients_in_one_process_are_serialised(
    server: IperfServer, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.DEBUG, logger="netprobe.iperf"):
        results = await asyncio.gather(
            iperf.measure(LOCAL, server.port, duration_s=1, timeout_s=20),
            iperf.measure(LOCAL, server.port, duration_s=1, timeout_s=20),
        )
    assert all(r.bits_per_second > 0 for r in results)
    # The per-server lock queued the second test, so the server never said "busy".
    assert not any("busy" in r.getMessage() for r in caplog.records)


async def test_two_clients_that_bypass_the_lock_both_succeed(server: IperfServer) -> None:
    # "localhost" and "127.0.0.1" are different lock keys, so these two really collide and
    # the loser goes through the busy-retry path.
    results = await asyncio.gather(
        iperf.measure(LOCAL, server.port, duration_s=1, timeout_s=20),
        iperf.measure("localhost", server.port, duration_s=1, timeout_s=20),
    )
    assert all(r.bits_per_second > 0 for r in results)


async def test_timeout_kills_the_client(server: IperfServer) -> None:
    with pytest.raises(ProbeTimeout, match="killed"):
        await iperf.measure(LOCAL, server.port, duration_s=10, timeout_s=1.0)
    # no_leaked_children (conftest) checks that the client is gone.


async def test_connection_refused_is_a_clear_error(free_tcp_port: int) -> None:
    with pytest.raises(IperfError, match="iperf3 server"):
        await iperf.measure(LOCAL, free_tcp_port, nbytes=1024, timeout_s=10)


async def test_missing_binary() -> None:
    with pytest.raises(IperfMissing, match="apt-get install iperf3"):
        await iperf.measure(LOCAL, 5201, binary="iperf3-does-not-exist")
    with pytest.raises(IperfMissing):
        await IperfServer(LOCAL, 5201, binary="iperf3-does-not-exist").start()


async def test_server_restarts_after_it_dies(server: IperfServer) -> None:
    pid = server.pid
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 10
    while server.restarts < 1:
        assert loop.time() < deadline, "server was not restarted"
        await asyncio.sleep(0.05)
    assert server.pid not in (None, pid)
    result = await iperf.measure(LOCAL, server.port, nbytes=1 << 16, timeout_s=20)
    assert result.bits_per_second > 0


async def test_stop_leaves_no_process(free_tcp_port: int) -> None:
    srv = IperfServer(LOCAL, free_tcp_port)
    await srv.start()
    pid = srv.pid
    assert pid is not None and pid_alive(pid)
    await srv.stop()
    await srv.stop()  # idempotent
    assert srv.pid is None and not pid_alive(pid)


async def test_port_in_use_is_reported(server: IperfServer) -> None:
    with pytest.raises(IperfError, match="did not start"):
        await IperfServer(LOCAL, server.port, restart=False, ready_timeout_s=3).start()


def test_parse_error_document() -> None:
    with pytest.raises(IperfError, match="busy"):
        iperf.parse_iperf_json({"error": "the server is busy running a test. try again later"})
    with pytest.raises(IperfError, match="sum_received"):
        iperf.parse_iperf_json({"end": {}})


def test_parse_full_document() -> None:
    doc = {
        "end": {
            "streams": [{"sender": {"mean_rtt": 1500}}, {"sender": {"mean_rtt": 2500}}],
            "sum_sent": {"bytes": 1000, "seconds": 1.0, "bits_per_second": 8000, "retransmits": 3},
            "sum_received": {"bytes": 900, "seconds": 1.0, "bits_per_second": 7200},
        }
    }
    result = iperf.parse_iperf_json(doc)
    assert result.bits_per_second == 7200
    assert result.bytes == 1000  # what the sender put on the link
    assert result.retransmits == 3
    assert result.mean_rtt_ms == pytest.approx(2.0)  # microseconds -> ms, averaged


def test_both_duration_and_bytes_rejected() -> None:
    with pytest.raises(ValueError):
        asyncio.run(iperf.measure(LOCAL, 1, duration_s=1, nbytes=1))
