"""netprobe: link measurement for Chaos. It imports nothing from ``daemon`` or ``chaosctl``.

Runs inside ``chaosd``, on the agent's asyncio loop (probe servers, probers, the iperf3
subprocess), and in the testbed tools; the clock seam of every process lives here, at the
bottom of the import order.

Where each public name lives:

- ``rtt.py``: :class:`RttResponder` (UDP echo), :class:`RttProber` (per-peer RTT, loss and
  link failure/recovery callbacks), :class:`RttPacket` (wire format).
- ``linkstate.py``: :class:`LinkTracker` (the prober's pure, clock-driven state machine),
  :class:`PeerStats`, :class:`LinkEvent`.
- ``clock.py``: :class:`Clock` (protocol), :class:`SystemClock`, :class:`FakeClock`.
- ``iperf.py``: :func:`measure` (one ``iperf3 --json`` client test, busy-retry, per-server lock),
  :func:`find_iperf3`, :func:`parse_iperf_json`.
- ``iperf_server.py``: :class:`IperfServer` (supervised ``iperf3 -s`` child).
- ``bulk.py``: :class:`BulkProbeServer`, :func:`bulk_measure` (fallback without iperf3).
- ``bandwidth.py``: :class:`BandwidthProber` (iperf3 if installed, else the bulk probe).
- ``periodic.py``: :class:`PeriodicBandwidthProbe`, :class:`LinkProbeStats`,
  :func:`probe_size`, :func:`expected_duty_cycle` (low-duty-cycle background probing).
- ``results.py``: :class:`BandwidthResult`, :class:`LinkEstimate` (t_prop, t_trans for the planner).
- ``netns.py``: network-namespace and veth helpers for testbeds, and :func:`cleanup`.
- ``tc.py``: tbf/htb shaping and qdisc capability checks (these kernels have no netem).
- ``errors.py``: :class:`NetprobeError` and its subclasses.
- ``__main__.py``: ``python -m netprobe rtt-serve|rtt-probe|bulk-serve``, to run probes inside
  a namespace (``ip netns exec NS python -m netprobe ...``), one JSON line per event.
"""

from netprobe.bandwidth import BandwidthProber, ServerKind
from netprobe.bulk import BulkProbeServer, bulk_measure
from netprobe.clock import Clock, FakeClock, SystemClock
from netprobe.errors import (
    BulkProbeError,
    IperfBusy,
    IperfError,
    IperfMissing,
    NetnsError,
    NetprobeError,
    ProbeTimeout,
    TcError,
)
from netprobe.iperf import find_iperf3, measure, parse_iperf_json
from netprobe.iperf_server import IperfServer
from netprobe.linkstate import LinkEvent, LinkTracker, PeerStats
from netprobe.periodic import (
    LinkProbeStats,
    PeriodicBandwidthProbe,
    expected_duty_cycle,
    probe_size,
)
from netprobe.results import BandwidthResult, LinkEstimate
from netprobe.rtt import RttPacket, RttProber, RttResponder

__all__ = [
    "BandwidthProber",
    "BandwidthResult",
    "BulkProbeError",
    "BulkProbeServer",
    "Clock",
    "FakeClock",
    "IperfBusy",
    "IperfError",
    "IperfMissing",
    "IperfServer",
    "LinkEstimate",
    "LinkEvent",
    "LinkProbeStats",
    "LinkTracker",
    "NetnsError",
    "NetprobeError",
    "PeerStats",
    "PeriodicBandwidthProbe",
    "ProbeTimeout",
    "RttPacket",
    "RttProber",
    "RttResponder",
    "ServerKind",
    "SystemClock",
    "TcError",
    "bulk_measure",
    "expected_duty_cycle",
    "find_iperf3",
    "measure",
    "parse_iperf_json",
    "probe_size",
]
