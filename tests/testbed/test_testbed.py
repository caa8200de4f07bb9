"""Real testbeds: namespaces, shaped veth links, mosquitto in the hub, chaosd in every node.

Needs root; skips with the reason without it. Each test builds its own testbed (a few seconds)
and ``make_testbed`` removes it and checks that nothing is left.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from chaosctl.testbed.core import Testbed
from tests.testbed.conftest import reach, wait_until

pytestmark = [pytest.mark.netns, pytest.mark.timeout(120)]
MakeTestbed = Callable[..., Testbed]
IPERF_PORT = 5299  # each namespace has its own port space; chaosd's own iperf3 uses another


def node_row(tb: Testbed, observer: str, node: str) -> dict[str, Any] | None:
    rows = tb.query(observer, "nodes") or []
    return next((r for r in rows if r.get("id") == node), None)


def test_four_nodes_elect_one_scheduler_and_see_each_other(make_testbed: MakeTestbed) -> None:
    tb = make_testbed(4, "ring")
    sched, term = wait_until(tb.agreed, 20, "one scheduler")
    assert sched in tb.nodes and term >= 1
    for node in tb.nodes:
        rows = tb.query(node, "nodes")
        assert [r["id"] for r in rows] == ["n1", "n2", "n3", "n4"]
        assert {r["addr"] for r in rows} == {tb.addr_of(n) for n in tb.nodes}
        assert [r["id"] for r in rows if r["scheduler"]] == [sched]
    assert tb.links == [("n1", "n2"), ("n1", "n4"), ("n2", "n3"), ("n3", "n4")]
    assert all(info.up and 100 <= (info.mbit or 0) <= 1000 for info in tb.link_info())


def test_only_neighbours_reach_each_other_and_cut_heal_work(make_testbed: MakeTestbed) -> None:
    tb = make_testbed(4, "ring", start_daemons=False)
    # Port 9 is closed everywhere: "refused" proves the address answered over the link.
    assert reach(tb, "n2", "n1") == "refused"
    assert reach(tb, "n4", "n1") == "refused"
    assert reach(tb, "n3", "n1") == "unreachable"  # n1-n3 is no link of the ring
    tb.cut("n1", "n2")
    assert reach(tb, "n2", "n1") == "unreachable"
    assert reach(tb, "n1", "n2") == "unreachable"
    assert reach(tb, "n4", "n1") == "refused"  # the other links are untouched
    assert [i.up for i in tb.link_info()] == [False, True, True, True]
    tb.heal("n1", "n2")
    assert reach(tb, "n2", "n1") == "refused"
    assert all(i.up for i in tb.link_info())


def iperf_mbit(tb: Testbed, client: str, server: str, seconds: float = 2.0) -> float:
    srv = tb.exec(server, ["iperf3", "-s", "-1", "-B", tb.addr_of(server), "-p", str(IPERF_PORT)],
                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 10
        while True:
            cli = tb.exec(client, ["iperf3", "-c", tb.addr_of(server), "-p", str(IPERF_PORT),
                                   "-t", f"{seconds:g}", "--json"],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            out, _ = cli.communicate(timeout=30)
            doc = json.loads(out or b"{}")
            if "error" not in doc or time.monotonic() > deadline:
                break
            time.sleep(0.2)  # the server was not listening yet
        assert "error" not in doc, doc.get("error")
        return float(doc["end"]["sum_received"]["bits_per_second"]) / 1e6
    finally:
        srv.kill()
        srv.wait(5)


@pytest.mark.skipif(shutil.which("iperf3") is None, reason="iperf3 not installed")
@pytest.mark.parametrize("qdisc", ["tbf", "htb"])
def test_shaping_is_real(make_testbed: MakeTestbed, qdisc: str) -> None:
    tb = make_testbed(3, "line", start_daemons=False, qdisc=qdisc, bw=(40.0, 40.0))
    assert [round(i.mbit or 0) for i in tb.link_info()] == [40, 40]
    first = iperf_mbit(tb, "n1", "n2")
    tb.shape("n1", "n2", 120)
    second = iperf_mbit(tb, "n2", "n1")  # the other direction is capped too
    # Loose bands: shared CPUs, but a wrong cap (or none: veths do several Gbit/s) fails.
    assert 0.7 * 40 < first < 1.1 * 40, first
    assert 0.7 * 120 < second < 1.1 * 120, second


def test_kill_9_of_a_node_is_seen_as_failed(make_testbed: MakeTestbed) -> None:
    tb = make_testbed(4, "ring")
    sched, _ = wait_until(tb.agreed, 20, "one scheduler")
    victim = next(n for n in reversed(tb.nodes) if n != sched)
    tb.kill(victim, signal.SIGKILL)
    for observer in (n for n in tb.nodes if n != victim):
        wait_until(lambda o=observer: (r := node_row(tb, o, victim)) and r["state"] == "failed",
                   15, f"{observer} to mark {victim} failed")
    tb.start_node(victim)  # a restart comes back (the same path a scenario's "join" takes)
    wait_until(lambda: (r := node_row(tb, sched, victim)) and r["state"] != "failed", 20,
               f"{victim} back after a restart")


def test_redraw_changes_the_rates(make_testbed: MakeTestbed) -> None:
    tb = make_testbed(3, "line", start_daemons=False, redraw_period_s=0.5, seed=5)
    before = [i.mbit for i in tb.link_info()]
    wait_until(lambda: (tb.dir / "redraw.json").exists(), 15, "a redraw round")
    doc = json.loads((tb.dir / "redraw.json").read_text())
    assert set(doc["rates"]) == {"n1-n2", "n2-n3"}
    wait_until(lambda: [i.mbit for i in tb.link_info()] != before, 10, "new rates")
    assert all(100 <= (i.mbit or 0) <= 1000 for i in tb.link_info())


def test_join_runs_the_worker_inside_the_node(make_testbed: MakeTestbed, tmp_path: Path) -> None:
    # The path a training worker takes (the Trainer comes later): the node's chaosd starts
    # the command, so it runs in the node's namespace and sees only the node's links.
    tb = make_testbed(3, "line")
    marker = tmp_path / "worker.out"
    # Binding n2's data address works only inside n2's namespace.
    code = (f"import os,socket,time; socket.socket().bind(({tb.addr_of('n2')!r}, 0)); "
            f"open({str(marker)!r}, 'w').write(os.environ['CHAOS_SOCKET']); time.sleep(60)")
    data = tb.join("n2", [sys.executable, "-c", code])
    assert data["state"] == "joining"
    wait_until(marker.exists, 20, "the worker to start")
    assert marker.read_text() == str(tb.socket_of("n2"))
