"""``procs.listening``: the wait for a server in a testbed namespace sees IPv4 and dual-stack
listeners (iperf3 listens on ``::``; read from ``tcp`` only, every wait for it ran out)."""

from __future__ import annotations

import os
import socket

import pytest

from chaosctl.testbed.procs import listening


@pytest.mark.parametrize("family", [socket.AF_INET, socket.AF_INET6])
def test_a_listener_of_either_family_is_seen(family: socket.AddressFamily) -> None:
    try:
        sock = socket.socket(family, socket.SOCK_STREAM)
    except OSError:
        pytest.skip(f"no {family.name} on this box")
    with sock:
        sock.bind(("::" if family == socket.AF_INET6 else "127.0.0.1", 0))
        port = sock.getsockname()[1]
        assert not listening(os.getpid(), port)  # bound, not listening yet
        sock.listen()
        assert listening(os.getpid(), port)
    assert not listening(os.getpid(), port)


def test_a_process_that_is_gone_listens_on_nothing() -> None:
    assert not listening(2**22 + 7, 80)  # above pid_max's usual 2**22
