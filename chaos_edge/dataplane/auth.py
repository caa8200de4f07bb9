"""Mutual HMAC-SHA256 challenge-response handshake for a fresh data-plane connection.

Both sides send ``HELLO`` (node id, cluster, a fresh 32-byte nonce, an incarnation id), then
each proves knowledge of the cluster secret with an HMAC over a transcript holding both ids,
both nonces, both incarnations and its role. The roles differ so one side's proof can never be
replayed as the other's; fresh nonces stop replays across connections. The acceptor verifies the
initiator's proof *before* sending its own, and then asks ``is_allowed(peer_id)`` (cluster
membership and the neighbour set).

Every failure (wrong secret, wrong cluster, not allowed, timeout, garbage, EOF) comes out as
:class:`AuthError`; the caller logs one line and closes the socket.
"""

from __future__ import annotations

import hmac
import json
import re
import secrets
import socket
from collections.abc import Callable
from dataclasses import dataclass
from hashlib import sha256

from chaos_edge.dataplane.errors import AuthError, DataPlaneError
from chaos_edge.dataplane.frames import FrameHeader, Kind, encode_frame, read_small_frame

_NODE_ID = re.compile(r"^[A-Za-z0-9._:@-]{1,64}$")
_NONCE_BYTES = 32
_DOMAIN = b"chaos-dataplane-auth-v1"


@dataclass(frozen=True)
class Identity:
    """This node's credentials for the data plane.

    Attributes:
        node_id: Cluster-unique node id (letters, digits, ``._:@-``; at most 64 chars).
        cluster: Cluster name; peers of another cluster are refused.
        secret: The cluster's shared secret.
        incarnation: Random id of this process's PeerLinks, so a peer can tell a restart
            from a duplicate connection.
    """

    node_id: str
    cluster: str
    secret: bytes
    incarnation: str

    def __post_init__(self) -> None:
        if not valid_node_id(self.node_id):
            raise ValueError(f"invalid node id {self.node_id!r}")
        if not self.secret:
            raise ValueError("the cluster secret must not be empty")


@dataclass(frozen=True)
class PeerHello:
    """What an authenticated peer told us about itself."""

    node_id: str
    cluster: str
    incarnation: str
    nonce: bytes


def valid_node_id(node_id: str) -> bool:
    """Whether ``node_id`` is acceptable on the wire."""
    return bool(_NODE_ID.match(node_id))


def new_incarnation() -> str:
    """A random incarnation id for a new PeerLinks instance."""
    return secrets.token_hex(8)


def _hello(me: Identity, nonce: bytes) -> bytes:
    body = json.dumps(
        {"id": me.node_id, "cluster": me.cluster, "nonce": nonce.hex(), "inc": me.incarnation}
    ).encode()
    return encode_frame(FrameHeader(Kind.HELLO, 0, 0, 0, 0, len(body)), body)


def _parse_hello(payload: bytes) -> PeerHello:
    try:
        doc = json.loads(payload)
        node_id, cluster, nonce_hex, inc = doc["id"], doc["cluster"], doc["nonce"], doc["inc"]
        if not all(isinstance(v, str) for v in (node_id, cluster, nonce_hex, inc)):
            raise TypeError("hello fields must be strings")
        nonce = bytes.fromhex(nonce_hex)
    except (ValueError, KeyError, TypeError) as exc:
        raise AuthError(f"malformed hello: {exc}") from None
    if not valid_node_id(node_id) or len(nonce) != _NONCE_BYTES or len(inc) > 64:
        raise AuthError("malformed hello: bad node id, nonce or incarnation")
    return PeerHello(node_id, cluster, inc, nonce)


def _mac(secret: bytes, role: bytes, cluster: str, init: PeerHello, acc: PeerHello) -> bytes:
    transcript = b"\n".join(
        [
            _DOMAIN,
            role,
            cluster.encode(),
            init.node_id.encode(),
            acc.node_id.encode(),
            init.nonce.hex().encode(),
            acc.nonce.hex().encode(),
            init.incarnation.encode(),
            acc.incarnation.encode(),
        ]
    )
    return hmac.new(secret, transcript, sha256).digest()


def _proof(mac: bytes) -> bytes:
    return encode_frame(FrameHeader(Kind.PROOF, 0, 0, 0, 0, len(mac)), mac)


def _expect(sock: socket.socket, kind: Kind, peer: str) -> bytes:
    header, payload = read_small_frame(sock, peer)
    if header.kind is not kind:
        raise AuthError(f"expected {kind.name}, got {header.kind.name}")
    return payload


def _run(step: Callable[[], PeerHello], sock: socket.socket, timeout: float) -> PeerHello:
    """Run a handshake under a timeout, mapping every failure to AuthError."""
    old = sock.gettimeout()
    sock.settimeout(timeout)
    try:
        return step()
    except AuthError:
        raise
    except TimeoutError:
        raise AuthError(f"handshake timed out after {timeout:.1f}s") from None
    except (DataPlaneError, OSError) as exc:
        raise AuthError(f"handshake failed: {exc}") from None
    finally:
        sock.settimeout(old)


def initiate(
    sock: socket.socket, me: Identity, expected_peer: str, timeout: float = 5.0
) -> PeerHello:
    """Authenticate an outgoing connection to ``expected_peer``.

    Raises:
        AuthError: The peer is someone else, failed its proof, refused us, or timed out.
    """

    def step() -> PeerHello:
        mine = PeerHello(me.node_id, me.cluster, me.incarnation, secrets.token_bytes(_NONCE_BYTES))
        sock.sendall(_hello(me, mine.nonce))
        theirs = _parse_hello(_expect(sock, Kind.HELLO, expected_peer))
        if theirs.node_id != expected_peer or theirs.cluster != me.cluster:
            raise AuthError(
                f"expected {expected_peer!r} of cluster {me.cluster!r}, "
                f"got {theirs.node_id!r} of {theirs.cluster!r}"
            )
        sock.sendall(_proof(_mac(me.secret, b"initiator", me.cluster, mine, theirs)))
        try:
            proof = _expect(sock, Kind.PROOF, expected_peer)
        except DataPlaneError:
            raise AuthError(
                f"{expected_peer!r} refused the connection "
                "(wrong secret, not a member, or not an allowed neighbour)"
            ) from None
        want = _mac(me.secret, b"acceptor", me.cluster, mine, theirs)
        if not hmac.compare_digest(proof, want):
            raise AuthError(f"{expected_peer!r} failed to prove the cluster secret")
        return theirs

    return _run(step, sock, timeout)


def accept(
    sock: socket.socket, me: Identity, is_allowed: Callable[[str], bool], timeout: float = 5.0
) -> PeerHello:
    """Authenticate an incoming connection; the initiator proves itself first.

    Raises:
        AuthError: Wrong cluster or secret, ``is_allowed`` said no, garbage, or timeout.
    """

    def step() -> PeerHello:
        theirs = _parse_hello(_expect(sock, Kind.HELLO, "?"))
        if theirs.cluster != me.cluster:
            raise AuthError(f"{theirs.node_id!r} belongs to cluster {theirs.cluster!r}")
        if theirs.node_id == me.node_id:
            raise AuthError("peer claims our own node id")
        mine = PeerHello(me.node_id, me.cluster, me.incarnation, secrets.token_bytes(_NONCE_BYTES))
        sock.sendall(_hello(me, mine.nonce))
        proof = _expect(sock, Kind.PROOF, theirs.node_id)
        want = _mac(me.secret, b"initiator", me.cluster, theirs, mine)
        if not hmac.compare_digest(proof, want):
            raise AuthError(f"{theirs.node_id!r} does not know the cluster secret")
        if not is_allowed(theirs.node_id):
            raise AuthError(f"{theirs.node_id!r} is not a member or not an allowed neighbour")
        sock.sendall(_proof(_mac(me.secret, b"acceptor", me.cluster, theirs, mine)))
        return theirs

    return _run(step, sock, timeout)
