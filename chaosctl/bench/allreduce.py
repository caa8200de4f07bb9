"""All-reduce throughput on loopback against a plain socket copy of the same bytes.

``chaosctl bench allreduce [--mb 100] [--nodes 4] [--repeats 5] [--chunk-kb 1024,4096]
[--result fresh,reuse] [--out DIR]``

A chain of ``--nodes`` processes all-reduces a ``--mb`` MB float32 gradient through
``daemon.dataplane`` (reduce to the chain's centre, then broadcast). The baseline copies the
same number of bytes from one process to another over one TCP connection, with the same socket
settings and receive-into-buffer path. Throughput is gradient bytes per wall-second of a round,
from the first node's start to the last node's finish; the ratio is all-reduce / copy (medians).

``--result fresh`` is the default API (every round returns a new buffer, whose pages the kernel
must zero); ``reuse`` passes the same ``out=`` buffer every round, as the copy's receiver does.
CPU seconds per round (all processes, ``time.process_time``) and CPU seconds per GB reduced are
reported too: on a small box the processes share the cores, so CPU is what bounds the wall
time, and the chain moves every byte over 2 * (nodes - 1) links where the copy moves it once.
Prints a table and writes ``DIR/allreduce_bench.json`` (with every run, to show the noise).
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import platform
import socket
import statistics
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import numpy as np

from chaosctl.client import CtlError

SECRET = b"bench"


def _cpu() -> float:
    return time.process_time()  # all threads of this process, ns resolution


def _copy_receiver(conn: Connection, nbytes: int, repeats: int, sock_buf: int) -> None:
    from daemon.dataplane.frames import recv_exact_into
    from daemon.dataplane.sockets import set_buffers

    lsock = socket.socket()
    set_buffers(lsock, sock_buf)
    lsock.bind(("127.0.0.1", 0))
    lsock.listen(1)
    conn.send(lsock.getsockname()[1])
    sock, _ = lsock.accept()
    buf = memoryview(np.empty(nbytes, np.uint8).data)
    for _ in range(repeats):
        c0 = _cpu()
        recv_exact_into(sock, buf)
        conn.send((time.perf_counter(), _cpu() - c0))
    sock.close()


def _copy_sender(conn: Connection, port: int, nbytes: int, repeats: int, sock_buf: int) -> None:
    from daemon.dataplane.sockets import set_buffers

    sock = socket.socket()
    set_buffers(sock, sock_buf)
    sock.connect(("127.0.0.1", port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    data = np.ones(nbytes, np.uint8)
    for _ in range(repeats):
        conn.recv()  # go
        c0 = _cpu()
        start = time.perf_counter()
        sock.sendall(memoryview(data.data))
        conn.send((start, _cpu() - c0))
    sock.close()


def bench_copy(nbytes: int, repeats: int, sock_buf: int) -> list[dict[str, float]]:
    """Time ``repeats`` one-way copies of ``nbytes`` between two processes."""
    ctx = mp.get_context("spawn")
    rx_parent, rx_child = ctx.Pipe()
    tx_parent, tx_child = ctx.Pipe()
    rx = ctx.Process(target=_copy_receiver, args=(rx_child, nbytes, repeats + 1, sock_buf))
    rx.start()
    port = rx_parent.recv()
    tx = ctx.Process(target=_copy_sender, args=(tx_child, port, nbytes, repeats + 1, sock_buf))
    tx.start()
    runs = []
    try:
        for _ in range(repeats + 1):  # the first run warms up
            tx_parent.send("go")
            start, tx_cpu = tx_parent.recv()
            end, rx_cpu = rx_parent.recv()
            runs.append({"seconds": end - start, "cpu_seconds": tx_cpu + rx_cpu})
    finally:
        for p in (tx, rx):
            p.join(10)
            if p.is_alive():
                p.kill()
    return runs[1:]


def _node(node: str, ids: list[str], conn: Connection, cfg: dict[str, Any]) -> None:
    from daemon.dataplane import AllReducer, LinkConfig, PeerLinks, SyncPolicy

    links = PeerLinks(
        node, "bench", SECRET, is_member=lambda p: True, config=LinkConfig(sock_buf=cfg["sock_buf"])
    )
    links.allow(*ids)  # before announcing the address, so a fast neighbour is not refused
    conn.send(links.start())
    i = ids.index(node)
    edges = [(ids[k], ids[k + 1]) for k in range(len(ids) - 1)]
    peers: dict[str, tuple[str, int]] = conn.recv()
    if i + 1 < len(ids):
        links.connect_to(ids[i + 1], *peers[ids[i + 1]])
    links.wait_connected([p for e in edges for p in e if node in e and p != node], 30)
    policy = SyncPolicy.build(1, ids, edges, ids[(len(ids) - 1) // 2])
    reducer = AllReducer(links, chunk_bytes=cfg["chunk_kb"] << 10, timeout=120)
    grad = np.full(cfg["nbytes"] // 4, i + 1, np.float32)
    out = np.empty_like(grad) if cfg["reuse"] else None
    expect = np.float32(sum(range(1, len(ids) + 1)) / len(ids))
    for step in range(cfg["repeats"] + 1):
        conn.recv()  # barrier via the parent
        c0 = _cpu()
        start = time.perf_counter()
        res = reducer.allreduce(grad, 1, step=step, policy=policy, out=out)
        end, cpu = time.perf_counter(), _cpu() - c0
        conn.send((start, end, cpu, bool(np.all(res.values == expect))))
        del res  # a fresh result is freed before the next round, as a trainer would
    conn.recv()
    links.close()


def bench_allreduce(
    nbytes: int, nodes: int, repeats: int, chunk_kb: int, sock_buf: int, reuse: bool
) -> list[dict[str, float]]:
    """Time ``repeats`` all-reduce rounds on a chain of ``nodes`` processes."""
    ctx = mp.get_context("spawn")
    ids = [f"n{k}" for k in range(nodes)]
    cfg = {"nbytes": nbytes, "repeats": repeats, "chunk_kb": chunk_kb, "sock_buf": sock_buf,
           "reuse": reuse}  # fmt: skip
    pipes: dict[str, Connection] = {}
    procs: list[Any] = []
    try:
        for node in ids:
            parent, child = ctx.Pipe()
            p = ctx.Process(target=_node, args=(node, ids, child, cfg))
            p.start()
            pipes[node], procs = parent, [*procs, p]
        addrs = {node: pipes[node].recv() for node in ids}
        for node in ids:
            pipes[node].send(addrs)
        runs = []
        for _ in range(repeats + 1):
            for node in ids:
                pipes[node].send("go")
            stats = [pipes[node].recv() for node in ids]
            if not all(s[3] for s in stats):
                raise CtlError("the all-reduce returned a wrong sum: a bug, not a slow box")
            runs.append(
                {
                    "seconds": max(s[1] for s in stats) - min(s[0] for s in stats),
                    "cpu_seconds": sum(s[2] for s in stats),
                }
            )
        for node in ids:
            pipes[node].send("stop")
        return runs[1:]
    finally:
        for p in procs:
            p.join(10)
            if p.is_alive():
                p.kill()


def _row(case: str, runs: list[dict[str, float]], nbytes: int, copy_s: float) -> dict[str, Any]:
    sec = statistics.median(r["seconds"] for r in runs)
    cpu = statistics.median(r["cpu_seconds"] for r in runs)
    return {
        "case": case,
        "seconds": sec,
        "min_seconds": min(r["seconds"] for r in runs),
        "throughput_MBps": nbytes / sec / 1e6,
        "cpu_seconds": cpu,
        "cpu_s_per_GB": cpu / (nbytes / 1e9),
        "ratio": copy_s / sec,
        "runs": runs,
    }


def run(mb: int, nodes: int, repeats: int, chunk_kbs: list[int], results: list[str],
        sock_buf: int, out: Path, say: Callable[[str], None]) -> dict[str, Any]:
    """The copy, then every (chunk size, result mode) all-reduce; writes and returns the JSON."""
    nbytes = mb * 1_000_000 // 4 * 4
    load_before = os.getloadavg()
    say(f"socket copy of {mb} MB, {repeats} repeats")
    copy = bench_copy(nbytes, repeats, sock_buf)
    copy_s = statistics.median(r["seconds"] for r in copy)
    rows = [_row("socket copy (2 procs)", copy, nbytes, copy_s)]
    for chunk_kb in chunk_kbs:
        for result in results:
            case = f"all-reduce chain x{nodes}, {chunk_kb} KiB, {result} out"
            say(case)
            runs = bench_allreduce(nbytes, nodes, repeats, chunk_kb, sock_buf, result == "reuse")
            rows.append(_row(case, runs, nbytes, copy_s))
    out.mkdir(parents=True, exist_ok=True)
    doc = {
        "mb": mb,
        "nodes": nodes,
        "repeats": repeats,
        "sock_buf": sock_buf,
        "cpus": os.cpu_count(),
        "machine": platform.platform(),
        "loadavg_before_after": [load_before, os.getloadavg()],
        "goal_ratio": 0.8,
        "rows": rows,
    }
    path = out / "allreduce_bench.json"
    path.write_text(json.dumps(doc, indent=2))
    say(f"wrote {path}")
    return doc


def table(rows: list[dict[str, Any]]) -> str:
    """The fixed-width table of the rows."""
    lines = [f"{'case':42} {'wall s':>7} {'min s':>7} {'MB/s':>7} {'CPU s':>6} "
             f"{'CPU s/GB':>8} {'ratio':>6}"]  # fmt: skip
    for row in rows:
        lines.append(
            f"{row['case']:42} {row['seconds']:7.3f} {row['min_seconds']:7.3f} "
            f"{row['throughput_MBps']:7.0f} {row['cpu_seconds']:6.3f} {row['cpu_s_per_GB']:8.2f} "
            f"{row['ratio']:6.2f}"
        )
    return "\n".join(lines)
