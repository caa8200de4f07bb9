"""Network-namespace and veth helpers for testbeds, through the ``ip`` command.

Every name a testbed creates starts with one run prefix (see :func:`make_prefix`), e.g.
``chaos-3f9a-``. That is what makes :func:`cleanup` safe and complete: after a crash, it kills the
processes left in every namespace with the prefix, deletes those namespaces (which destroys the
veth ends inside them, and so their peers) and deletes any veth with the prefix left in the root
namespace. Nothing without the prefix is ever touched.

Linux limits interface names to 15 characters (IFNAMSIZ - 1); :func:`ifname` checks it.
All functions are synchronous: a testbed sets up and tears down in a few milliseconds per call.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from netprobe.errors import NetnsError

ROOT_PREFIX = "chaos-"
IFNAME_MAX = 15
_RUN_ID = re.compile(r"^[a-z0-9]{1,6}$")


def make_prefix(run_id: str | None = None) -> str:
    """Return a run prefix ``chaos-<run_id>-`` (4 random hex digits by default).

    Raises:
        ValueError: ``run_id`` is not 1-6 lowercase letters or digits.
    """
    run_id = run_id or secrets.token_hex(2)
    if not _RUN_ID.match(run_id):
        raise ValueError(f"run_id must be 1-6 lowercase letters or digits, got {run_id!r}")
    return f"{ROOT_PREFIX}{run_id}-"


def ifname(prefix: str, suffix: str) -> str:
    """Build an interface name ``prefix + suffix``, checking the kernel's 15-character limit."""
    name = prefix + suffix
    if len(name) > IFNAME_MAX:
        raise NetnsError(
            f"interface name {name!r} is {len(name)} characters; Linux allows {IFNAME_MAX}. "
            "Use a shorter run id or suffix"
        )
    return name


def netns_unavailable_reason() -> str | None:
    """Why namespaces cannot be used here, or None when they can (root, ``ip`` and ``ip netns``)."""
    if os.geteuid() != 0:
        return "network namespaces need root (CAP_NET_ADMIN); run as root or with sudo"
    if shutil.which("ip") is None:
        return "the `ip` command is missing; install iproute2 (`apt-get install iproute2`)"
    proc = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        return f"`ip netns` does not work here: {proc.stderr.strip() or 'unknown error'}"
    return None


def check_netns() -> None:
    """Raise :class:`NetnsError` with the reason when namespaces cannot be used here."""
    reason = netns_unavailable_reason()
    if reason is not None:
        raise NetnsError(reason)


def run_ip(*args: str, netns: str | None = None, check: bool = True) -> str:
    """Run ``ip [-n NETNS] ARGS...`` and return its stdout.

    Raises:
        NetnsError: The command failed (and ``check`` is True); the message quotes ip's stderr.
    """
    argv = ["ip", *(["-n", netns] if netns else []), *args]
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=30)
    except FileNotFoundError:
        raise NetnsError("the `ip` command is missing; install iproute2") from None
    if check and proc.returncode != 0:
        raise NetnsError(f"`{' '.join(argv)}` failed: {proc.stderr.strip() or 'no message'}")
    return proc.stdout


def list_netns(prefix: str = "") -> list[str]:
    """Names of the existing namespaces that start with ``prefix``."""
    names = [line.split()[0] for line in run_ip("netns", "list").splitlines() if line.strip()]
    return sorted(n for n in names if n.startswith(prefix))


def create_netns(name: str) -> None:
    """Create namespace ``name`` and bring its loopback up."""
    run_ip("netns", "add", name)
    run_ip("link", "set", "lo", "up", netns=name)


def netns_pids(name: str) -> list[int]:
    """PIDs of the processes running in namespace ``name``."""
    out = run_ip("netns", "pids", name, check=False)
    return [int(tok) for tok in out.split() if tok.isdigit()]


def kill_netns_processes(name: str, grace_s: float = 1.0) -> list[int]:
    """SIGTERM every process in ``name``, then SIGKILL what is left after ``grace_s``."""
    pids = netns_pids(name)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline and netns_pids(name):
            time.sleep(0.05)
        if not netns_pids(name):
            break
    return pids


def delete_netns(name: str) -> None:
    """Kill the processes in namespace ``name`` and delete it (a missing one is fine)."""
    if name not in list_netns(name):
        return
    kill_netns_processes(name)
    run_ip("netns", "delete", name)


def add_veth(
    name_a: str,
    netns_a: str | None,
    name_b: str,
    netns_b: str | None,
    *,
    addr_a: str | None = None,
    addr_b: str | None = None,
) -> None:
    """Create a veth pair with one end in each namespace, address the ends and bring them up.

    Args:
        name_a: Interface name of end A (at most 15 characters; see :func:`ifname`).
        netns_a: Namespace of end A (None: the root namespace).
        name_b: Interface name of end B.
        netns_b: Namespace of end B.
        addr_a: Address of end A in CIDR form (``10.77.0.1/24``), or None for no address
            (e.g. an end that joins a bridge).
        addr_b: Address of end B.
    """
    for name in (name_a, name_b):
        if len(name) > IFNAME_MAX:
            raise NetnsError(f"interface name {name!r} is longer than {IFNAME_MAX} characters")
    argv = ["link", "add", name_a, *(["netns", netns_a] if netns_a else [])]
    argv += ["type", "veth", "peer", "name", name_b, *(["netns", netns_b] if netns_b else [])]
    run_ip(*argv)
    for name, ns, addr in ((name_a, netns_a, addr_a), (name_b, netns_b, addr_b)):
        if addr:
            run_ip("addr", "add", addr, "dev", name, netns=ns)
        run_ip("link", "set", name, "up", netns=ns)


def add_bridge(netns: str | None, name: str) -> None:
    """Create a bridge ``name`` in ``netns`` and bring it up (a star hub for a testbed)."""
    run_ip("link", "add", name, "type", "bridge", netns=netns)
    run_ip("link", "set", name, "up", netns=netns)


def attach_to_bridge(netns: str | None, name: str, bridge: str) -> None:
    """Enslave interface ``name`` to ``bridge`` (both in ``netns``)."""
    run_ip("link", "set", name, "master", bridge, netns=netns)


def cut_link(netns: str | None, name: str) -> None:
    """Take interface ``name`` down: the link stops carrying traffic, addresses are kept."""
    run_ip("link", "set", "dev", name, "down", netns=netns)


def heal_link(netns: str | None, name: str) -> None:
    """Bring interface ``name`` back up after :func:`cut_link`."""
    run_ip("link", "set", "dev", name, "up", netns=netns)


def exec_prefix(netns: str) -> tuple[str, ...]:
    """The argv prefix that runs a command inside ``netns`` (for ``exec_prefix=`` arguments)."""
    return ("ip", "netns", "exec", netns)


def exec_in(
    netns: str,
    argv: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    **popen_kwargs: Any,
) -> subprocess.Popen[bytes]:
    """Start ``argv`` inside ``netns`` and return the Popen (the caller owns and reaps it).

    ``ip netns exec`` execs the command in place, so the Popen's pid is the command's own.
    """
    return subprocess.Popen(
        [*exec_prefix(netns), *argv], env=dict(env) if env is not None else None, **popen_kwargs
    )


def list_links(prefix: str, netns: str | None = None) -> list[str]:
    """Names of the interfaces in ``netns`` (root by default) that start with ``prefix``."""
    names = []
    for line in run_ip("-o", "link", "show", netns=netns).splitlines():
        parts = line.split(":", 2)
        if len(parts) >= 2:
            names.append(parts[1].strip().split("@")[0])
    return sorted(n for n in names if n.startswith(prefix))


def link_counters(netns: str | None, name: str) -> tuple[int, int]:
    """``(rx_bytes, tx_bytes)`` of interface ``name``, e.g. to measure what probes cost."""
    doc = json.loads(run_ip("-j", "-s", "link", "show", "dev", name, netns=netns))
    stats = doc[0]["stats64"]
    return int(stats["rx"]["bytes"]), int(stats["tx"]["bytes"])


@dataclass
class CleanupReport:
    """What :func:`cleanup` removed."""

    namespaces: list[str] = field(default_factory=list)
    links: list[str] = field(default_factory=list)
    killed_pids: list[int] = field(default_factory=list)


def cleanup(prefix: str) -> CleanupReport:
    """Remove every namespace and root-namespace link whose name starts with ``prefix``.

    Kills the processes inside those namespaces first (``ip netns pids``). Safe to call at any
    time, twice, or after a crash; it touches nothing without the prefix.

    Raises:
        ValueError: ``prefix`` is shorter than 4 characters (it would match too much).
    """
    if len(prefix) < 4:
        raise ValueError(f"refusing to clean up with the short prefix {prefix!r}")
    report = CleanupReport()
    for name in list_netns(prefix):
        report.killed_pids += kill_netns_processes(name)
        run_ip("netns", "delete", name, check=False)
        report.namespaces.append(name)
    for link in list_links(prefix):
        # Deleting one end of a veth deletes its peer too, so the peer may already be gone.
        run_ip("link", "delete", link, check=False)
        report.links.append(link)
    return report
