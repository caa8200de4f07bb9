"""Frame header encoding and validation."""

from __future__ import annotations

import socket
import struct

import pytest

from chaos_edge.dataplane.errors import FrameError, PeerGone
from chaos_edge.dataplane.frames import (
    FORMAT_VERSION,
    HEADER,
    HEADER_SIZE,
    MAGIC,
    MAX_FRAME,
    MAX_PAYLOAD,
    FrameHeader,
    Kind,
    decode_header,
    encode_frame,
    encode_header,
    read_small_frame,
    recv_exact_into,
)

pytestmark = pytest.mark.timeout(60)


def test_header_round_trip() -> None:
    h = FrameHeader(Kind.REDUCE, 2**40, 7, 123_456_789, 99, 4096)
    raw = encode_header(h)
    assert len(raw) == HEADER_SIZE == 40
    assert decode_header(raw) == h
    assert h.tag == (7, 2**40)
    assert MAX_FRAME == HEADER_SIZE + MAX_PAYLOAD


@pytest.mark.parametrize(
    ("raw", "match"),
    [
        (HEADER.pack(b"XXXX", 1, 18, 0, 0, 0, 0, 0, 0), "magic"),
        (HEADER.pack(MAGIC, 9, 18, 0, 0, 0, 0, 0, 0), "version"),
        (HEADER.pack(MAGIC, FORMAT_VERSION, 250, 0, 0, 0, 0, 0, 0), "kind"),
        (HEADER.pack(MAGIC, FORMAT_VERSION, 18, 0, 0, 0, 0, 0, MAX_PAYLOAD + 1), "exceeds"),
        (b"short", "40 bytes"),
    ],
)
def test_malformed_headers_are_rejected(raw: bytes, match: str) -> None:
    with pytest.raises(FrameError, match=match):
        decode_header(raw)


def test_encode_refuses_out_of_range_fields() -> None:
    with pytest.raises(FrameError):
        encode_header(FrameHeader(Kind.BCAST, 0, 0, 0, 0, MAX_PAYLOAD + 1))
    with pytest.raises(FrameError):
        encode_header(FrameHeader(Kind.BCAST, -1, 0, 0, 0, 0))
    with pytest.raises(FrameError):
        encode_frame(FrameHeader(Kind.ABORT, 0, 0, 0, 0, 5), b"abc")


def test_payload_lands_in_the_given_buffer_and_eof_is_peer_gone() -> None:
    a, b = socket.socketpair()
    with a, b:
        a.sendall(b"0123456789")
        buf = bytearray(10)
        recv_exact_into(b, memoryview(buf))
        assert buf == b"0123456789"
        a.sendall(b"abc")
        a.shutdown(socket.SHUT_WR)
        with pytest.raises(PeerGone):
            recv_exact_into(b, memoryview(bytearray(10)))


def test_handshake_frames_are_limited_before_authentication() -> None:
    a, b = socket.socketpair()
    with a, b:
        a.sendall(struct.pack("!4sBBHQQQII", MAGIC, FORMAT_VERSION, 1, 0, 0, 0, 0, 0, 1 << 20))
        with pytest.raises(FrameError, match="exceeds"):
            read_small_frame(b)
