"""One entry point for bandwidth tests: iperf3 when installed, netprobe's bulk probe otherwise."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Literal

from netprobe import bulk, iperf
from netprobe.errors import IPERF3_INSTALL_HINT, IperfMissing
from netprobe.iperf_server import IperfServer
from netprobe.results import BandwidthResult

log = logging.getLogger(__name__)

ServerKind = Literal["iperf3", "bulk"]

# Binaries we already warned about: the warning is said once per process, not once per probe.
_warned_missing: set[str] = set()


class BandwidthProber:
    """Measures bandwidth with iperf3 when it is installed and with the bulk probe otherwise.

    Which tool a node uses is decided once, here, and advertised to peers as :attr:`kind`, since
    both ends must speak the same tool. When iperf3 is missing a warning with the install hint is
    logged once per process.

    Args:
        binary: The iperf3 executable to look for.
        exec_prefix: Prepended to iperf3's argv (e.g. ``ip netns exec NS``). The bulk fallback
            runs in this process, so it ignores the prefix.
        timeout_s: Default deadline of one test.
    """

    def __init__(
        self,
        *,
        binary: str = iperf.DEFAULT_BINARY,
        exec_prefix: Sequence[str] = (),
        timeout_s: float = 30.0,
    ) -> None:
        self.binary = binary
        self.exec_prefix = tuple(exec_prefix)
        self.timeout_s = timeout_s
        self.iperf3_path = iperf.find_iperf3(binary)
        if self.iperf3_path is None and binary not in _warned_missing:
            _warned_missing.add(binary)
            log.warning(
                "iperf3 (%r) not found; bandwidth probes use netprobe's built-in bulk probe, "
                "which reports no TCP RTT or retransmits. To use iperf3, %s",
                binary,
                IPERF3_INSTALL_HINT,
            )

    @property
    def kind(self) -> ServerKind:
        """The tool this node measures and serves with."""
        return "iperf3" if self.iperf3_path is not None else "bulk"

    def make_server(
        self, host: str = "0.0.0.0", port: int = 5201
    ) -> IperfServer | bulk.BulkProbeServer:
        """The server peers should probe this node through (not started yet).

        ``port=0`` is only allowed for the bulk server: iperf3 cannot pick a free port itself.
        """
        if self.kind == "iperf3":
            if port == 0:
                raise ValueError("iperf3 cannot bind port 0; choose a port")
            return IperfServer(host, port, binary=self.binary, exec_prefix=self.exec_prefix)
        return bulk.BulkProbeServer(host, port)

    async def measure(
        self,
        host: str,
        port: int,
        *,
        nbytes: int | None = None,
        duration_s: float | None = None,
        timeout_s: float | None = None,
        peer_kind: ServerKind | None = None,
        reverse: bool = False,
    ) -> BandwidthResult:
        """Run one test against a peer's probe server.

        Args:
            host: The peer's address.
            port: The port of the peer's probe server.
            nbytes: Bytes to send; mutually exclusive with ``duration_s``.
            duration_s: Seconds to send for.
            timeout_s: Deadline; defaults to the prober's.
            peer_kind: The tool the peer serves with (its :attr:`kind`); None assumes ours.
            reverse: Measure peer-to-us (iperf3 ``-R``). The bulk probe only measures
                us-to-peer, so it ignores this (a symmetric link is assumed).

        Raises:
            IperfMissing: The peer serves iperf3 but it is not installed here.
            NetprobeError: Any failure of the test itself.
        """
        timeout = self.timeout_s if timeout_s is None else timeout_s
        kind = peer_kind or self.kind
        if kind == "bulk":
            return await bulk.bulk_measure(
                host, port, nbytes=nbytes, duration_s=duration_s, timeout_s=timeout
            )
        if self.iperf3_path is None:
            raise IperfMissing(self.binary)
        return await iperf.measure(
            host,
            port,
            nbytes=nbytes,
            duration_s=duration_s,
            timeout_s=timeout,
            reverse=reverse,
            binary=self.iperf3_path,
            exec_prefix=self.exec_prefix,
        )
