"""Polling with a deadline, shared by the local cluster, the testbed and the benches."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

from chaosctl.client import CtlError

T = TypeVar("T")


def wait_for(pred: Callable[[], T | None], timeout: float, what: str, every: float,
             error: type[CtlError]) -> T:
    """Poll ``pred`` until it returns something truthy; raise ``error`` naming ``what``."""
    deadline = time.monotonic() + timeout
    while True:
        value = pred()
        if value:
            return value
        if time.monotonic() > deadline:
            raise error(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(every)
