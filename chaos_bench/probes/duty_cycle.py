"""Measure what periodic bandwidth probing costs a link, on real namespaces under tbf.

Two namespaces joined by a veth, shaped with tbf at each rate of the paper's 100-1000 Mbit/s
range. ``PeriodicBandwidthProbe`` with its production defaults (iperf3) probes the link a few
times while the veth's byte counters record everything on the wire: payload, TCP/IP headers,
ACKs and iperf3's control connection. Reported per rate:

- ``probe_nbytes`` / ``probe_mbps``: each probe's size (learned from the previous readings)
  and its bandwidth reading, to compare with the tbf rate;
- ``wire_bytes_per_probe``: the measured cost of one steady-state probe;
- ``duty_at_default_period``: that cost as a share of the link over one 60 s period.

Needs root and iperf3. Usage: ``chaosctl bench duty-cycle [--rates 100,500,1000] [--gap 0.5]
[--probes 5] [--json F]``
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from chaos_bench.output import Output
from chaos_bench.progress import Say
from chaosctl.client import CtlError
from netprobe import netns, tc
from netprobe.bandwidth import BandwidthProber
from netprobe.errors import NetprobeError
from netprobe.periodic import DEFAULT_NBYTES, DEFAULT_PERIOD_S, PeriodicBandwidthProbe

RATES_MBPS = (100, 500, 1000)
PORT = 5201


async def run_rate(prefix: str, rate_mbps: int, gap_s: float, probes: int) -> dict[str, Any]:
    a, b = prefix + "a", prefix + "b"
    dev_a, dev_b = netns.ifname(prefix, "a0"), netns.ifname(prefix, "b0")
    netns.create_netns(a)
    netns.create_netns(b)
    try:
        netns.add_veth(dev_a, a, dev_b, b, addr_a="10.79.0.1/24", addr_b="10.79.0.2/24")
        capacity = rate_mbps * 1e6
        # Shape both directions: ACKs and the control connection flow back over b's end.
        tc.shape_tbf(a, dev_a, capacity)
        tc.shape_tbf(b, dev_b, capacity)
        client = BandwidthProber(exec_prefix=netns.exec_prefix(a))
        server_side = BandwidthProber(exec_prefix=netns.exec_prefix(b))
        if client.kind != "iperf3":
            raise CtlError("bench duty-cycle measures the iperf3 path: apt-get install iperf3")
        async with server_side.make_server("10.79.0.2", PORT):
            # The production defaults (60 s period, 0.1 % target), no capacity hint: the probe
            # learns the link. Probes run back to back (gap_s apart) instead of a minute apart;
            # the cost of one probe does not depend on the wait between probes.
            periodic = PeriodicBandwidthProbe(client)
            periodic.add_link("b", "10.79.0.2", PORT)
            rows = []
            for _ in range(probes):
                nbytes = periodic.stats("b").next_nbytes
                before = sum(netns.link_counters(a, dev_a))
                result = await periodic.probe_once("b")
                wire = sum(netns.link_counters(a, dev_a)) - before
                rows.append((nbytes, wire, result.mbps if result else None))
                await asyncio.sleep(gap_s)
        steady = rows[1:] or rows  # the first probe has no estimate yet and uses the floor
        wire_per_probe = sum(w for _, w, _ in steady) / len(steady)
        stats = periodic.stats("b")
        return {
            "rate_mbps": rate_mbps,
            "period_s": DEFAULT_PERIOD_S,
            "probes": stats.probes,
            "failures": stats.failures,
            "probe_nbytes": [n for n, _, _ in rows],
            "probe_mbps": [round(m, 1) if m else None for _, _, m in rows],
            "wire_bytes_per_probe": round(wire_per_probe),
            "duty_at_default_period": wire_per_probe * 8 / (capacity * DEFAULT_PERIOD_S),
            "duty_reported_by_probe": stats.duty_cycle,
        }
    finally:
        netns.cleanup(prefix)


def run(rates: list[int], gap_s: float, probes: int, json_out: Path | None,
        say: Say) -> list[dict[str, Any]]:
    """Every rate in turn on fresh namespaces; the rows (also written to ``json_out``).

    Raises:
        CtlError: Not root, no ``ip netns`` or tbf, no iperf3, or a probe step failed.
    """
    reason = netns.netns_unavailable_reason()
    if reason is not None:
        raise CtlError(f"bench duty-cycle needs network namespaces: {reason}")
    rows = []
    try:
        tc.require(["tbf"])
        for rate in rates:
            say(f"{rate} Mbit/s: {probes} probes, {gap_s} s apart")
            rows.append(asyncio.run(run_rate(netns.make_prefix(), rate, gap_s, probes)))
    except NetprobeError as exc:
        raise CtlError(f"bench duty-cycle: {exc}") from None
    if json_out is not None:
        Output(json_out.parent, say).json(json_out.name, rows)
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    """The defaults line and the markdown table."""
    lines = [
        f"defaults: period {DEFAULT_PERIOD_S:.0f} s, target duty 0.1 %, probe floor "
        f"{DEFAULT_NBYTES} B; tbf-shaped veth, both directions",
        "| link Mbit/s | probe sizes (B) | probe readings (Mbit/s) | wire B/probe (steady) "
        "| duty @ 60 s (wire) | duty (probe's own figure) |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        reported = r["duty_reported_by_probe"]
        own = "n/a" if reported is None else f"{reported:.4%}"
        lines.append(
            f"| {r['rate_mbps']} | {r['probe_nbytes']} | {r['probe_mbps']} | "
            f"{r['wire_bytes_per_probe']} | {r['duty_at_default_period']:.4%} | {own} |"
        )
    return "\n".join(lines)
