"""Binary frame format of the data plane, and exact-size socket reads into buffers.

A frame is a fixed 40-byte big-endian header followed by ``length`` payload bytes::

    magic  4s  b"CHDP"
    version B   FORMAT_VERSION
    kind    B   Kind
    flags   H   bits 0-14: the attempt (rerun counter within a policy version; a round's
                epoch is ``(policy, attempt)``); bit 15: the frame belongs to the
                agreement phase that opens an epoch, not to a step's round
    step    Q   training round the frame serves (an agreement's: the round it opens)
    policy  Q   sync-policy version the frame belongs to
    aux     Q   kind-specific: element count of the reduced buffer (REDUCE/BCAST),
                a sample count (COUNT/TOTAL), 0 otherwise
    chunk   I   chunk index within the round
    length  I   payload bytes, at most MAX_PAYLOAD

Payloads are read straight into caller-provided memoryviews (``recv_exact_into``) so a 100 MB
gradient is never copied through intermediate ``bytes`` objects.
"""

from __future__ import annotations

import enum
import socket
import struct
from dataclasses import dataclass

from chaos_edge.dataplane.errors import FrameError, PeerGone

MAGIC = b"CHDP"
FORMAT_VERSION = 2  # 2: the agreement carries state digests
HEADER = struct.Struct("!4sBBHQQQII")
HEADER_SIZE = HEADER.size
#: Largest payload accepted after authentication. Chunk sizes must stay below it.
MAX_PAYLOAD = 16 << 20
#: Largest frame (header + payload) on the wire.
MAX_FRAME = HEADER_SIZE + MAX_PAYLOAD
#: Before authentication only tiny frames are accepted, so garbage cannot make us allocate.
MAX_HANDSHAKE_PAYLOAD = 1024
#: ``flags`` bit marking agreement-phase frames; the other bits hold the attempt.
AGREEMENT_FLAG = 1 << 15
MAX_ATTEMPT = AGREEMENT_FLAG - 1
_U64 = (1 << 64) - 1
_U32 = (1 << 32) - 1


class Kind(enum.IntEnum):
    """Frame kinds. Handshake kinds are only valid before a link is authenticated."""

    HELLO = 1
    PROOF = 2
    COUNT = 16  # child -> parent: samples in the child's subtree
    TOTAL = 17  # parent -> child: global sample count of the round
    REDUCE = 18  # child -> parent: partial sum of one chunk
    BCAST = 19  # parent -> child: final averaged values of one chunk
    ABORT = 20  # any tree neighbour: the round is aborted (payload: UTF-8 reason)
    ACK = 21  # child -> parent: my whole subtree holds the complete result
    COMMIT = 22  # parent -> child: the root saw every ACK; apply the result
    AGREE_UP = 23  # child -> parent: subtree summary of committed steps (agreement)
    AGREE_DOWN = 24  # parent -> child: the agreed committed step
    STATE_REQ = 32  # new node -> source: send me the state snapshot of a step
    STATE_MANIFEST = 33  # source -> new node: the snapshot's manifest (JSON)
    STATE_DATA = 34  # source -> new node: bytes of the snapshot at offset ``aux``
    STATE_END = 35  # source -> new node: done (payload empty) or refused (UTF-8 reason)


_KINDS = frozenset(int(k) for k in Kind)


@dataclass(frozen=True, slots=True)
class FrameHeader:
    """Decoded frame header (see the module docstring for the field meanings)."""

    kind: Kind
    step: int
    policy_version: int
    aux: int
    chunk: int
    length: int
    flags: int = 0

    @property
    def attempt(self) -> int:
        """Rerun counter within the policy version."""
        return self.flags & MAX_ATTEMPT

    @property
    def epoch(self) -> tuple[int, int]:
        """``(policy_version, attempt)``: rounds of a newer epoch supersede older ones."""
        return (self.policy_version, self.attempt)

    @property
    def tag(self) -> tuple[int, int]:
        """``(policy_version, step)``, the tag of the first protocol version."""
        return (self.policy_version, self.step)

    @property
    def serves(self) -> int:
        """The training round the sender's phase serves (an agreement opens the epoch of
        its ``committed + 1``): a newer epoch for a later round means the sender is past ours."""
        return self.step

    @property
    def round_tag(self) -> tuple[int, int, int]:
        """Policy version, attempt, step; the agreement phase of an epoch has step -1."""
        step = -1 if self.flags & AGREEMENT_FLAG else self.step
        return (self.policy_version, self.attempt, step)


def phase_flags(attempt: int, agreement: bool) -> int:
    """The ``flags`` field of a frame of this attempt and phase."""
    if not 0 <= attempt <= MAX_ATTEMPT:
        raise FrameError(f"attempt {attempt} out of range (0..{MAX_ATTEMPT})")
    return attempt | (AGREEMENT_FLAG if agreement else 0)


def encode_header(header: FrameHeader) -> bytes:
    """Pack a header into its 40 wire bytes.

    Raises:
        FrameError: A field is out of range or the payload is over MAX_PAYLOAD.
    """
    if not 0 <= header.length <= MAX_PAYLOAD:
        raise FrameError(f"payload of {header.length} bytes exceeds MAX_PAYLOAD={MAX_PAYLOAD}")
    for name in ("step", "policy_version", "aux"):
        if not 0 <= getattr(header, name) <= _U64:
            raise FrameError(f"header field {name} out of range")
    if not 0 <= header.chunk <= _U32:
        raise FrameError("header field chunk out of range")
    return HEADER.pack(
        MAGIC,
        FORMAT_VERSION,
        int(header.kind),
        header.flags,
        header.step,
        header.policy_version,
        header.aux,
        header.chunk,
        header.length,
    )


def decode_header(
    data: bytes | bytearray | memoryview, max_payload: int = MAX_PAYLOAD
) -> FrameHeader:
    """Parse and validate 40 header bytes.

    Args:
        data: Exactly HEADER_SIZE bytes.
        max_payload: Largest payload acceptable in the current connection state.

    Raises:
        FrameError: Wrong size, magic, version or kind, or a payload over ``max_payload``.
    """
    if len(data) != HEADER_SIZE:
        raise FrameError(f"header must be {HEADER_SIZE} bytes, got {len(data)}")
    magic, version, kind, flags, step, policy, aux, chunk, length = HEADER.unpack(data)
    if magic != MAGIC:
        raise FrameError(f"bad magic {bytes(magic)!r}")
    if version != FORMAT_VERSION:
        raise FrameError(f"unsupported frame format version {version}")
    if kind not in _KINDS:
        raise FrameError(f"unknown frame kind {kind}")
    if length > max_payload:
        raise FrameError(f"frame payload of {length} bytes exceeds the limit of {max_payload}")
    return FrameHeader(Kind(kind), step, policy, aux, chunk, length, flags)


def encode_frame(header: FrameHeader, payload: bytes = b"") -> bytes:
    """Header plus payload as one bytes object (for small control frames only)."""
    if header.length != len(payload):
        raise FrameError("header length does not match the payload")
    return encode_header(header) + payload


def recv_exact_into(sock: socket.socket, view: memoryview, peer: str = "?") -> None:
    """Fill ``view`` completely from ``sock``.

    Uses MSG_WAITALL so a blocking socket returns a whole chunk in one system call; a kernel
    receive timeout (SO_RCVTIMEO) only makes the loop go round again, while a Python-level
    timeout (``sock.settimeout``, used during the handshake) raises ``TimeoutError``.

    Raises:
        PeerGone: The peer closed the connection before ``view`` was full.
        OSError: The socket failed.
    """
    view = view.cast("B")
    got = 0
    total = len(view)
    while got < total:
        try:
            n = sock.recv_into(view[got:], total - got, socket.MSG_WAITALL)
        except BlockingIOError:
            continue  # SO_RCVTIMEO expired with nothing read: keep waiting
        if n == 0:
            raise PeerGone(peer, "connection closed by peer")
        got += n


def discard_exact(sock: socket.socket, nbytes: int, peer: str = "?") -> None:
    """Read and drop ``nbytes`` (a stale or rejected payload), keeping the framing intact."""
    scratch = memoryview(bytearray(min(nbytes, 1 << 20) or 1))
    while nbytes > 0:
        step = min(nbytes, len(scratch))
        recv_exact_into(sock, scratch[:step], peer)
        nbytes -= step


def read_small_frame(sock: socket.socket, peer: str = "?") -> tuple[FrameHeader, bytes]:
    """Read one handshake-sized frame (payload at most MAX_HANDSHAKE_PAYLOAD)."""
    head = bytearray(HEADER_SIZE)
    recv_exact_into(sock, memoryview(head), peer)
    header = decode_header(head, MAX_HANDSHAKE_PAYLOAD)
    payload = bytearray(header.length)
    if header.length:
        recv_exact_into(sock, memoryview(payload), peer)
    return header, bytes(payload)
