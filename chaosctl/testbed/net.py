"""The testbed's network: namespaces, the management bridge, data links, routes and shaping.

Everything goes through :mod:`netprobe.netns` and :mod:`netprobe.tc`. Cut, heal and shape read
and change the kernel's state directly, so they work from any process (the CLI's ``cut`` runs
while ``up --foreground`` holds the testbed) without a second writer of the state file.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from chaosctl.testbed import topo as topo
from chaosctl.testbed.state import LinkRecord, TestbedError, TestbedState
from netprobe import netns, tc
from netprobe.errors import NetprobeError

BRIDGE = "br0"
MGMT_DEV = "mgmt"


def _hub_port(node: str) -> str:
    return f"m{topo.node_index(node)}"


def build(state: TestbedState) -> None:
    """Create the hub, every node namespace, the management bridge and the shaped data links.

    Raises:
        TestbedError: An ``ip``/``tc`` command failed (the message quotes it).
    """
    try:
        _build(state)
    except NetprobeError as exc:
        raise TestbedError(f"building the testbed failed: {exc}") from None


def _build(state: TestbedState) -> None:
    hub = state.hub_ns
    netns.create_netns(hub)
    netns.add_bridge(hub, BRIDGE)
    netns.run_ip("addr", "add", f"{topo.HUB_ADDR}/{topo.MGMT_PREFIXLEN}", "dev", BRIDGE,
                 netns=hub)
    for name, node in state.nodes.items():
        netns.create_netns(node.ns)
        netns.run_ip("addr", "add", f"{node.addr}/32", "dev", "lo", netns=node.ns)
        port = _hub_port(name)
        netns.add_veth(port, hub, MGMT_DEV, node.ns,
                       addr_b=f"{node.mgmt}/{topo.MGMT_PREFIXLEN}")
        netns.attach_to_bridge(hub, port, BRIDGE)
        # Isolated ports talk to the bridge (the broker) but never to each other, so the
        # management network cannot become a back door around a cut data link.
        netns.run_ip("link", "set", "dev", port, "type", "bridge_slave", "isolated", "on",
                     netns=hub)
    for rec in state.links:
        a, b = state.nodes[rec.a], state.nodes[rec.b]
        netns.add_veth(rec.dev_a, a.ns, rec.dev_b, b.ns)
        _routes(state, rec)
        shape(state, rec, rec.mbit)


def _routes(state: TestbedState, rec: LinkRecord) -> None:
    # One /32 per neighbour, sourced from the node's own data address: the link devices carry
    # no addresses, so the peer's address is reachable exactly while this link is up.
    a, b = state.nodes[rec.a], state.nodes[rec.b]
    for here, dev, there in ((a, rec.dev_a, b), (b, rec.dev_b, a)):
        netns.run_ip("route", "replace", f"{there.addr}/32", "dev", dev, "src", here.addr,
                     netns=here.ns)


def _ends(state: TestbedState, rec: LinkRecord) -> list[tuple[str, str]]:
    return [(state.nodes[rec.a].ns, rec.dev_a), (state.nodes[rec.b].ns, rec.dev_b)]


def shape(state: TestbedState, rec: LinkRecord, mbit: float) -> None:
    """Cap both directions of ``rec`` at ``mbit`` Mbit/s (each end's egress).

    Raises:
        TestbedError: ``mbit`` is not positive, or tc failed.
    """
    if mbit <= 0:
        raise TestbedError(f"a link's bandwidth must be positive, not {mbit:g} Mbit/s")
    try:
        for ns, dev in _ends(state, rec):
            if state.qdisc == "htb":
                tc.shape_htb(ns, dev, mbit * 1e6)
            else:
                tc.shape_tbf(ns, dev, mbit * 1e6)
    except NetprobeError as exc:
        raise TestbedError(f"shaping {rec.a}-{rec.b} failed: {exc}") from None


def set_up(state: TestbedState, rec: LinkRecord, up: bool) -> None:
    """Cut (``up=False``) or heal a data link by taking both ends down or up.

    A down device loses its routes, so a cut is immediate and visible (the peer's address
    becomes "network unreachable" on both sides) and healing puts the routes back.

    Raises:
        TestbedError: ``ip`` failed.
    """
    try:
        for ns, dev in _ends(state, rec):
            (netns.heal_link if up else netns.cut_link)(ns, dev)
        if up:
            _routes(state, rec)
    except NetprobeError as exc:
        raise TestbedError(f"{'healing' if up else 'cutting'} {rec.a}-{rec.b} failed: "
                           f"{exc}") from None


@dataclass(frozen=True)
class LinkInfo:
    """A data link as the kernel has it now."""

    a: str
    b: str
    up: bool
    mbit: float | None  # None: unshaped (or the namespace is gone)
    qdisc: str | None


_UNITS = {"bit": 1.0, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9, "tbit": 1e12}


def _bits(text: str) -> float:
    """``40Mbit`` -> 40e6 (tc's text output; decimal units)."""
    match = re.fullmatch(r"([\d.]+)([a-z]*)", text.lower())
    if not match or match.group(2) not in _UNITS:
        raise ValueError(f"unknown rate {text!r}")
    return float(match.group(1)) * _UNITS[match.group(2)]


def _rate_mbit(ns: str, dev: str) -> tuple[str | None, float | None]:
    doc = json.loads(tc.run_tc("-j", "qdisc", "show", "dev", dev, netns_name=ns) or "[]")
    for q in doc:
        if q.get("root") and q.get("kind") == "tbf":
            return "tbf", float(q["options"]["rate"]) * 8 / 1e6  # tc -j reports bytes/s
    for q in doc:
        if q.get("root") and q.get("kind") == "htb":
            # iproute2 6.1 prints no JSON for classes, so read the text: "class htb 1:10 ...
            # rate 40Mbit ceil ...".
            for line in tc.run_tc("class", "show", "dev", dev, netns_name=ns).splitlines():
                words = line.split()
                if words[:3] == ["class", "htb", "1:10"] and "rate" in words:
                    return "htb", _bits(words[words.index("rate") + 1]) / 1e6
            return "htb", None
    return (doc[0].get("kind") if doc else None), None


def _oper_up(ns: str, dev: str) -> bool:
    doc = json.loads(netns.run_ip("-j", "link", "show", "dev", dev, netns=ns))
    return "UP" in doc[0].get("flags", [])


def link_info(state: TestbedState, rec: LinkRecord) -> LinkInfo:
    """Read the link's state and rate from the kernel (both ends; the slower end's rate).

    Raises:
        TestbedError: The namespaces or devices are gone (the testbed was torn down).
    """
    try:
        ends = _ends(state, rec)
        rates = [_rate_mbit(ns, dev) for ns, dev in ends]
        up = all(_oper_up(ns, dev) for ns, dev in ends)
    except (NetprobeError, ValueError, IndexError, KeyError) as exc:
        raise TestbedError(f"cannot read link {rec.a}-{rec.b}: {exc} "
                           "(is the testbed still up?)") from None
    known = [m for _, m in rates if m is not None]
    return LinkInfo(rec.a, rec.b, up, min(known) if known else None, rates[0][0])
