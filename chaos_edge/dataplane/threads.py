"""Threads a component starts and joins on close, instead of starting and forgetting them.

Every helper thread of the data plane, the state transfer and the Trainer goes through a
:class:`ThreadSet`, so ``close()`` can wait for them (bounded) and a test can see that none
is left behind.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable


class ThreadSet:
    """Daemon threads started on behalf of one owner, forgotten as each one ends."""

    def __init__(self) -> None:
        self._threads: set[threading.Thread] = set()
        self._lock = threading.Lock()

    def start(self, target: Callable[..., None], name: str, *args: object) -> threading.Thread:
        """Run ``target(*args)`` on a new daemon thread named ``name``."""
        def run() -> None:
            try:
                target(*args)
            finally:
                with self._lock:
                    self._threads.discard(threading.current_thread())

        t = threading.Thread(target=run, name=name, daemon=True)
        with self._lock:
            self._threads.add(t)
        t.start()
        return t

    def alive(self) -> list[threading.Thread]:
        """The threads still running."""
        with self._lock:
            return [t for t in self._threads if t.is_alive()]

    def join(self, timeout: float) -> list[str]:
        """Wait up to ``timeout`` seconds in all; return the names of those still running.

        The caller's own thread is skipped, so a thread of the set may close its owner.
        """
        deadline = time.monotonic() + timeout
        me = threading.current_thread()
        for t in self.alive():
            if t is not me:
                t.join(max(0.0, deadline - time.monotonic()))
        return sorted(t.name for t in self.alive() if t is not me)
