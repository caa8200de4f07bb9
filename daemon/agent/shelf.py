"""The snapshot shelf: one box's chaosd pushes a snapshot file to another's, which keeps it.

A snapshot on one disk dies with that disk; pushed to k other boxes it survives k of them.
Only a push exists. One push per TCP connection, and both ends prove the cluster key
(:func:`shelf_key`) before a single snapshot byte moves::

    keeper -> pusher  "CHSH" | version u8 (1) | nonce_s (32 random bytes)
    pusher -> keeper  {"mac":..,"name":..,"node":..,"nonce":hex nonce_c,"op":"put",
                       "restore":bool,"sha256":..,"size":..}\\n  (one line, sorted keys, 4096
                       bytes at most; "restore": the copy is for the keeper's worker)
                      mac = HMAC(key, "client" | nonce_s | nonce_c | canonical JSON without mac)
    keeper -> pusher  {"ok":true,"mac":hex HMAC(key, "server" | nonce_s | nonce_c)}\\n
                      or {"ok":false,"error":"<one line>"}\\n, then it hangs up
    pusher -> keeper  exactly `size` bytes: the file, sent only once the keeper's mac verifies
    keeper -> pusher  {"ok":true}\\n or {"ok":false,"error":"<one line>"}\\n

Canonical JSON is sorted keys with "," and ":" separators. Both nonces are in both MACs, so
neither side's proof can be replayed onto another connection. (The final line is not MACed.)
The keeper refuses a bad MAC, node id or file name, and a size that would leave less than
``reserve_bytes`` free on its disk. It writes the bytes to a temporary file while hashing them,
checks the count, the sha256 and the snapshot header (format, our cluster, the step its name
says), then fsyncs, renames, fsyncs the directory and prunes to the ``keep`` newest, as the
trainer's own store does; a file already kept with the same sha256 is left as it is (ok, but
not counted in ``copies``). Every read on both ends has a timeout: a silent peer is dropped.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import json
import logging
import os
import re
import secrets
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from daemon.contracts.errors import ChaosError
from daemon.contracts.snapshots import snapshot_name, snapshot_step

log = logging.getLogger("chaosd.shelf")

LABEL = b"chaos snapshot-shelf v1"
MAGIC, VERSION = b"CHSH", 1
NONCE = 32
MAX_LINE = 4096
CHUNK = 1 << 20
FORMAT = "chaos-snapshot/1"  # chaos_edge.trainer.snapshots.FORMAT (daemon/ may not import it)
MAX_HEADER = 1 << 26
STALE_S = 3600.0  # a temporary file untouched this long belongs to a writer that died
_NODE = re.compile(r"[A-Za-z0-9._:@-]{1,64}")
_HEX64 = re.compile(r"[0-9a-f]{64}")


class ShelfError(ChaosError):
    """A push failed or was refused; the message is one line."""


def shelf_key(secret: str, cluster: str) -> bytes:
    """The shelf's HMAC key: its own label keeps it apart from the control plane's key."""
    return hmac.new(secret.encode(), LABEL + b"\x00" + cluster.encode(), hashlib.sha256).digest()


def _mac(key: bytes, *parts: bytes) -> bytes:
    return hmac.new(key, b"".join(parts), hashlib.sha256).digest()


def _canonical(doc: dict[str, Any]) -> bytes:
    return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()


def _line(doc: dict[str, Any]) -> bytes:
    return _canonical(doc) + b"\n"


def _short(value: object) -> str:
    return repr(value)[:60]  # a peer's value in one of our one-line messages, bounded


def _parse(line: bytes) -> dict[str, Any] | None:
    try:
        doc = json.loads(line)
    except (ValueError, RecursionError):  # RecursionError: "[[[[..." nested past the C limit
        return None
    return doc if isinstance(doc, dict) else None


async def _read_line(reader: asyncio.StreamReader, timeout_s: float) -> bytes:
    """One line of at most MAX_LINE bytes. Raises ShelfError (too long), asyncio.TimeoutError,
    or asyncio.IncompleteReadError (EOF first)."""
    try:
        line = await asyncio.wait_for(reader.readuntil(b"\n"), timeout_s)
    except asyncio.LimitOverrunError:
        raise ShelfError("line too long") from None
    if len(line) > MAX_LINE:
        raise ShelfError("line too long")
    return line


def _header_error(path: Path, cluster: str, step: int) -> str | None:
    """Why the snapshot at ``path`` is not one of ``cluster`` at ``step`` (None: it is)."""
    with open(path, "rb") as f:
        line = f.readline(MAX_HEADER + 1)
    doc = _parse(line) if line.endswith(b"\n") else None
    if doc is None or doc.get("format") != FORMAT:
        return f"not a {FORMAT} file"
    if doc.get("cluster") != cluster:
        return f"a snapshot of cluster {_short(doc.get('cluster'))}, not {cluster!r}"
    if type(doc.get("step")) is not int or doc["step"] != step:
        return f"its header says step {_short(doc.get('step'))}, its name {step}"
    return None


def _file_sha256(f: IO[bytes]) -> tuple[int, str]:
    """The size and sha256 of what is left of ``f``, read a chunk at a time."""
    h, size = hashlib.sha256(), 0
    while chunk := f.read(CHUNK):
        h.update(chunk)
        size += len(chunk)
    return size, h.hexdigest()


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class Shelf:
    """Receives pushed snapshots into ``directory`` (created on first write).

    Args:
        directory: Where snapshots are kept (normally the data dir's ``snapshots``).
        key: :func:`shelf_key` of the cluster.
        cluster: The cluster's name: a snapshot of another one is refused.
        keep: How many snapshots (newest steps) to keep after each one stored.
        host, port: Where to listen; port 0 picks a free one (read :attr:`port`).
        reserve_bytes: Free disk space a push must leave untouched.
        timeout_s: A peer silent this long is dropped.
        received: Called with (sender node, step, restore) for each snapshot stored, and for
            one already kept that was pushed again for a restore (``restore``: the pusher
            says the copy is for this box's worker to restore).
    """

    def __init__(self, directory: str | os.PathLike[str], key: bytes, cluster: str, keep: int,
                 host: str = "127.0.0.1", port: int = 0, *, reserve_bytes: int = 64 << 20,
                 timeout_s: float = 30.0,
                 received: Callable[[str, int, bool], None] = lambda sender, step, restore:
                 None) -> None:
        self.dir, self._key, self.cluster, self.keep = Path(directory), key, cluster, max(1, keep)
        self.host, self._want_port = host, port
        self.reserve_bytes, self.timeout_s, self._received = reserve_bytes, timeout_s, received
        self.copies = 0
        self._server: asyncio.Server | None = None
        self._port: int | None = None
        self._closed = False
        self._tasks: set[asyncio.Task[Any]] = set()
        self._inflight: set[Path] = set()  # our temporary files: never "stale" to the pruner

    @property
    def port(self) -> int:
        if self._port is None:
            raise RuntimeError("Shelf.port is only known after start()")
        return self._port

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._handle, self.host, self._want_port)
        self._port = self._server.sockets[0].getsockname()[1]

    async def close(self) -> None:
        """Stop listening, cancel the pushes in flight (their temporary files go) and wait."""
        self._closed = True
        server, self._server = self._server, None
        if server is not None:
            server.close()
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if server is not None:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(server.wait_closed(), 5.0)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._tasks.add(task)
        peer, node = writer.get_extra_info("peername"), "?"
        try:
            if self._closed:  # accepted just before close(): not served
                return
            nonce_s = secrets.token_bytes(NONCE)
            writer.write(MAGIC + bytes([VERSION]) + nonce_s)
            await asyncio.wait_for(writer.drain(), self.timeout_s)
            req = self._request(await _read_line(reader, self.timeout_s), nonce_s)
            node, name, size = req["node"], req["name"], req["size"]
            proof = _mac(self._key, b"server", nonce_s, bytes.fromhex(req["nonce"]))
            writer.write(_line({"ok": True, "mac": proof.hex()}))
            await asyncio.wait_for(writer.drain(), self.timeout_s)
            step = snapshot_step(Path(name))
            assert step is not None  # _request checked the name
            stored = await self._receive(reader, name, size, req["sha256"], step)
            writer.write(_line({"ok": True}))
            restore = req.get("restore") is True
            if stored:
                self.copies += 1
                log.info("stored %s from %s", name, node)
            if stored or restore:
                try:
                    self._received(node, step, restore)
                except Exception:  # the caller's bug must not lose the keeper
                    log.exception("received() callback failed")
            await asyncio.wait_for(writer.drain(), self.timeout_s)
        except ShelfError as exc:
            log.warning("refused a push from %s (node %s): %s", peer, node, exc)
            with contextlib.suppress(Exception):
                writer.write(_line({"ok": False, "error": str(exc)}))
                await asyncio.wait_for(writer.drain(), self.timeout_s)
        except (asyncio.TimeoutError, asyncio.IncompleteReadError, ConnectionError) as exc:
            log.debug("dropped %s (node %s): %s", peer, node, type(exc).__name__)
        except Exception:  # never let one connection's surprise reach the listener
            log.exception("push from %s failed", peer)
        finally:
            if task is not None:
                self._tasks.discard(task)
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    def _request(self, line: bytes, nonce_s: bytes) -> dict[str, Any]:
        """The verified request. Raises ShelfError (the reason, for the pusher)."""
        doc = _parse(line)
        if doc is None or doc.get("op") != "put":
            raise ShelfError("malformed request")
        mac = doc.pop("mac", None)
        nonce, node, name, size = (doc.get(k) for k in ("nonce", "node", "name", "size"))
        if not (isinstance(mac, str) and isinstance(nonce, str) and _HEX64.fullmatch(nonce)):
            raise ShelfError("malformed request")
        want = _mac(self._key, b"client", nonce_s, bytes.fromhex(nonce), _canonical(doc))
        if not hmac.compare_digest(mac.encode(), want.hex().encode()):
            raise ShelfError("the request's MAC does not verify: not this cluster's key")
        if not (isinstance(node, str) and _NODE.fullmatch(node)):
            raise ShelfError(f"bad node id {_short(node)}")
        step = snapshot_step(Path(name)) if isinstance(name, str) else None
        if step is None or name != snapshot_name(step):  # also refuses "../snap-…" and the like
            raise ShelfError(f"bad snapshot name {_short(name)}")
        if not isinstance(doc.get("sha256"), str) or not _HEX64.fullmatch(doc["sha256"]):
            raise ShelfError("bad sha256")
        if type(size) is not int or size <= 0:
            raise ShelfError(f"bad size {_short(size)}")
        try:
            room = self._free() - self.reserve_bytes
        except OSError as exc:
            raise ShelfError(f"cannot check free space: {exc.strerror or exc}") from None
        if size > room:
            raise ShelfError(f"no room: {size} bytes, {max(room, 0)} free past the reserve")
        return doc

    def _free(self) -> int:
        d = self.dir
        while not d.exists() and d.parent != d:  # not created yet: its filesystem is a parent's
            d = d.parent
        return shutil.disk_usage(d).free

    async def _receive(self, reader: asyncio.StreamReader, name: str, size: int, sha256: str,
                       step: int) -> bool:
        """Take ``size`` bytes into a temporary file, verify and store it; False: the same file
        was already here. Raises ShelfError (refused) or a connection error (peer gone)."""
        tmp = self.dir / f".{name}.{secrets.token_hex(6)}.tmp"
        self._inflight.add(tmp)
        f: IO[bytes] | None = None
        failed: str | None = None
        try:
            try:
                f = await asyncio.to_thread(self._open, tmp)
            except OSError as exc:
                failed = f"cannot store it: {exc.strerror or exc}"
            h, left = hashlib.sha256(), size
            while left:
                chunk = await asyncio.wait_for(reader.read(min(CHUNK, left)), self.timeout_s)
                if not chunk:
                    raise ConnectionError("the pusher hung up mid-stream")
                left -= len(chunk)
                try:
                    await asyncio.to_thread(self._absorb, f, h, chunk)
                except OSError as exc:  # keep reading, so the pusher gets the reason
                    failed = failed or f"cannot store it: {exc.strerror or exc}"
                    if f is not None:
                        with contextlib.suppress(OSError):
                            f.close()
                    f = None
            if failed:
                raise ShelfError(failed)
            if h.hexdigest() != sha256:
                raise ShelfError("the bytes received do not match their sha256")
            assert f is not None
            try:
                return await asyncio.to_thread(self._commit, f, tmp, name, sha256, step,
                                               frozenset(self._inflight))
            except OSError as exc:
                raise ShelfError(f"cannot store it: {exc.strerror or exc}") from None
        finally:
            self._inflight.discard(tmp)
            if f is not None:
                f.close()
            with contextlib.suppress(OSError):
                tmp.unlink()

    def _open(self, tmp: Path) -> IO[bytes]:
        self.dir.mkdir(parents=True, exist_ok=True)
        return open(tmp, "xb")

    @staticmethod
    def _absorb(f: IO[bytes] | None, h: Any, chunk: bytes) -> None:
        h.update(chunk)
        if f is not None:
            f.write(chunk)

    def _commit(self, f: IO[bytes], tmp: Path, name: str, sha256: str, step: int,
                inflight: frozenset[Path]) -> bool:
        f.flush()
        why = _header_error(tmp, self.cluster, step)
        if why is not None:
            raise ShelfError(why)
        final = self.dir / name
        with contextlib.suppress(OSError), open(final, "rb") as kept:
            if _file_sha256(kept)[1] == sha256:
                return False  # idempotent: already kept, nothing rewritten
        os.fsync(f.fileno())
        os.replace(tmp, final)
        _fsync_dir(self.dir)
        self._prune(final, inflight)
        return True

    def _prune(self, newest: Path, inflight: frozenset[Path]) -> None:
        """The ``keep`` newest steps stay (and ``newest`` always); temporary files of writers
        that died go, not those in flight (ours, or the trainer's own store writing now)."""
        now = time.time()
        for stale in self.dir.glob(".snap-*.tmp"):
            with contextlib.suppress(OSError):
                if stale not in inflight and now - stale.stat().st_mtime > STALE_S:
                    stale.unlink()
        steps = sorted(((s, p) for p in self.dir.iterdir()
                        if (s := snapshot_step(p)) is not None), reverse=True)
        for _, old in steps[self.keep:]:
            if old != newest:
                with contextlib.suppress(OSError):
                    old.unlink()


async def push_snapshot(path: str | os.PathLike[str], host: str, port: int, key: bytes, me: str,
                        timeout_s: float = 30.0, *, restore: bool = False) -> int:
    """Push the snapshot at ``path`` to the shelf at ``host:port``; the bytes sent. With
    ``restore``, the keeper's box restores it (see :class:`Shelf`'s ``received``).

    Raises:
        ShelfError: One line: the file is unreadable, the keeper is unreachable, refused it,
            did not prove the cluster key, went silent, or the connection was lost.
    """
    src = Path(path)
    try:  # one handle for the hash and the send: a file renamed over meanwhile cannot mix in
        f = await asyncio.to_thread(open, src, "rb")
    except OSError as exc:
        raise ShelfError(f"cannot read {src}: {exc.strerror or exc}") from None
    with f:
        try:
            size, sha256 = await asyncio.to_thread(_file_sha256, f)
            f.seek(0)
        except OSError as exc:
            raise ShelfError(f"cannot read {src}: {exc.strerror or exc}") from None
        return await _connect_and_push(f, src.name, host, port, size, sha256, key, me,
                                       timeout_s, restore)


async def _connect_and_push(f: IO[bytes], name: str, host: str, port: int, size: int,
                            sha256: str, key: bytes, me: str, timeout_s: float,
                            restore: bool) -> int:
    where = f"{host}:{port}"
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout_s)
    except (OSError, asyncio.TimeoutError) as exc:
        raise ShelfError(f"cannot reach the keeper at {where}: "
                         f"{getattr(exc, 'strerror', None) or exc or 'timed out'}") from None
    try:
        return await _push(reader, writer, f, name, where, size, sha256, key, me, timeout_s,
                           restore)
    except asyncio.TimeoutError:
        raise ShelfError(f"the keeper at {where} went silent for {timeout_s:g}s") from None
    except (asyncio.IncompleteReadError, ConnectionError):
        raise ShelfError(f"lost the connection to the keeper at {where}") from None
    except OSError as exc:
        raise ShelfError(f"push to {where} failed: {exc.strerror or exc}") from None
    finally:
        writer.close()
        with contextlib.suppress(Exception):
            await writer.wait_closed()


async def _push(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, f: IO[bytes],
                name: str, where: str, size: int, sha256: str, key: bytes, me: str,
                timeout_s: float, restore: bool) -> int:
    hello = await asyncio.wait_for(reader.readexactly(len(MAGIC) + 1 + NONCE), timeout_s)
    if hello[:len(MAGIC)] != MAGIC or hello[len(MAGIC)] != VERSION:
        raise ShelfError(f"the peer at {where} is not a snapshot shelf (v{VERSION})")
    nonce_s, nonce_c = hello[len(MAGIC) + 1:], secrets.token_bytes(NONCE)
    req = {"op": "put", "node": me, "nonce": nonce_c.hex(), "name": name, "size": size,
           "sha256": sha256, "restore": restore}
    mac = _mac(key, b"client", nonce_s, nonce_c, _canonical(req))
    writer.write(_line({**req, "mac": mac.hex()}))
    await asyncio.wait_for(writer.drain(), timeout_s)
    reply = await _reply(reader, where, timeout_s, name)
    proof = _mac(key, b"server", nonce_s, nonce_c).hex()
    if not (isinstance(reply.get("mac"), str)
            and hmac.compare_digest(reply["mac"].encode(), proof.encode())):
        raise ShelfError(f"the keeper at {where} did not prove the cluster key")
    sent = 0
    while sent < size:
        try:
            chunk = await asyncio.to_thread(f.read, min(CHUNK, size - sent))
        except OSError as exc:
            raise ShelfError(f"cannot read {name}: {exc.strerror or exc}") from None
        if not chunk:
            raise ShelfError(f"{name} shrank while it was being sent")
        writer.write(chunk)
        await asyncio.wait_for(writer.drain(), timeout_s)
        sent += len(chunk)
    await _reply(reader, where, timeout_s, name)
    return sent


async def _reply(reader: asyncio.StreamReader, where: str, timeout_s: float,
                 name: str) -> dict[str, Any]:
    """The keeper's next line, if it says ok. Raises ShelfError otherwise."""
    try:
        doc = _parse(await _read_line(reader, timeout_s))
    except ShelfError:
        doc = None
    if doc is None:
        raise ShelfError(f"the keeper at {where} sent a malformed reply")
    if doc.get("ok") is not True:
        why = " ".join(str(doc.get("error", "")).split())[:200] or "no reason given"
        raise ShelfError(f"the keeper at {where} refused {name}: {why}")
    return doc
