"""The netprobe exception family.

Every error raised on purpose by this package derives from :class:`NetprobeError`, so a caller
(the daemon, ``chaosctl``) catches one base class and prints ``str(exc)``: one line that says
what went wrong and what to do about it. A peer that stops answering is *not* an exception; the
RTT prober reports it as link state (see :mod:`netprobe.rtt`).
"""

from __future__ import annotations

IPERF3_INSTALL_HINT = "install it with `apt-get install iperf3` (or your distribution's package)"


class NetprobeError(Exception):
    """Base class of every error netprobe raises on purpose."""


class IperfError(NetprobeError):
    """An iperf3 test failed: the binary reported an error or produced unusable output."""


class IperfMissing(IperfError):
    """The iperf3 binary is not on PATH."""

    def __init__(self, binary: str) -> None:
        super().__init__(
            f"iperf3 binary {binary!r} not found on PATH; {IPERF3_INSTALL_HINT}, "
            "or use netprobe.BandwidthProber, which falls back to netprobe's own bulk probe"
        )
        self.binary = binary


class IperfBusy(IperfError):
    """The iperf3 server kept answering "busy running a test" until the deadline."""


class ProbeTimeout(NetprobeError):
    """A bandwidth test did not finish within its timeout (the child process was killed)."""


class BulkProbeError(NetprobeError):
    """The built-in bulk bandwidth probe failed (bad peer, short read, protocol mismatch)."""


class NetnsError(NetprobeError):
    """An ``ip`` / ``ip netns`` operation failed, or namespaces cannot be used here."""


class TcError(NetprobeError):
    """A ``tc`` operation failed, or the kernel lacks a queueing discipline we need."""
