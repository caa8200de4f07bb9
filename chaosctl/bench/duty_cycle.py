"""Measure what periodic bandwidth probing costs a link, on real namespaces under tbf.

Two namespaces joined by a veth, shaped with tbf at each rate of the paper's 100-1000 Mbit/s
range. ``PeriodicBandwidthProbe`` with its production defaults (iperf3) probes the link a few
times while the veth's byte counters record everything on the wire: payload, TCP/IP headers,
ACKs and iperf3's control connection. Reported per rate:

- ``probe_nbytes`` / ``probe_mbps``: each probe's size (learned from the previous readings)
  and its bandwidth reading, to compare with the tbf rate;
- ``wire_bytes_per_probe``: the measured cost of one steady-state probe;
- ``duty_at_default_period``: that cost as a share of the link over one 60 s period.

Needs root. Usage: ``python bench/netprobe_duty_cycle.py [--gap 0.5] [--probes 5] [--json F]``
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from typing import Any

from netprobe import netns, tc
from netprobe.bandwidth import BandwidthProber
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
            sys.exit("this bench measures the iperf3 path; install iperf3 first")
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


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--gap", type=float, default=0.5, help="seconds between probes")
    parser.add_argument("--probes", type=int, default=5)
    parser.add_argument("--json", dest="json_out", help="also write the rows to this file")
    args = parser.parse_args()
    netns.check_netns()
    tc.require(["tbf"])
    rows = []
    for rate in RATES_MBPS:
        rows.append(await run_rate(netns.make_prefix(), rate, args.gap, args.probes))
    print(
        f"defaults: period {DEFAULT_PERIOD_S:.0f} s, target duty 0.1 %, probe floor "
        f"{DEFAULT_NBYTES} B; tbf-shaped veth, both directions"
    )
    print(
        "| link Mbit/s | probe sizes (B) | probe readings (Mbit/s) | wire B/probe (steady) "
        "| duty @ 60 s (wire) | duty (probe's own figure) |"
    )
    print("|---|---|---|---|---|---|")
    for r in rows:
        reported = r["duty_reported_by_probe"]
        own = "n/a" if reported is None else f"{reported:.4%}"
        print(
            f"| {r['rate_mbps']} | {r['probe_nbytes']} | {r['probe_mbps']} | "
            f"{r['wire_bytes_per_probe']} | {r['duty_at_default_period']:.4%} | {own} |"
        )
    if args.json_out:
        with open(args.json_out, "w") as fh:
            json.dump(rows, fh, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
