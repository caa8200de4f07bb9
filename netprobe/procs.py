"""Child-process hygiene: probe tools must not outlive the daemon that started them."""

from __future__ import annotations

import contextlib
import ctypes
import signal
import sys

_PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """``preexec_fn``: ask Linux to SIGTERM this child when its parent dies.

    A chaosd killed with -9 cannot stop its iperf3 server; without this the server would be
    orphaned (it runs in its own session, so a process-group kill misses it too).
    """
    if sys.platform.startswith("linux"):
        with contextlib.suppress(Exception):
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
