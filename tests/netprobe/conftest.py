"""Fixtures for the netprobe tests: free ports, namespace prefixes that always get cleaned up."""

from __future__ import annotations

import secrets
import socket
from collections.abc import Iterator

import psutil
import pytest

from netprobe import netns


def _free_port(kind: int) -> int:
    with socket.socket(socket.AF_INET, kind) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@pytest.fixture
def free_tcp_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (iperf3 cannot bind port 0)."""
    return _free_port(socket.SOCK_STREAM)


@pytest.fixture
def netns_prefix() -> Iterator[str]:
    """A fresh ``chaos-tXXXX-`` prefix; everything under it is removed afterwards, and checked."""
    reason = netns.netns_unavailable_reason()
    if reason is not None:
        pytest.skip(f"netns test skipped: {reason}")
    prefix = netns.make_prefix("t" + secrets.token_hex(2))
    try:
        yield prefix
    finally:
        netns.cleanup(prefix)
        assert netns.list_netns(prefix) == [], "namespaces leaked past cleanup()"
        assert netns.list_links(prefix) == [], "veths leaked past cleanup()"


@pytest.fixture(autouse=True)
def no_leaked_children() -> Iterator[None]:
    """Fail a test that leaves a child process (an iperf3 server or client) behind."""
    me = psutil.Process()
    before = {p.pid for p in me.children(recursive=True)}
    yield
    leaked = [p for p in me.children(recursive=True) if p.pid not in before]
    _, alive = psutil.wait_procs(leaked, timeout=2)
    for proc in alive:
        proc.kill()
    assert not alive, f"test leaked child processes: {[p.cmdline() for p in alive]}"
