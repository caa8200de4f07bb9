"""Bandwidth tests through the ``iperf3`` binary, driven as asyncio subprocesses.

We run the binary (``iperf3 --json`` on the client side) rather than a Python wrapper: it is what
every edge distribution packages, and a child process can always be killed when a link hangs.

An iperf3 server runs one test at a time and answers any other client with the JSON ``error``
"the server is busy running a test". :func:`measure` therefore serialises tests per
``(host, port)`` inside this process with an asyncio lock, and retries the busy answer (only that
one) with exponential backoff until its deadline, for clients on other nodes.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import shutil
import weakref
from collections.abc import Sequence
from typing import Any

from netprobe.errors import IperfBusy, IperfError, IperfMissing, ProbeTimeout
from netprobe.iperf_server import IperfServer
from netprobe.procs import die_with_parent
from netprobe.results import BandwidthResult

log = logging.getLogger(__name__)

__all__ = ["DEFAULT_BINARY", "IperfServer", "find_iperf3", "measure", "parse_iperf_json"]

DEFAULT_BINARY = "iperf3"
DEFAULT_DURATION_S = 2.0
_BUSY_MARKER = "busy"
_BACKOFF_FIRST_S = 0.1
_BACKOFF_MAX_S = 2.0
_MIN_ATTEMPT_S = 0.2  # a retry with less time than this left could not finish anyway

_locks: weakref.WeakKeyDictionary[
    asyncio.AbstractEventLoop, dict[tuple[str, int], asyncio.Lock]
] = weakref.WeakKeyDictionary()


def find_iperf3(binary: str = DEFAULT_BINARY) -> str | None:
    """Return the full path of the iperf3 binary, or None when it is not installed."""
    return shutil.which(binary)


def _server_lock(host: str, port: int) -> asyncio.Lock:
    # Keyed by loop too: an asyncio.Lock must not be shared between event loops.
    per_loop = _locks.setdefault(asyncio.get_running_loop(), {})
    return per_loop.setdefault((host, port), asyncio.Lock())


def parse_iperf_json(doc: dict[str, Any]) -> BandwidthResult:
    """Turn a successful ``iperf3 --json`` client report into a :class:`BandwidthResult`.

    Raises:
        IperfError: If the report carries an ``error`` or lacks the end-of-test summary.
    """
    if doc.get("error"):
        raise IperfError(f"iperf3 reported: {doc['error']}")
    end = doc.get("end") or {}
    received = end.get("sum_received") or end.get("sum") or {}
    sent = end.get("sum_sent") or {}
    if not received.get("bits_per_second") and sent.get("bits_per_second"):
        # In a byte-count test the receiver stops counting when the control connection's
        # TEST_END arrives; on a very fast path that can beat the data, leaving it with zero.
        # The sender's (optimistic) figure is then the only one there is.
        received = sent
    try:
        bps = float(received["bits_per_second"])
        seconds = float(received["seconds"])
        nbytes = int(sent.get("bytes", received["bytes"]))
    except (KeyError, TypeError, ValueError) as exc:
        raise IperfError(f"iperf3 JSON has no usable end.sum_received summary ({exc!r})") from None
    retransmits = sent.get("retransmits")
    rtts = [
        float(s["sender"]["mean_rtt"])
        for s in end.get("streams", [])
        if isinstance(s.get("sender"), dict) and "mean_rtt" in s["sender"]
    ]
    return BandwidthResult(
        bits_per_second=bps,
        bytes=nbytes,
        seconds=seconds,
        retransmits=int(retransmits) if retransmits is not None else None,
        # iperf3 reports mean_rtt in microseconds.
        mean_rtt_ms=sum(rtts) / len(rtts) / 1000.0 if rtts else None,
        tool="iperf3",
    )


async def _run_client(
    argv: Sequence[str], timeout_s: float, what: str, budget_s: float
) -> dict[str, Any]:
    proc = await asyncio.create_subprocess_exec(
        *argv,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        start_new_session=True,  # a Ctrl-C on the terminal is the daemon's to handle, not ours

        preexec_fn=die_with_parent,
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout=timeout_s)
    except asyncio.TimeoutError:
        raise ProbeTimeout(
            f"iperf3 test {what} did not finish within {budget_s:.1f}s and was killed; "
            "the link may be down or much slower than expected (raise timeout_s)"
        ) from None
    finally:
        # Covers the timeout and a cancellation alike: never leave the child running.
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    try:
        doc = json.loads(out.decode(errors="replace") or "null")
    except json.JSONDecodeError:
        doc = None
    if not isinstance(doc, dict):
        tail = (err or out).decode(errors="replace").strip().splitlines()[-1:] or ["no output"]
        raise IperfError(f"iperf3 test {what} produced no JSON report: {tail[0]}")
    return doc


async def measure(
    host: str,
    port: int = 5201,
    *,
    duration_s: float | None = None,
    nbytes: int | None = None,
    timeout_s: float = 30.0,
    reverse: bool = False,
    connect_timeout_s: float = 3.0,
    binary: str = DEFAULT_BINARY,
    exec_prefix: Sequence[str] = (),
) -> BandwidthResult:
    """Run one iperf3 TCP test against the server at ``host:port``.

    Args:
        host: The server's address.
        port: The server's port.
        duration_s: Test length in seconds (``-t``, whole seconds, at least 1). Mutually
            exclusive with ``nbytes``.
        nbytes: Bytes to send (``-n``). If neither is given, runs for 2 seconds.
        timeout_s: Deadline for the whole call, including waiting behind this process's other
            tests to the same server and busy retries.
        reverse: Measure server-to-client (``-R``) instead of client-to-server.
        connect_timeout_s: Timeout for setting up the control connection.
        binary: The iperf3 executable (name on PATH or path).
        exec_prefix: Command prepended to the client's argv, e.g.
            ``("ip", "netns", "exec", "ns1")`` to run it inside a network namespace.

    Returns:
        The receiver's view of the transfer.

    Raises:
        IperfMissing: The binary is not installed.
        IperfBusy: The server stayed busy with other tests until the deadline.
        ProbeTimeout: The test did not finish in time; the child was killed.
        IperfError: Any other iperf3 failure (refused connection, bad output, ...).
    """
    if duration_s is not None and nbytes is not None:
        raise ValueError("give duration_s or nbytes, not both")
    path = find_iperf3(binary)
    if path is None:
        raise IperfMissing(binary)
    what = f"to {host}:{port}"
    argv = [*exec_prefix, path, "-c", host, "-p", str(port), "--json"]
    argv += ["--connect-timeout", str(max(1, int(connect_timeout_s * 1000)))]
    if nbytes is not None:
        argv += ["-n", str(int(nbytes))]
    else:
        argv += ["-t", str(max(1, round(duration_s or DEFAULT_DURATION_S)))]
    if reverse:
        argv.append("-R")

    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    backoff = _BACKOFF_FIRST_S
    busy = IperfBusy(
        f"iperf3 server {host}:{port} was still busy with another test after {timeout_s:.1f}s; "
        "retry later or raise timeout_s"
    )
    lock = _server_lock(host, port)
    try:
        # Queueing behind this process's other tests to the same server uses the same budget.
        await asyncio.wait_for(lock.acquire(), timeout=timeout_s)
    except asyncio.TimeoutError:
        raise busy from None
    try:
        attempt = 0
        while True:
            remaining = deadline - loop.time()
            if attempt and remaining < _MIN_ATTEMPT_S:
                raise busy
            try:
                doc = await _run_client(argv, remaining, what, timeout_s)
            except ProbeTimeout:
                if attempt:  # we only ran short of time because the server was busy
                    raise busy from None
                raise
            attempt += 1
            error = str(doc.get("error") or "")
            if _BUSY_MARKER not in error:
                break
            # Jitter, so clients that collided do not retry in lock step.
            delay = random.uniform(0.5, 1.0) * min(backoff, max(0.0, deadline - loop.time()))
            log.debug("iperf3 server %s:%d busy; retrying in %.2fs", host, port, delay)
            await asyncio.sleep(delay)
            backoff = min(backoff * 2, _BACKOFF_MAX_S)
    finally:
        lock.release()
    if error:
        hint = ""
        if "unable to connect" in error:
            hint = "; is an iperf3 server (netprobe.IperfServer) listening there?"
        raise IperfError(f"iperf3 test {what} failed: {error}{hint}")
    return parse_iperf_json(doc)
