"""The clock seam of every daemon process: :mod:`netprobe.clock`, re-exported here."""

from netprobe.clock import Clock, FakeClock, SystemClock

__all__ = ["Clock", "FakeClock", "SystemClock"]
