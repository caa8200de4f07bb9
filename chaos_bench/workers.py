"""The worker harness: bench processes spoken to one JSON line at a time, and what the
benches' workers share.

The all-reduce bench (:mod:`chaos_bench.allreduce.worker`) and the netns scale-out bench
(:mod:`chaos_bench.scaleout.node`) run their measurements in processes of their own, started
with ``python -m MODULE`` (in a namespace, or not). The parent writes one line to a worker's
stdin (a command, or a JSON object) and reads one JSON line back from its stdout
(:class:`LineWorker`); the worker answers with :func:`answer`. A worker's stderr goes to a log
file, whose last line explains a worker that died. No worker outlives the bench: ``close``
asks it to quit and kills it if it does not.

The training workers that chaosd supervises write one JSON line per step (:func:`records`
reads them back), and workers in a network namespace count what its links sent
(:func:`tx_bytes`). The training benches on a netns testbed start their workers with
:func:`join_all` and follow them with :func:`max_step`.
"""

from __future__ import annotations

import contextlib
import functools
import gzip
import json
import select
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from chaosctl.client import CtlError

if TYPE_CHECKING:
    from chaosctl.testbed.core import Testbed

Popen = Callable[..., "subprocess.Popen[bytes]"]
JOIN_WAIT_S = 240.0  # a shared, loaded box has taken over 120 s for one join


def max_step(tb: Testbed) -> int:
    """The highest step any node of the testbed reports (0 before any)."""
    return max((int(r.get("step") or 0) for r in tb.query(tb.nodes[0], "nodes") or []),
               default=0)


def join_all(tb: Testbed, cmd: list[str], wait_s: float = JOIN_WAIT_S) -> None:
    """Join every node of the testbed with the training command ``cmd``, one at a time (the
    first bootstraps, the others join it), each waited for until it trains."""
    def member(node: str) -> bool:
        rows = tb.query(tb.nodes[0], "nodes") or []
        return any(r.get("id") == node and r.get("state") == "active" for r in rows)

    for node in tb.nodes:
        tb.join(node, cmd, timeout=10)
        tb.wait(functools.partial(member, node), wait_s, f"{node} to train")


def reap(proc: subprocess.Popen[bytes], grace_s: float = 3.0) -> None:
    """Kill ``proc`` if it still runs, and wait for it (bounded)."""
    if proc.poll() is None:
        proc.kill()
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=grace_s)


def records(path: Path) -> list[dict[str, Any]]:
    """The JSON lines a worker wrote to ``path`` (none if it wrote no file; ``.gz``: a kept
    copy); a line cut by a kill or a leave is skipped."""
    rows = []
    if path.exists():
        text = gzip.decompress(path.read_bytes()).decode() if path.suffix == ".gz" else \
            path.read_text()
        for line in text.splitlines():
            try:
                rows.append(json.loads(line))
            except ValueError:
                continue  # a line cut by kill or leave
    return rows


def tx_bytes(skip: Sequence[str] = ("lo",)) -> int:
    """Bytes sent by this network namespace's interfaces but ``skip`` (``/proc/net/dev`` is
    per namespace)."""
    total = 0
    with open("/proc/net/dev") as f:
        for line in f.readlines()[2:]:
            name, _, rest = line.partition(":")
            if name.strip().split("@")[0] not in skip:
                total += int(rest.split()[8])  # the first transmit column: bytes
    return total


def answer(doc: Any) -> None:
    """The worker's side: one JSON line to the bench."""
    sys.stdout.write(json.dumps(doc) + "\n")
    sys.stdout.flush()


class LineWorker:
    """``python -m module ARGV`` as a child of the bench, in a session of its own.

    ``popen`` starts it (``subprocess.Popen``, or a testbed node's ``exec``); ``prefix`` goes
    before the interpreter (``ip netns exec NS``); the other keyword arguments go to
    ``popen``.
    """

    def __init__(self, node: str, module: str, argv: Sequence[str], log: Path, *,
                 popen: Popen = subprocess.Popen, prefix: Sequence[str] = (),
                 **popen_kwargs: Any) -> None:
        self.node, self.log = node, log
        with open(log, "ab") as err:
            self.proc = popen([*prefix, sys.executable, "-m", module, *argv],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err,
                              start_new_session=True, **popen_kwargs)

    def send(self, msg: str | dict[str, Any]) -> None:
        """One line: a command as it is, or a JSON object."""
        assert self.proc.stdin is not None
        text = msg if isinstance(msg, str) else json.dumps(msg)
        self.proc.stdin.write(text.encode() + b"\n")
        self.proc.stdin.flush()

    def recv(self, timeout: float) -> Any:
        """The next JSON line.

        Raises:
            CtlError: No line within ``timeout``, or the worker ended (its log's last line).
        """
        out: IO[bytes] | None = self.proc.stdout
        assert out is not None
        ready, _, _ = select.select([out], [], [], timeout)
        line = out.readline() if ready else b""
        if not line:
            tail = self.log.read_text(errors="replace").strip().splitlines()[-1:] or ["no output"]
            raise CtlError(f"bench worker {self.node} died or hung: {tail[0]}")
        return json.loads(line)

    def ask(self, msg: str | dict[str, Any], timeout: float) -> Any:
        """Send one line and wait for the answer."""
        self.send(msg)
        return self.recv(timeout)

    def close(self, grace_s: float = 5.0) -> None:
        """Ask it to quit; kill it if it does not (never leaves a process behind)."""
        with contextlib.suppress(OSError, ValueError):
            self.send("quit")
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=grace_s)
        reap(self.proc, grace_s)
