"""What ``chaosctl testbed up`` and ``status`` print: a snapshot of nodes and links, as tables
or JSON. Every value is read live (each chaosd over its socket, links from the kernel)."""

from __future__ import annotations

from typing import Any

import psutil
from rich.console import Group
from rich.table import Table

from chaosctl.testbed import net as net
from chaosctl.testbed.core import Testbed
from chaosctl.testbed.state import TestbedError

QUERY_TIMEOUT_S = 0.5  # a live view must not stall on one frozen daemon


def snapshot(tb: Testbed, live: bool = True) -> dict[str, Any]:
    """The testbed as one JSON-able dict (stable keys: ``dir``, ``prefix``, ``broker``,
    ``topology``, ``seed``, ``bw_mbit``, ``redraw_period_s``, ``nodes``, ``links``).

    Args:
        tb: The testbed.
        live: Ask each chaosd and the kernel (False: only what the plan says).
    """
    st = tb.state
    nodes = []
    for name, rec in st.nodes.items():
        row: dict[str, Any] = {"node": name, "netns": rec.ns, "addr": rec.addr,
                               "neighbors": tb.neighbours(name), "socket": rec.socket,
                               "log": rec.log}
        if live:
            status = tb.query(name, "status", timeout=QUERY_TIMEOUT_S)
            row["chaosd_pid"] = _alive_pid(tb, name)
            row["scheduler"] = (status.get("scheduler") or {}).get("id") if status else None
            row["view"] = status.get("nodes") if status else None
        nodes.append(row)
    links = []
    for ln in st.links:
        row = {"a": ln.a, "b": ln.b, "dev_a": ln.dev_a, "dev_b": ln.dev_b,
               "planned_mbit": ln.mbit}
        if live:
            try:
                info = net.link_info(st, ln)
                row.update(state="up" if info.up else "cut", mbit=info.mbit, qdisc=info.qdisc)
            except TestbedError:
                row.update(state="gone", mbit=None, qdisc=None)
        links.append(row)
    return {"dir": st.dir, "prefix": st.prefix, "broker": st.broker, "topology": st.topology,
            "seed": st.seed, "bw_mbit": list(st.bw), "redraw_period_s": st.redraw_period_s,
            "nodes": nodes, "links": links}


def _alive_pid(tb: Testbed, name: str) -> int | None:
    for rec in tb.state.procs:
        if rec.name == name:
            try:
                proc = psutil.Process(rec.pid)
                if (abs(proc.create_time() - rec.create_time) < 0.05
                        and proc.status() != psutil.STATUS_ZOMBIE):
                    return rec.pid
            except psutil.Error:
                return None
    return None


def render(snap: dict[str, Any]) -> Group:
    """Two tables, nodes and links, from a :func:`snapshot`."""
    nodes = Table(title=f"testbed {snap['prefix']} ({snap['topology']}, seed {snap['seed']}, "
                        f"broker {snap['broker']} in the hub)")
    for col in ("node", "addr", "neighbours", "chaosd", "scheduler", "view", "socket"):
        nodes.add_column(col)
    for n in snap["nodes"]:
        pid = n.get("chaosd_pid")
        view = n.get("view")
        nodes.add_row(
            n["node"], n["addr"], ",".join(n["neighbors"]) or "-",
            f"pid {pid}" if pid else ("[red]down[/]" if "chaosd_pid" in n else "?"),
            n.get("scheduler") or "-",
            " ".join(f"{k}={v}" for k, v in sorted(view.items())) if view else "-",
            n["socket"])
    redraw = snap["redraw_period_s"]
    links = Table(title=f"data links (bandwidth {snap['bw_mbit'][0]:g}-{snap['bw_mbit'][1]:g}"
                        f" Mbit/s{f', redrawn every {redraw:g}s' if redraw else ''})")
    for col in ("link", "state", "Mbit/s", "devices"):
        links.add_column(col, justify="right" if col == "Mbit/s" else "left")
    for ln in snap["links"]:
        state = ln.get("state", "planned")
        mbit = ln.get("mbit", ln["planned_mbit"])
        links.add_row(f"{ln['a']}-{ln['b']}",
                      {"up": "[green]up[/]", "cut": "[red]cut[/]"}.get(state, state),
                      f"{mbit:g}" if mbit is not None else "-",
                      f"{ln['a']}:{ln['dev_a']} {ln['b']}:{ln['dev_b']}")
    return Group(nodes, links)
