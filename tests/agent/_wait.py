"""Waiting, in an async test, for a real child process to get somewhere."""

from __future__ import annotations

import asyncio
from collections.abc import Callable


async def wait_for(pred: Callable[[], object], timeout: float = 15.0) -> None:
    """Poll ``pred`` until it is truthy; fail the test after ``timeout`` seconds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not pred():
        assert loop.time() < deadline, "timed out"
        await asyncio.sleep(0.02)
