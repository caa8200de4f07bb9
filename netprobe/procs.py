"""Child-process hygiene: probe tools must not outlive the daemon that started them."""

from __future__ import annotations

import contextlib
import ctypes
import signal
import sys

_PR_SET_PDEATHSIG = 1


def die_with_parent(sig: int = signal.SIGTERM) -> None:
    """``preexec_fn``: ask Linux to send ``sig`` to this child when its parent dies.

    A chaosd killed with -9 cannot stop its iperf3 server; without this the server would be
    orphaned (it runs in its own session, so a process-group kill misses it too).
    """
    if sys.platform.startswith("linux"):
        with contextlib.suppress(Exception):
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, sig)


def kill_with_parent() -> None:
    """``preexec_fn``: SIGKILL this child when its parent dies (for children that treat
    SIGTERM as a request to wind down gracefully, which needs the parent)."""
    die_with_parent(signal.SIGKILL)
