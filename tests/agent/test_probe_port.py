"""chaosd's iperf3 server port: one it picked and lost to another process before iperf3 bound
it is picked again (a suite's demo once died of this at start-up); one the operator chose is
not (its failure is theirs to see). Real iperf3 servers on loopback."""

from __future__ import annotations

import asyncio
import shutil
import socket
from collections.abc import Iterator

import pytest

from daemon.agent import probes
from daemon.contracts.config import ProbeConfig
from netprobe import IperfError

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def taken() -> Iterator[int]:
    """A loopback port some other process listens on."""
    if shutil.which("iperf3") is None:
        pytest.skip("iperf3 is not installed (the README's test command installs it)")
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield int(s.getsockname()[1])


def test_a_picked_port_lost_before_the_bind_is_picked_again(
        taken: int, monkeypatch: pytest.MonkeyPatch) -> None:
    picks = iter([taken])
    real = probes._free_tcp_port
    monkeypatch.setattr(probes, "_free_tcp_port", lambda host: next(picks, None) or real(host))

    async def run() -> int:
        mon = probes.LinkMonitor(ProbeConfig(), "127.0.0.1", lambda _m: None)
        assert mon.bw_port == taken  # the race: free when picked, taken at the bind
        await mon.start()
        try:
            port = mon.bw_port
            with socket.create_connection(("127.0.0.1", port), timeout=5):
                pass  # iperf3 listens there
            return port
        finally:
            await mon.stop()

    assert asyncio.run(run()) != taken


def test_a_port_the_operator_chose_fails_with_its_reason(taken: int) -> None:
    async def run() -> None:
        mon = probes.LinkMonitor(ProbeConfig(bw_port=taken), "127.0.0.1", lambda _m: None)
        try:
            await mon.start()
        finally:
            await mon.stop()

    with pytest.raises(IperfError, match=f"port {taken}"):
        asyncio.run(run())
