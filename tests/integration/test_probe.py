"""`chaosctl probe PEER`: a fresh RTT and bandwidth measurement between two real daemons."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable

import pytest

from chaosctl.client import ControlRefused, call_once
from chaosctl.cluster import LocalCluster
from tests.integration.test_cli_live import chaosctl, one_error_line

pytestmark = pytest.mark.timeout(90)


def test_probe_measures_rtt_and_bandwidth(make_cluster: Callable[..., LocalCluster]) -> None:
    c = make_cluster(2, "mosquitto")
    a, b = c.node_ids
    c.wait(lambda: c.agreed(c.node_ids), 20, "a scheduler")
    proc = chaosctl(c.socket_of(a), "probe", b, "--json", timeout=60)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["peer"] == b
    assert out["rtt_ms"] is not None and out["rtt_ms"] > 0
    assert out["bandwidth_mbps"] is not None and out["bandwidth_mbps"] > 0
    assert out["method"] == ("iperf3" if shutil.which("iperf3") else "bulk")
    assert "error" not in out
    table = chaosctl(c.socket_of(a), "probe", b, timeout=60)
    assert table.returncode == 0 and b in table.stdout


def test_probe_errors_are_one_line(make_cluster: Callable[..., LocalCluster]) -> None:
    c = make_cluster(1, "mosquitto")
    (a,) = c.node_ids
    c.wait(lambda: c.query(a, "status"), 20, "the daemon")
    assert "not online" in one_error_line(chaosctl(c.socket_of(a), "probe", "ghost"), 1)
    assert "itself" in one_error_line(chaosctl(c.socket_of(a), "probe", a), 2)


def test_worker_probe_measures_every_source_at_once(
        make_cluster: Callable[..., LocalCluster]) -> None:
    # A joining worker asks its daemon for the links to all its sources in one call.
    c = make_cluster(3, "mosquitto")
    a, b, d = c.node_ids
    c.wait(lambda: c.agreed(c.node_ids), 20, "a scheduler")
    out = call_once(c.socket_of(a), "worker.probe", {"peers": [b, d, "ghost"]}, timeout=60)
    for peer in (b, d):
        assert out[peer]["rtt_ms"] > 0 and out[peer]["bandwidth_mbps"] > 0, out
    assert "not online" in out["ghost"]["error"]
    with pytest.raises(ControlRefused, match="'peers' must be a list"):
        call_once(c.socket_of(a), "worker.probe", {"peers": []}, timeout=10)
