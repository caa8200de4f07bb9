"""sd_notify(3) for Type=notify units: READY, STATUS, STOPPING and the watchdog.

The protocol is one datagram to ``$NOTIFY_SOCKET``; it is small enough that a dependency
would cost more than it saves. Outside systemd every call is a no-op.
"""

from __future__ import annotations

import contextlib
import os
import socket


class Notifier:
    def __init__(self) -> None:
        addr = os.environ.get("NOTIFY_SOCKET", "")
        # A leading '@' names an abstract socket.
        self._addr = "\0" + addr[1:] if addr.startswith("@") else addr
        usec = os.environ.get("WATCHDOG_USEC", "")
        pid = os.environ.get("WATCHDOG_PID", "")
        mine = not pid or pid == str(os.getpid())
        self.watchdog_interval_s = int(usec) / 2e6 if usec.isdigit() and mine else None

    @property
    def enabled(self) -> bool:
        return bool(self._addr)

    def notify(self, state: str) -> None:
        if not self._addr:
            return
        # systemd gone or its socket unreachable: there is nothing useful to do about it.
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock, \
                contextlib.suppress(OSError):
            sock.sendto(state.encode(), self._addr)

    def ready(self, status: str = "") -> None:
        self.notify("READY=1" + (f"\nSTATUS={status}" if status else ""))

    def status(self, status: str) -> None:
        self.notify(f"STATUS={status}")

    def watchdog(self) -> None:
        self.notify("WATCHDOG=1")

    def stopping(self) -> None:
        self.notify("STOPPING=1")
