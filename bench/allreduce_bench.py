"""All-reduce throughput on loopback against a plain socket copy of the same bytes.

    python bench/allreduce_bench.py --out DIR [--mb 100] [--nodes 4] [--chunk-kb 1024 ...]

A chain of ``--nodes`` processes all-reduces a ``--mb`` MB float32 gradient through
``daemon.dataplane`` (reduce to the chain's centre, then broadcast). The baseline copies the
same number of bytes from one process to another over one TCP connection, with the same socket
settings and receive-into-buffer path. Throughput is gradient bytes per wall-second of a round,
from the first node's start to the last node's finish; the ratio is all-reduce / copy. CPU
seconds per round are reported too, because on a small box the processes share the cores.
Prints a table and writes ``DIR/allreduce_bench.json``.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import platform
import socket
import statistics
import time
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import numpy as np

SECRET = b"bench"


def _cpu() -> float:
    t = os.times()
    return t.user + t.system


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
    for step in range(cfg["repeats"] + 1):
        conn.recv()  # barrier via the parent
        c0 = _cpu()
        start = time.perf_counter()
        res = reducer.allreduce(grad, 1, step=step, policy=policy)
        conn.send((start, time.perf_counter(), _cpu() - c0, float(res.values[0])))
    conn.recv()
    links.close()


def bench_allreduce(
    nbytes: int, nodes: int, repeats: int, chunk_kb: int, sock_buf: int
) -> list[dict[str, float]]:
    """Time ``repeats`` all-reduce rounds on a chain of ``nodes`` processes."""
    ctx = mp.get_context("spawn")
    ids = [f"n{k}" for k in range(nodes)]
    cfg = {"nbytes": nbytes, "repeats": repeats, "chunk_kb": chunk_kb, "sock_buf": sock_buf}
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
            expect = sum(range(1, nodes + 1)) / nodes
            assert all(s[3] == np.float32(expect) for s in stats), "wrong all-reduce result"
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


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--mb", type=int, default=100)
    ap.add_argument("--nodes", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--chunk-kb", type=int, nargs="+", default=[1024])
    ap.add_argument("--sock-buf", type=int, default=0, help="bytes; 0 = kernel autotuning")
    args = ap.parse_args()
    nbytes = args.mb * 1_000_000 // 4 * 4
    copy = bench_copy(nbytes, args.repeats, args.sock_buf)
    copy_s = statistics.median(r["seconds"] for r in copy)
    rows = [
        {
            "case": "socket copy (2 procs)",
            "seconds": copy_s,
            "cpu_seconds": statistics.median(r["cpu_seconds"] for r in copy),
            "ratio": 1.0,
        }
    ]
    for chunk_kb in args.chunk_kb:
        runs = bench_allreduce(nbytes, args.nodes, args.repeats, chunk_kb, args.sock_buf)
        sec = statistics.median(r["seconds"] for r in runs)
        rows.append(
            {
                "case": f"all-reduce chain x{args.nodes}, chunk {chunk_kb} KiB",
                "seconds": sec,
                "cpu_seconds": statistics.median(r["cpu_seconds"] for r in runs),
                "ratio": copy_s / sec,
            }
        )
    for row in rows:
        row["throughput_MBps"] = nbytes / row["seconds"] / 1e6
    print(f"{'case':42} {'wall s':>8} {'MB/s':>9} {'CPU s':>7} {'ratio':>6}")
    for row in rows:
        print(
            f"{row['case']:42} {row['seconds']:8.3f} {row['throughput_MBps']:9.1f} "
            f"{row['cpu_seconds']:7.2f} {row['ratio']:6.2f}"
        )
    args.out.mkdir(parents=True, exist_ok=True)
    doc = {
        "mb": args.mb,
        "nodes": args.nodes,
        "repeats": args.repeats,
        "sock_buf": args.sock_buf,
        "cpus": os.cpu_count(),
        "machine": platform.platform(),
        "goal_ratio": 0.8,
        "rows": rows,
    }
    (args.out / "allreduce_bench.json").write_text(json.dumps(doc, indent=2))


if __name__ == "__main__":
    main()
