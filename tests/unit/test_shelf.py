"""The snapshot shelf over real sockets on 127.0.0.1: pushes, refusals, garbage, pruning.

The raw requests here compute their MACs from the wire description, not from the module's
helpers, so they check the protocol as documented.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import logging
import os
import socket
from pathlib import Path
from typing import Any

import pytest

from daemon.agent.shelf import Shelf, ShelfError, push_snapshot, shelf_key
from daemon.contracts.snapshots import snapshot_name

pytestmark = pytest.mark.timeout(30)

KEY = shelf_key("s3cret", "c1")
OTHER_KEY = shelf_key("wrong", "c1")


def make_snapshot(where: Path, step: int, cluster: str = "c1", header_step: int | None = None,
                  body: bytes | None = None, name: str | None = None) -> Path:
    """A snapshot file as the trainer writes one: a JSON header line, then the state."""
    header = {"format": "chaos-snapshot/1", "cluster": cluster,
              "step": step if header_step is None else header_step, "digest": "d" * 64,
              "manifest": {"version": step}}
    path = where / (name or snapshot_name(step))
    path.write_bytes(json.dumps(header, sort_keys=True).encode() + b"\n"
                     + (body if body is not None else os.urandom(3000) * 7))
    return path


async def started(directory: Path, key: bytes = KEY, keep: int = 3,
                  calls: list[tuple[str, int, bool]] | None = None) -> Shelf:
    def received(node: str, step: int, restore: bool) -> None:
        if calls is not None:
            calls.append((node, step, restore))

    shelf = Shelf(directory, key, "c1", keep, received=received)
    await shelf.start()
    return shelf


def stored(directory: Path) -> list[str]:
    """Every file in the keeper's directory (temporary ones included)."""
    return sorted(p.name for p in directory.iterdir()) if directory.is_dir() else []


async def settled(shelf: Shelf) -> None:
    """Wait until the keeper has finished with every connection."""
    while shelf._tasks:
        await asyncio.sleep(0.01)


def request(nonce_s: bytes, key: bytes, **fields: Any) -> bytes:
    nonce_c = os.urandom(32)
    req: dict[str, Any] = {"op": "put", "node": "tester", "nonce": nonce_c.hex(),
                           "name": snapshot_name(1), "size": 10, "sha256": "0" * 64, **fields}
    canon = json.dumps(req, sort_keys=True, separators=(",", ":")).encode()
    req["mac"] = hmac.new(key, b"client" + nonce_s + nonce_c + canon, hashlib.sha256).hexdigest()
    return json.dumps(req, sort_keys=True).encode() + b"\n"


async def handshake(port: int, key: bytes = KEY, **fields: Any
                    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter, dict[str, Any]]:
    """Open a connection, send a hand-made request, return the keeper's first reply."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    hello = await reader.readexactly(37)
    assert hello[:5] == b"CHSH\x01"
    writer.write(request(hello[5:], key, **fields))
    await writer.drain()
    return reader, writer, json.loads(await reader.readline())


async def test_push_lands_byte_identical_and_again_is_idempotent(tmp_path: Path) -> None:
    src, keeper = tmp_path / "src", tmp_path / "keeper"
    src.mkdir()
    snap = make_snapshot(src, 1200)
    calls: list[tuple[str, int, bool]] = []
    shelf = await started(keeper, calls=calls)
    try:
        sent = await push_snapshot(snap, "127.0.0.1", shelf.port, KEY, "box-a")
        assert sent == snap.stat().st_size
        assert stored(keeper) == [snap.name]
        assert (keeper / snap.name).read_bytes() == snap.read_bytes()
        assert calls == [("box-a", 1200, False)] and shelf.copies == 1
        before = (keeper / snap.name).stat().st_ino
        assert await push_snapshot(snap, "127.0.0.1", shelf.port, KEY, "box-b") == sent
        assert (keeper / snap.name).stat().st_ino == before  # not rewritten
        assert stored(keeper) == [snap.name]
        assert calls == [("box-a", 1200, False)] and shelf.copies == 1
        # Pushed again for a restore: kept as it is, but the box is told to restore it.
        await push_snapshot(snap, "127.0.0.1", shelf.port, KEY, "box-c", restore=True)
        assert calls[-1] == ("box-c", 1200, True) and shelf.copies == 1
    finally:
        await shelf.close()
        await shelf.close()  # idempotent


async def test_concurrent_pushes_all_land(tmp_path: Path) -> None:
    snaps = [make_snapshot(tmp_path, s, body=os.urandom(3 << 20)) for s in (10, 20, 30)]
    shelf = await started(tmp_path / "keeper")
    try:
        await asyncio.gather(*(push_snapshot(p, "127.0.0.1", shelf.port, KEY, f"n{i}")
                               for i, p in enumerate(snaps)))
        assert stored(tmp_path / "keeper") == [p.name for p in snaps]
        assert shelf.copies == 3
    finally:
        await shelf.close()


async def test_wrong_key_on_the_client_is_refused(tmp_path: Path) -> None:
    snap = make_snapshot(tmp_path, 5)
    shelf = await started(tmp_path / "keeper")
    try:
        with pytest.raises(ShelfError, match=r"refused .*MAC") as err:
            await push_snapshot(snap, "127.0.0.1", shelf.port, OTHER_KEY, "box-a")
        assert "\n" not in str(err.value)
        assert stored(tmp_path / "keeper") == [] and shelf.copies == 0
    finally:
        await shelf.close()


async def test_a_keeper_without_the_key_gets_no_snapshot_byte(tmp_path: Path) -> None:
    """An impostor that accepts anything but cannot prove the key sees the request only."""
    snap = make_snapshot(tmp_path, 5)
    after_reply: list[int] = []
    done = asyncio.Event()

    async def impostor(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonce_s = os.urandom(32)
        writer.write(b"CHSH\x01" + nonce_s)
        req = json.loads(await reader.readline())
        mac = hmac.new(OTHER_KEY, b"server" + nonce_s + bytes.fromhex(req["nonce"]),
                       hashlib.sha256).hexdigest()
        writer.write(json.dumps({"ok": True, "mac": mac}).encode() + b"\n")
        after_reply.append(len(await reader.read()))  # until the pusher hangs up
        writer.close()
        done.set()

    server = await asyncio.start_server(impostor, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        with pytest.raises(ShelfError, match="did not prove the cluster key"):
            await push_snapshot(snap, "127.0.0.1", port, KEY, "box-a")
        await done.wait()
        assert after_reply == [0]
    finally:
        server.close()
        await server.wait_closed()


@pytest.mark.parametrize(("cluster", "header_step", "why"), [
    ("other", None, "cluster 'other'"),
    ("c1", 7, "header says step 7"),
])
async def test_a_wrong_header_is_refused(tmp_path: Path, cluster: str, header_step: int | None,
                                         why: str) -> None:
    src, keeper = tmp_path / "src", tmp_path / "keeper"
    src.mkdir()
    snap = make_snapshot(src, 100, cluster=cluster, header_step=header_step)
    shelf = await started(keeper)
    try:
        with pytest.raises(ShelfError, match=why):
            await push_snapshot(snap, "127.0.0.1", shelf.port, KEY, "box-a")
        await settled(shelf)
        assert stored(keeper) == [] and shelf.copies == 0
    finally:
        await shelf.close()


async def test_a_pusher_that_hangs_up_mid_stream_leaves_nothing(tmp_path: Path) -> None:
    snap = make_snapshot(tmp_path, 100)
    data, keeper = snap.read_bytes(), tmp_path / "keeper"
    shelf = await started(keeper)
    try:
        _, writer, reply = await handshake(shelf.port, name=snap.name, size=len(data),
                                           sha256=hashlib.sha256(data).hexdigest())
        assert reply["ok"] is True
        writer.write(data[: len(data) // 2])
        await writer.drain()
        writer.close()
        await settled(shelf)
        assert stored(keeper) == []
        await push_snapshot(snap, "127.0.0.1", shelf.port, KEY, "box-a")
        assert stored(keeper) == [snap.name]
    finally:
        await shelf.close()


async def test_bytes_that_do_not_match_their_sha256_are_refused(tmp_path: Path) -> None:
    snap = make_snapshot(tmp_path, 100)
    data, keeper = snap.read_bytes(), tmp_path / "keeper"
    shelf = await started(keeper)
    try:
        reader, writer, reply = await handshake(shelf.port, name=snap.name, size=len(data),
                                                sha256=hashlib.sha256(b"other").hexdigest())
        assert reply["ok"] is True
        writer.write(data)
        reply = json.loads(await reader.readline())
        writer.close()
        assert reply["ok"] is False and "sha256" in reply["error"]
        await settled(shelf)
        assert stored(keeper) == []
    finally:
        await shelf.close()


async def test_close_cancels_a_push_in_flight(tmp_path: Path) -> None:
    snap = make_snapshot(tmp_path, 100)
    data, keeper = snap.read_bytes(), tmp_path / "keeper"
    shelf = await started(keeper)
    _, writer, _ = await handshake(shelf.port, name=snap.name, size=len(data),
                                   sha256=hashlib.sha256(data).hexdigest())
    writer.write(data[:100])
    await writer.drain()
    while not stored(keeper):  # the temporary file exists: the transfer is under way
        await asyncio.sleep(0.01)
    await shelf.close()
    assert stored(keeper) == []
    writer.close()


@pytest.mark.parametrize(("fields", "why"), [
    ({"name": "../x"}, "bad snapshot name"),
    ({"name": "snap-1.chaos"}, "bad snapshot name"),
    ({"name": "foo"}, "bad snapshot name"),
    ({"name": "../" + snapshot_name(1)}, "bad snapshot name"),
    ({"name": snapshot_name(1) + "\n"}, "bad snapshot name"),
    ({"size": 1 << 62}, "no room"),
    ({"size": 0}, "bad size"),
    ({"node": "a b"}, "bad node id"),
])
async def test_bad_requests_are_refused(tmp_path: Path, fields: dict[str, Any], why: str) -> None:
    shelf = await started(tmp_path / "keeper")
    try:
        _, writer, reply = await handshake(shelf.port, **fields)
        writer.close()
        assert reply["ok"] is False and why in reply["error"]
        assert "mac" not in reply
    finally:
        await shelf.close()
    assert stored(tmp_path / "keeper") == []


async def test_garbage_does_not_break_the_keeper(tmp_path: Path,
                                                 caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, "chaosd.shelf")
    snap = make_snapshot(tmp_path, 100)
    shelf = await started(tmp_path / "keeper")
    try:
        for junk in (os.urandom(5000), b"hi\n", b"[" * 4000 + b"\n", b"x" * 10_000 + b"\n", b""):
            reader, writer = await asyncio.open_connection("127.0.0.1", shelf.port)
            await reader.readexactly(37)
            writer.write(junk)
            writer.close()
        # a 10 KB line without a newline, held open while someone else pushes
        reader, held = await asyncio.open_connection("127.0.0.1", shelf.port)
        held.write(b"y" * 10_000)
        await held.drain()
        await push_snapshot(snap, "127.0.0.1", shelf.port, KEY, "box-a")
        held.close()
        assert stored(tmp_path / "keeper") == [snap.name]
        reader, writer = await asyncio.open_connection("127.0.0.1", shelf.port)
        await reader.readexactly(37)
        writer.write(b"not json\n")
        assert json.loads(await reader.readline()) == {"error": "malformed request", "ok": False}
        writer.close()
        await settled(shelf)
    finally:
        await shelf.close()
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]  # no surprise reached


async def test_keeps_the_newest(tmp_path: Path) -> None:
    src, keeper = tmp_path / "src", tmp_path / "keeper"
    src.mkdir()
    shelf = await started(keeper, keep=2)
    try:
        for step in (100, 200, 300):
            await push_snapshot(make_snapshot(src, step), "127.0.0.1", shelf.port, KEY, "a")
        assert stored(keeper) == [snapshot_name(200), snapshot_name(300)]
        # an older step than those kept is stored all the same (never the file just stored)
        await push_snapshot(make_snapshot(src, 50), "127.0.0.1", shelf.port, KEY, "a")
        assert stored(keeper) == [snapshot_name(50), snapshot_name(200), snapshot_name(300)]
    finally:
        await shelf.close()


async def test_push_failures_are_one_line(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # free once closed: nothing listens there
    snap = make_snapshot(tmp_path, 100)
    with pytest.raises(ShelfError, match="cannot reach the keeper") as err:
        await push_snapshot(snap, "127.0.0.1", port, KEY, "a")
    assert "\n" not in str(err.value)
    with pytest.raises(ShelfError, match="cannot read") as err:
        await push_snapshot(tmp_path / "missing.chaos", "127.0.0.1", port, KEY, "a")
    assert "\n" not in str(err.value)
