"""State transfer end to end on loopback: real server processes, a real torch model + Adam."""

from __future__ import annotations

import contextlib
import dataclasses
import multiprocessing as mp
import socket
import threading
from collections.abc import Callable, Iterator
from multiprocessing.connection import Connection
from typing import Any

import pytest
import torch

from chaos_edge.dataplane import auth
from chaos_edge.replication import Neighbor, PlanInput, make_plan
from chaos_edge.replication.manifest import Manifest
from chaos_edge.replication.state import StateSpace, state_digest
from chaos_edge.replication.transfer import (
    FetchOptions,
    Snapshot,
    StateServer,
    TransferError,
    VersionMismatchError,
    fetch,
    fetch_manifest,
    serve,
)

pytestmark = pytest.mark.timeout(120)

SECRET = b"replication-test-secret"
BLOCK = 1 << 16
CTX = mp.get_context("spawn")


def ident(node: str, secret: bytes = SECRET) -> auth.Identity:
    """Credentials of ``node`` in the test cluster."""
    return auth.Identity(node, "test", secret, auth.new_incarnation())


def make_model() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """A small MLP and its Adam optimizer (about 3 MiB of state after a step)."""
    torch.manual_seed(1)
    model = torch.nn.Sequential(
        torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 256)
    )
    return model, torch.optim.Adam(model.parameters(), lr=1e-3)


@pytest.fixture(scope="module")
def trained() -> tuple[torch.nn.Module, torch.optim.Optimizer, StateSpace]:
    """A model trained for two steps and its captured state (version 7)."""
    model, opt = make_model()
    for _ in range(2):
        model(torch.randn(16, 256)).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()
    state = StateSpace.capture(model, opt, {"step": 7, "epoch": 0}, block_size=BLOCK)
    return model, opt, state


def _server_main(
    node: str, manifest_json: str, data: bytes, rate: float | None, conn: Connection
) -> None:
    manifest = Manifest.from_json(manifest_json)
    server = serve(Snapshot.create(manifest, data), ident(node), rate=lambda _p: rate)
    conn.send(server.address)
    conn.recv()  # any message (or EOF) stops the server
    server.close()


@pytest.fixture
def processes() -> Iterator[Callable[..., tuple[Any, tuple[str, int]]]]:
    """Start state-server processes; every one is killed and joined, even if the test fails."""
    made: list[tuple[Any, Connection]] = []

    def start(
        node: str, state: StateSpace, rate: float | None = None
    ) -> tuple[Any, tuple[str, int]]:
        parent, child = CTX.Pipe()
        args = (node, state.manifest.to_json(), bytes(state.buffer), rate, child)
        proc = CTX.Process(target=_server_main, args=args, daemon=True)
        proc.start()
        made.append((proc, parent))
        if not parent.poll(60):
            raise RuntimeError(f"server {node} did not start")
        return proc, parent.recv()

    yield start
    for proc, parent in made:
        with contextlib.suppress(OSError):
            parent.send("stop")
        proc.join(3)
        if proc.is_alive():
            proc.kill()
            proc.join(3)


@pytest.fixture
def threads() -> Iterator[Callable[..., StateServer]]:
    """Start in-process state servers; all are closed at the end."""
    made: list[StateServer] = []

    def start(node: str, state: StateSpace, **options: Any) -> StateServer:
        server = serve(Snapshot.of(state), ident(node), **options)
        made.append(server)
        return server

    yield start
    for server in made:
        server.close()


def plan_for(manifest: Manifest, ids: list[str], planner: str = "chaos", rate: float = 1e6) -> Any:
    """A plan over ``ids``, all predicted to send at ``rate`` bytes/s."""
    neighbors = [Neighbor(i, 0.001, 1.0 / rate) for i in ids]
    inputs = PlanInput.create(neighbors, manifest.segments(), align_bytes=manifest.block_size)
    return make_plan(planner, inputs)


def restored_digest(manifest: Manifest, buffer: bytearray) -> str:
    """Load the fetched bytes into a fresh model and optimizer; their digest."""
    model, opt = make_model()
    StateSpace.restore(model, opt, manifest, buffer)
    return state_digest(model, opt)


def test_multi_neighbour_fetch_from_three_processes_restores_the_model(trained, processes) -> None:
    model, opt, state = trained
    addrs = {n: processes(n, state)[1] for n in ("n0", "n1", "n2")}
    me = ident("new")
    manifest = fetch_manifest(addrs["n1"], me, "n1", version=7)
    assert manifest == state.manifest
    seen: dict[str, int] = {}
    result = fetch(
        plan_for(manifest, list(addrs)),
        manifest,
        addrs,
        me,
        progress=lambda n, done, total: seen.__setitem__(n, done),
    )
    assert result.buffer == state.buffer
    assert restored_digest(manifest, result.buffer) == state_digest(model, opt)
    assert sum(t.bytes for t in result.sources.values()) == manifest.total_bytes
    assert all(t.bytes > 0 and t.failed is None for t in result.sources.values())
    assert seen == {n: t.assigned_bytes for n, t in result.sources.items()}
    assert result.replans == [] and result.refetched_blocks == []


def _flip_block(block: int, times: int | None) -> Callable[[str, int, memoryview], bytes]:
    """A mangle hook that corrupts one byte of ``block`` (the first ``times`` times)."""
    count = [0]

    def mangle(_peer: str, offset: int, view: memoryview) -> Any:
        target = block * BLOCK
        if not offset <= target < offset + len(view) or (times is not None and count[0] >= times):
            return view
        count[0] += 1
        data = bytearray(view)
        data[target - offset] ^= 0xFF
        return data

    return mangle


@pytest.mark.parametrize("times", [1, None], ids=["once", "always"])
def test_corrupt_block_is_detected_and_fetched_again(trained, threads, times) -> None:
    model, opt, state = trained
    manifest = state.manifest
    plan = plan_for(manifest, ["n0", "n1", "n2"], planner="waterfill")
    bad_owner = "n0"
    block = plan.ranges[bad_owner][0][0] // BLOCK + 1
    servers = {
        n: threads(n, state, mangle=_flip_block(block, times) if n == bad_owner else None)
        for n in ("n0", "n1", "n2")
    }
    addrs = {n: s.address for n, s in servers.items()}
    result = fetch(plan, manifest, addrs, ident("new"), options=FetchOptions(same_source_tries=2))
    assert result.buffer == state.buffer
    assert restored_digest(manifest, result.buffer) == state_digest(model, opt)
    # Once: one re-fetch from the same neighbour. Always: two from it, then another one.
    assert result.refetched_blocks == ([block] if times == 1 else [block] * 3)


def test_neighbour_killed_mid_transfer_is_replanned_onto_survivors(trained, processes) -> None:
    model, opt, state = trained
    slow, slow_addr = processes("n0", state, rate=256e3)  # its share takes seconds
    addrs = {"n0": slow_addr, "n1": processes("n1", state)[1], "n2": processes("n2", state)[1]}
    manifest = state.manifest
    plan = plan_for(manifest, list(addrs), planner="waterfill")
    killed = threading.Event()

    def progress(node: str, done: int, _total: int) -> None:
        if node == "n0" and done >= 2 * BLOCK and not killed.is_set():
            killed.set()
            slow.kill()

    result = fetch(
        plan, manifest, addrs, ident("new"), progress=progress, options=FetchOptions(io_timeout=5.0)
    )
    assert killed.is_set()
    assert result.sources["n0"].failed is not None
    assert 0 < result.sources["n0"].bytes < plan.bytes_of("n0")
    assert len(result.replans) == 1 and result.replans[0].meta["failed"] == "n0"
    assert result.buffer == state.buffer
    assert restored_digest(manifest, result.buffer) == state_digest(model, opt)


def test_version_mismatch_is_refused(trained, threads) -> None:
    _, _, state = trained
    server = threads("n0", state)
    with pytest.raises(VersionMismatchError, match="version 8 requested, this node serves 7"):
        fetch_manifest(server.address, ident("new"), "n0", version=8)
    stale = dataclasses.replace(state.manifest, version=8)
    with pytest.raises(VersionMismatchError):
        fetch(plan_for(stale, ["n0"]), stale, {"n0": server.address}, ident("new"))
    assert server.stats().bytes_sent == 0


def test_unauthenticated_clients_are_refused(trained, threads) -> None:
    _, _, state = trained
    server = threads("n0", state)
    with pytest.raises(TransferError, match="handshake"):
        fetch_manifest(server.address, ident("new", b"wrong-secret"), "n0")
    with socket.create_connection(server.address, timeout=5) as raw:
        raw.sendall(b"GET / HTTP/1.0\r\n\r\n" + bytes(64))
        raw.settimeout(5)
        # Closed without a byte of state (a reset when our garbage is left unread).
        with contextlib.suppress(ConnectionResetError):
            assert raw.recv(1 << 16) == b""
    for _ in range(50):
        if server.stats().refused == 2:
            break
        threading.Event().wait(0.05)
    assert server.stats().refused == 2 and server.stats().bytes_sent == 0
    with pytest.raises(TransferError, match="every source failed"):
        fetch(
            plan_for(state.manifest, ["n0"]),
            state.manifest,
            {"n0": server.address},
            ident("new", b"wrong-secret"),
        )
