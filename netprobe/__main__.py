"""Small command-line entry points, mainly to run probes inside a network namespace.

A process cannot move its own asyncio sockets into another namespace, so testbeds start these
with ``ip netns exec NS python -m netprobe ...``. Each prints one JSON object per line:

- ``rtt-serve --host H --port P``: an RTT responder; prints ``{"event": "listening", "port": N}``.
- ``rtt-probe --peer NAME=HOST:PORT ...``: an RTT prober; prints ``listening``, then a
  ``failed`` / ``recovered`` line per link event, each with the peer's stats.
- ``bulk-serve --host H --port P``: a bulk probe server; prints ``listening``.

They run until SIGTERM or SIGINT.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import signal
import sys
from typing import Any

from netprobe.bulk import BulkProbeServer
from netprobe.linkstate import PeerStats
from netprobe.rtt import RttProber, RttResponder


def _emit(event: str, **fields: Any) -> None:
    print(json.dumps({"event": event, **fields}), flush=True)


def _peer(text: str) -> tuple[str, str, int]:
    name, _, addr = text.partition("=")
    host, _, port = addr.rpartition(":")
    if not name or not host or not port.isdigit():
        raise argparse.ArgumentTypeError(f"expected NAME=HOST:PORT, got {text!r}")
    return name, host, int(port)


async def _until_signalled() -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)  # the handler only sets a flag
    await stop.wait()


async def _rtt_serve(args: argparse.Namespace) -> None:
    async with RttResponder(args.host, args.port) as responder:
        _emit("listening", port=responder.port)
        await _until_signalled()


async def _rtt_probe(args: argparse.Namespace) -> None:
    def report(kind: str) -> Any:
        return lambda stats: _emit(kind, **_stats_json(stats))

    prober = RttProber(
        interval_s=args.interval,
        timeout_s=args.timeout,
        fail_after=args.fail_after,
        on_fail=report("failed"),
        on_recover=report("recovered"),
    )
    for name, host, port in args.peer:
        prober.add_peer(name, host, port)
    async with prober:
        _emit("listening", detection_bound_s=prober.detection_bound_s)
        await _until_signalled()


async def _bulk_serve(args: argparse.Namespace) -> None:
    async with BulkProbeServer(args.host, args.port) as server:
        _emit("listening", port=server.port)
        await _until_signalled()


def _stats_json(stats: PeerStats) -> dict[str, Any]:
    return dataclasses.asdict(stats)


def main(argv: list[str] | None = None) -> int:
    """Parse ``argv`` and run the chosen entry point until signalled; returns the exit code."""
    parser = argparse.ArgumentParser(prog="python -m netprobe", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    for cmd in ("rtt-serve", "bulk-serve"):
        p = sub.add_parser(cmd)
        p.add_argument("--host", default="0.0.0.0")
        p.add_argument("--port", type=int, default=0)
    p = sub.add_parser("rtt-probe")
    p.add_argument("--peer", type=_peer, action="append", required=True, help="NAME=HOST:PORT")
    p.add_argument("--interval", type=float, default=1.0)
    p.add_argument("--timeout", type=float, default=None)
    p.add_argument("--fail-after", type=int, default=3)
    args = parser.parse_args(argv)
    runner = {"rtt-serve": _rtt_serve, "rtt-probe": _rtt_probe, "bulk-serve": _bulk_serve}
    try:
        asyncio.run(runner[args.cmd](args))
    except OSError as exc:
        print(f"netprobe {args.cmd}: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
