"""Link shaping for testbeds with ``tc``: tbf or htb rate limits, and capability checks.

The kernels Chaos targets have ``tbf`` and ``htb`` but no ``netem``, so bandwidth can be shaped
here, but delay, jitter and loss cannot be emulated with tc. :func:`emulate_delay_loss` uses netem
where the kernel has it and otherwise refuses with :data:`NETEM_MISSING`, which says what to do
instead. :func:`probe_qdisc_support` finds out, once per process, in a throwaway namespace, so it
never disturbs a real interface.

Shaping applies to a device's egress: to cap both directions of a veth link, shape both ends.
"""

from __future__ import annotations

import secrets
import shutil
import subprocess
from collections.abc import Iterable
from typing import Literal

from netprobe import netns
from netprobe.errors import NetnsError, TcError

QdiscKind = Literal["tbf", "htb", "netem"]
QDISC_KINDS: tuple[QdiscKind, ...] = ("tbf", "htb", "netem")

NETEM_MISSING = (
    "this kernel has no netem qdisc (sch_netem), so delay, jitter and loss cannot be emulated "
    "with tc; shape bandwidth with tbf/htb and add delay or loss in user space (a delaying "
    "proxy), or skip those scenarios"
)
_TRIAL_ARGS: dict[QdiscKind, tuple[str, ...]] = {
    "tbf": ("tbf", "rate", "1mbit", "burst", "32kbit", "latency", "50ms"),
    "htb": ("htb", "default", "10"),
    "netem": ("netem", "delay", "1ms"),
}
_support_cache: dict[QdiscKind, bool] = {}


def run_tc(*args: str, netns_name: str | None = None, check: bool = True) -> str:
    """Run ``tc [-n NETNS] ARGS...`` and return stdout.

    Raises:
        TcError: tc is missing, or the command failed and ``check`` is True.
    """
    argv = ["tc", *(["-n", netns_name] if netns_name else []), *args]
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=30)
    except FileNotFoundError:
        raise TcError("the `tc` command is missing; install iproute2") from None
    if check and proc.returncode != 0:
        raise TcError(f"`{' '.join(argv)}` failed: {proc.stderr.strip() or 'no message'}")
    return proc.stdout


def probe_qdisc_support(kinds: Iterable[QdiscKind] = QDISC_KINDS) -> dict[QdiscKind, bool]:
    """Whether the kernel accepts each qdisc kind, tried on ``lo`` of a throwaway namespace.

    Raises:
        TcError: The check itself cannot run (not root, no ``ip``/``tc``).
    """
    wanted = [k for k in kinds if k not in _support_cache]
    if wanted:
        reason = netns.netns_unavailable_reason()
        if reason is None and shutil.which("tc") is None:
            reason = "the `tc` command is missing; install iproute2"
        if reason is not None:
            raise TcError(f"cannot check qdisc support: {reason}")
        scratch = f"{netns.ROOT_PREFIX}qchk-{secrets.token_hex(3)}"
        try:
            netns.create_netns(scratch)
            for kind in wanted:
                trial = ("qdisc", "add", "dev", "lo", "root", *_TRIAL_ARGS[kind])
                run_tc(*trial, netns_name=scratch, check=False)
                shown = run_tc("qdisc", "show", "dev", "lo", netns_name=scratch)
                _support_cache[kind] = f"qdisc {kind} " in shown
                run_tc("qdisc", "del", "dev", "lo", "root", netns_name=scratch, check=False)
        except NetnsError as exc:
            raise TcError(f"cannot check qdisc support: {exc}") from None
        finally:
            netns.cleanup(scratch)
    return {k: _support_cache[k] for k in kinds}


def missing(kinds: Iterable[QdiscKind]) -> list[str]:
    """One message per requirement that is not met (root, tools, each qdisc kind)."""
    reason = netns.netns_unavailable_reason()
    if reason is not None:
        return [reason]
    if shutil.which("tc") is None:
        return ["the `tc` command is missing; install iproute2"]
    problems = []
    for kind, ok in probe_qdisc_support(kinds).items():
        if not ok:
            problems.append(
                NETEM_MISSING if kind == "netem" else f"this kernel has no {kind} qdisc"
            )
    return problems


def require(kinds: Iterable[QdiscKind]) -> None:
    """Raise :class:`TcError` naming everything that is missing for ``kinds``."""
    problems = missing(kinds)
    if problems:
        raise TcError("; ".join(problems))


def default_burst_bytes(rate_bps: float) -> int:
    """Bucket size for a rate: 1 ms worth of bytes, at least 8 KiB.

    Too small a bucket caps throughput below the rate; too large lets a short test burst far
    past it. Measured on veth pairs with 2 s iperf3 tests, 1 ms reaches 93-96 % of the rate at
    100-1000 Mbit/s, while 10 ms let a 256 KiB test read 18x the rate at 500 Mbit/s.
    """
    return max(8 * 1024, int(rate_bps / 8 * 0.001))


def shape_tbf(
    netns_name: str | None,
    dev: str,
    rate_bps: float,
    *,
    burst_bytes: int | None = None,
    latency_ms: float = 50.0,
) -> None:
    """Cap ``dev``'s egress at ``rate_bps`` with a token bucket (replaces any root qdisc).

    Args:
        netns_name: The namespace holding ``dev`` (None: root).
        dev: The interface.
        rate_bps: The rate in bit/s.
        burst_bytes: Bucket size; see :func:`default_burst_bytes`.
        latency_ms: Longest a packet may wait in the bucket's queue before being dropped.
    """
    burst = burst_bytes or default_burst_bytes(rate_bps)
    run_tc(
        *f"qdisc replace dev {dev} root tbf rate {int(rate_bps)}bit".split(),
        *f"burst {burst} latency {latency_ms:g}ms".split(),
        netns_name=netns_name,
    )


def shape_htb(
    netns_name: str | None,
    dev: str,
    rate_bps: float,
    *,
    ceil_bps: float | None = None,
    burst_bytes: int | None = None,
) -> None:
    """Cap ``dev``'s egress with an htb root and one default class 1:10 (replaces any root)."""
    burst = burst_bytes or default_burst_bytes(rate_bps)
    ceil = int(ceil_bps or rate_bps)
    if root_qdisc(netns_name, dev) != "htb":
        # htb cannot "change" in place, so only (re)create the root when it is not htb yet.
        root = f"qdisc replace dev {dev} root handle 1: htb default 10"
        run_tc(*root.split(), netns_name=netns_name)
    run_tc(
        *f"class replace dev {dev} parent 1: classid 1:10 htb".split(),
        *f"rate {int(rate_bps)}bit ceil {ceil}bit burst {burst}".split(),
        netns_name=netns_name,
    )


def root_qdisc(netns_name: str | None, dev: str) -> str | None:
    """The kind of ``dev``'s root qdisc (``tbf``, ``htb``, ``noqueue``, ...) or None."""
    for line in run_tc("qdisc", "show", "dev", dev, netns_name=netns_name).splitlines():
        parts = line.split()
        if len(parts) >= 4 and parts[0] == "qdisc" and "root" in parts:
            return parts[1]
    return None


def change_rate(netns_name: str | None, dev: str, rate_bps: float) -> None:
    """Change the rate of an existing tbf or htb shaping on ``dev``, keeping its kind.

    Raises:
        TcError: ``dev`` is not shaped by tbf or htb.
    """
    kind = root_qdisc(netns_name, dev)
    if kind == "tbf":
        shape_tbf(netns_name, dev, rate_bps)
    elif kind == "htb":
        shape_htb(netns_name, dev, rate_bps)
    else:
        raise TcError(f"{dev} is not shaped (root qdisc: {kind}); call shape_tbf or shape_htb")


def unshape(netns_name: str | None, dev: str) -> None:
    """Remove any shaping from ``dev`` (a device with none is fine)."""
    run_tc("qdisc", "del", "dev", dev, "root", netns_name=netns_name, check=False)


def emulate_delay_loss(
    netns_name: str | None, dev: str, *, delay_ms: float = 0.0, loss_pct: float = 0.0
) -> None:
    """Add delay and loss with netem, or refuse clearly where the kernel has no netem.

    Raises:
        TcError: netem is unavailable (the message is :data:`NETEM_MISSING`) or tc failed.
    """
    if not probe_qdisc_support(["netem"])["netem"]:
        raise TcError(NETEM_MISSING)
    run_tc(
        *f"qdisc replace dev {dev} root netem delay {delay_ms:g}ms loss {loss_pct:g}%".split(),
        netns_name=netns_name,
    )
