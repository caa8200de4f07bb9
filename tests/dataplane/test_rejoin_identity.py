"""A worker that rejoins in-process attaches again and sets its identity once more, while its
links are still up: the same identity is a no-op (the soak found the worker crashing with
"cannot change identity while links are up"); another identity is still refused."""

from __future__ import annotations

import pytest

from chaos_edge.dataplane import DataPlaneError, LinkConfig, PeerLinks

pytestmark = pytest.mark.timeout(30)
SECRET = b"s3cret"
FAST = LinkConfig(handshake_timeout=1.0, io_poll=0.2)


def test_same_identity_keeps_the_links_another_is_refused() -> None:
    a = PeerLinks("a", "test", SECRET, is_member={"a", "b"}.__contains__, config=FAST)
    b = PeerLinks("b", "test", SECRET, is_member={"a", "b"}.__contains__, config=FAST)
    try:
        for links in (a, b):
            links.start()
            links.allow("a", "b")
        a.connect_to("b", *b.address)
        assert a.wait_connected(["b"], 10) and b.wait_connected(["a"], 10)
        a.set_identity("a", "test", SECRET)  # a rejoin: the same node attaches again
        assert a.connected() == {"b"} and a.me.node_id == "a"
        with pytest.raises(DataPlaneError, match="while links are up"):
            a.set_identity("a2", "test", SECRET)
    finally:
        a.close()
        b.close()
