"""Real network namespaces, veth links and tc shaping. Needs root; skips with the reason if not."""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass

import psutil
import pytest

from netprobe import iperf, netns, tc
from netprobe.bandwidth import BandwidthProber
from netprobe.errors import NetnsError, TcError
from netprobe.iperf_server import IperfServer
from netprobe.periodic import DEFAULT_NBYTES, DEFAULT_PERIOD_S, PeriodicBandwidthProbe

pytestmark = [pytest.mark.netns, pytest.mark.timeout(90)]

needs_iperf3 = pytest.mark.skipif(shutil.which("iperf3") is None, reason="iperf3 not installed")
IPERF_PORT = 5201  # each namespace has its own port space
RTT_PORT = 7700


@dataclass
class Pair:
    """Two namespaces joined by one veth link: a (10.77.0.1) <-> b (10.77.0.2)."""

    prefix: str
    a: str
    b: str
    dev_a: str
    dev_b: str
    ip_a: str = "10.77.0.1"
    ip_b: str = "10.77.0.2"


@pytest.fixture
def pair(netns_prefix: str) -> Iterator[Pair]:
    p = Pair(
        netns_prefix,
        netns_prefix + "a",
        netns_prefix + "b",
        netns.ifname(netns_prefix, "a0"),
        netns.ifname(netns_prefix, "b0"),
    )
    netns.create_netns(p.a)
    netns.create_netns(p.b)
    netns.add_veth(p.dev_a, p.a, p.dev_b, p.b, addr_a=f"{p.ip_a}/24", addr_b=f"{p.ip_b}/24")
    yield p  # netns_prefix's teardown removes everything and checks nothing is left


@pytest.fixture
def qdiscs() -> dict[tc.QdiscKind, bool]:
    reason = netns.netns_unavailable_reason()
    if reason is not None:
        pytest.skip(f"netns test skipped: {reason}")
    return tc.probe_qdisc_support()


@pytest.fixture
async def iperf_in_b(pair: Pair) -> AsyncIterator[IperfServer]:
    server = IperfServer(pair.ip_b, IPERF_PORT, exec_prefix=netns.exec_prefix(pair.b))
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


def test_capability_check_says_what_is_missing(qdiscs: dict[tc.QdiscKind, bool]) -> None:
    assert set(qdiscs) == {"tbf", "htb", "netem"}
    problems = tc.missing(["tbf", "htb", "netem"])
    if not qdiscs["netem"]:
        assert any("netem" in p and "delay" in p for p in problems)
        with pytest.raises(TcError, match="no netem"):
            tc.require(["netem"])
    for kind in ("tbf", "htb"):
        assert qdiscs[kind] == (not any(f"no {kind} " in p for p in problems))


def test_delay_without_netem_is_refused_clearly(
    pair: Pair, qdiscs: dict[tc.QdiscKind, bool]
) -> None:
    if qdiscs["netem"]:
        pytest.skip("this kernel has netem; the refusal path cannot be exercised")
    with pytest.raises(TcError) as info:
        tc.emulate_delay_loss(pair.a, pair.dev_a, delay_ms=20, loss_pct=1)
    assert str(info.value) == tc.NETEM_MISSING


def test_interface_names_are_checked() -> None:
    with pytest.raises(NetnsError, match="15"):
        netns.ifname("chaos-abcdef-", "toolong")
    with pytest.raises(ValueError):
        netns.make_prefix("NOT OK")
    with pytest.raises(ValueError):
        netns.cleanup("ch")


@needs_iperf3
async def test_tbf_shaped_link_measures_near_the_cap(
    pair: Pair, iperf_in_b: IperfServer, qdiscs: dict[tc.QdiscKind, bool]
) -> None:
    if not qdiscs["tbf"] or not qdiscs["htb"]:
        pytest.skip("this kernel lacks tbf or htb")
    client = netns.exec_prefix(pair.a)
    for kind, rate in (("tbf", 50e6), ("tbf-change", 20e6), ("htb", 30e6)):
        if kind == "tbf":
            tc.shape_tbf(pair.a, pair.dev_a, rate)
        elif kind == "tbf-change":
            tc.change_rate(pair.a, pair.dev_a, rate)
        else:
            tc.shape_htb(pair.a, pair.dev_a, rate)
        assert tc.root_qdisc(pair.a, pair.dev_a) == kind.split("-")[0]
        result = await iperf.measure(
            pair.ip_b, IPERF_PORT, duration_s=2, timeout_s=20, exec_prefix=client
        )
        assert 0.5 * rate <= result.bits_per_second <= 1.3 * rate, (kind, result)
    tc.unshape(pair.a, pair.dev_a)
    tc.unshape(pair.a, pair.dev_a)  # removing nothing is fine
    assert tc.root_qdisc(pair.a, pair.dev_a) not in ("tbf", "htb")


async def _next_event(proc: asyncio.subprocess.Process, timeout_s: float) -> dict[str, object]:
    assert proc.stdout is not None
    line = await asyncio.wait_for(proc.stdout.readline(), timeout_s)
    assert line, "probe process exited"
    event: dict[str, object] = json.loads(line)
    return event


async def test_cut_link_is_detected_and_heal_recovers(pair: Pair) -> None:
    # The responder goes through exec_in (Popen); the prober through asyncio for easy reading.
    responder = netns.exec_in(
        pair.b,
        [
            sys.executable,
            "-m",
            "netprobe",
            "rtt-serve",
            "--host",
            pair.ip_b,
            "--port",
            str(RTT_PORT),
        ],
        stdout=subprocess.PIPE,
    )
    prober = await asyncio.create_subprocess_exec(
        *netns.exec_prefix(pair.a),
        sys.executable,
        "-m",
        "netprobe",
        "rtt-probe",
        "--peer",
        f"b={pair.ip_b}:{RTT_PORT}",
        "--interval",
        "0.2",
        "--fail-after",
        "3",
        stdout=asyncio.subprocess.PIPE,
    )
    try:
        assert responder.stdout is not None
        assert json.loads(responder.stdout.readline())["event"] == "listening"
        started = await _next_event(prober, 15)
        assert started["event"] == "listening"
        bound = float(started["detection_bound_s"])  # type: ignore[arg-type]
        assert bound == pytest.approx(0.2 * 3 + 0.2)
        await asyncio.sleep(1.0)  # a few good probes first
        loop = asyncio.get_running_loop()
        cut_at = loop.time()
        netns.cut_link(pair.a, pair.dev_a)
        failed = await _next_event(prober, 10)
        assert failed["event"] == "failed" and failed["peer"] == "b"
        assert failed["received"] > 0  # type: ignore[operator]
        assert loop.time() - cut_at <= bound + 1.0  # slack for process scheduling
        netns.heal_link(pair.a, pair.dev_a)
        recovered = await _next_event(prober, 15)
        assert recovered["event"] == "recovered" and recovered["state"] == "up"
    finally:
        for proc in (prober,):
            if proc.returncode is None:
                proc.terminate()
                await proc.wait()
        responder.terminate()
        responder.wait(5)


@needs_iperf3
async def test_star_through_a_bridge_namespace(netns_prefix: str) -> None:
    hub = netns_prefix + "hub"
    netns.create_netns(hub)
    netns.add_bridge(hub, netns.ifname(netns_prefix, "br"))
    for i, name in enumerate(("n1", "n2"), start=1):
        node = netns_prefix + name
        netns.create_netns(node)
        dev, port = netns.ifname(netns_prefix, name), netns.ifname(netns_prefix, f"p{i}")
        netns.add_veth(dev, node, port, hub, addr_a=f"10.78.0.{i}/24")
        netns.attach_to_bridge(hub, port, netns.ifname(netns_prefix, "br"))
    async with IperfServer(
        "10.78.0.2", IPERF_PORT, exec_prefix=netns.exec_prefix(netns_prefix + "n2")
    ):
        result = await iperf.measure(
            "10.78.0.2",
            IPERF_PORT,
            nbytes=1 << 20,
            timeout_s=20,
            exec_prefix=netns.exec_prefix(netns_prefix + "n1"),
        )
    assert result.bits_per_second > 0


@needs_iperf3
async def test_periodic_probe_wire_cost_is_under_one_percent(
    pair: Pair, iperf_in_b: IperfServer
) -> None:
    # The real PeriodicBandwidthProbe with its defaults (60 s period, 0.1 % target) on a
    # 100 Mbit/s link, run back to back; the veth's counters see every byte on the wire
    # (payload, headers, ACKs, iperf3's control connection).
    rate = 100e6
    tc.shape_tbf(pair.a, pair.dev_a, rate)
    tc.shape_tbf(pair.b, pair.dev_b, rate)
    periodic = PeriodicBandwidthProbe(BandwidthProber(exec_prefix=netns.exec_prefix(pair.a)))
    periodic.add_link("b", pair.ip_b, IPERF_PORT)
    assert await periodic.probe_once("b") is not None  # learns the capacity at the floor size
    before = sum(netns.link_counters(pair.a, pair.dev_a))
    n = 3
    for _ in range(n):
        assert await periodic.probe_once("b") is not None
    per_probe = (sum(netns.link_counters(pair.a, pair.dev_a)) - before) / n
    # Not all of a probe's bytes need cross: iperf3's receiver hangs up at TEST_END and the
    # sender's kernel drops what is still queued. A floor proves the counters saw the probes.
    assert per_probe > DEFAULT_NBYTES / 4
    duty = per_probe * 8 / (rate * DEFAULT_PERIOD_S)
    assert duty < 0.01, f"{per_probe:.0f} B per probe is {duty:.3%} of 100 Mbit/s"
    stats = periodic.stats("b")
    assert stats.duty_cycle is not None and stats.duty_cycle < 0.01


def test_cleanup_after_a_crash_kills_and_removes_everything(netns_prefix: str) -> None:
    ns = netns_prefix + "x"
    netns.create_netns(ns)
    sleeper = netns.exec_in(ns, ["sleep", "600"])
    # A veth left in the root namespace, as a crash between "add" and "move" would leave it.
    netns.add_veth(netns.ifname(netns_prefix, "r0"), None, netns.ifname(netns_prefix, "r1"), None)
    assert netns.netns_pids(ns) == [sleeper.pid]
    report = netns.cleanup(netns_prefix)
    assert sleeper.wait(5) != 0
    assert report.namespaces == [ns] and sleeper.pid in report.killed_pids
    assert netns.list_netns(netns_prefix) == [] and netns.list_links(netns_prefix) == []
    assert not psutil.pid_exists(sleeper.pid)
    assert netns.cleanup(netns_prefix).namespaces == []  # idempotent
