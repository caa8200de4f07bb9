"""Measurement results shared by the iperf3 driver, the bulk fallback and the planner."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

Tool = Literal["iperf3", "bulk"]


@dataclass(frozen=True)
class BandwidthResult:
    """One bandwidth test.

    Attributes:
        bits_per_second: Throughput seen by the receiver (goodput), in bit/s.
        bytes: Payload bytes the sender put on the link: what the test cost.
        seconds: The receiver's timing window behind ``bits_per_second``. (With a byte-count
            test, iperf3's receiver may stop counting before the last bytes arrive, so this
            window can cover fewer than ``bytes``.)
        retransmits: TCP retransmissions on the sender (iperf3 only; None otherwise).
        mean_rtt_ms: The sender's mean TCP RTT in milliseconds, when the tool reports it.
        tool: Which tool measured it.
    """

    bits_per_second: float
    bytes: int
    seconds: float
    retransmits: int | None = None
    mean_rtt_ms: float | None = None
    tool: Tool = "iperf3"

    @property
    def mbps(self) -> float:
        """Throughput in Mbit/s (10**6 bit/s), the unit ``chaosctl links`` shows."""
        return self.bits_per_second / 1e6


@dataclass(frozen=True)
class LinkEstimate:
    """The two link parameters the scale-out planner needs.

    The time to push ``n`` bytes over the link is modelled as ``t_prop_s + n * t_trans_s_per_byte``.

    Attributes:
        t_prop_s: One-way propagation delay, estimated as RTT / 2.
        t_trans_s_per_byte: Transmission delay per byte, 8 / (bit/s).
    """

    t_prop_s: float
    t_trans_s_per_byte: float

    @classmethod
    def from_measurements(cls, rtt_s: float, bits_per_second: float) -> LinkEstimate:
        """Build an estimate from an RTT (seconds) and a throughput (bit/s).

        Raises:
            ValueError: If the RTT is negative or the throughput is not a positive number.
        """
        if rtt_s < 0 or math.isnan(rtt_s):
            raise ValueError(f"rtt_s must be >= 0, got {rtt_s}")
        if not bits_per_second > 0 or math.isinf(bits_per_second):
            raise ValueError(f"bits_per_second must be positive and finite, got {bits_per_second}")
        return cls(t_prop_s=rtt_s / 2.0, t_trans_s_per_byte=8.0 / bits_per_second)

    def transfer_time_s(self, nbytes: int) -> float:
        """Predicted time to deliver ``nbytes`` over this link."""
        return self.t_prop_s + nbytes * self.t_trans_s_per_byte
