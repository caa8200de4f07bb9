"""chaosd's Prometheus endpoint, scraped over HTTP from a live training cluster."""

from __future__ import annotations

import contextlib
import math
import os
import signal
import socket
import subprocess
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from chaosctl.cluster import LocalCluster, chaosd_command, free_port
from daemon.contracts.config import load_config
from daemon.contracts.errors import ConfigError
from tests.integration.conftest import need_mosquitto, wait_until
from tests.training._run import Run

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(port: int) -> tuple[set[str], Samples]:
    """The metric family names and every sample of one scrape."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        assert resp.status == 200
        assert resp.headers["Content-Type"].startswith("text/plain")
        text = resp.read().decode()
    families, samples = set(), {}
    for fam in text_string_to_metric_families(text):
        families.add(fam.name)
        for s in fam.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return families, samples


def value(samples: Samples, name: str, **labels: str) -> float | None:
    return samples.get((name, tuple(sorted(labels.items()))))


@pytest.fixture
def run(tmp_path: Path) -> Iterator[tuple[Run, dict[str, int]]]:
    need_mosquitto("mosquitto")
    ports = {f"node-{i}": free_port() for i in (1, 2, 3)}
    c = LocalCluster(tmp_path / "c", 3, cluster="metrics", broker_kind="mosquitto",
                     node_config={n: f'[metrics]\nlisten = "127.0.0.1:{p}"\n'
                                  for n, p in ports.items()})
    r = Run(c, tmp_path)
    try:
        c.start()
        c.wait(lambda: c.agreed(states={"standby": 3}), 30, "a scheduler")
        yield r, ports
    finally:
        for pid in [r.worker_pid(n) for n in c.node_ids]:
            if pid:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pid, signal.SIGKILL)
        c.close(grace=5.0)


@pytest.mark.timeout(180)
def test_a_live_cluster_exports_its_metrics(run: tuple[Run, dict[str, int]]) -> None:
    r, ports = run
    n1, n2, _n3 = r.c.node_ids
    r.join(n1)
    r.c.wait(lambda: r.active([n1]), 60, f"{n1} active")
    r.join(n2, neighbors=[n1])
    r.c.wait(lambda: r.active([n1, n2]), 90, f"{n2} active")
    r.advance([n1, n2], 5)

    families, first = scrape(ports[n1])
    for name in ("chaos_steps", "chaos_step", "chaos_allreduce_seconds", "chaos_stall_seconds",
                 "chaos_round_reruns", "chaos_cluster_events",
                 "chaos_cluster_event_delay_seconds", "chaos_link_rtt_seconds",
                 "chaos_link_bandwidth_bytes_per_second", "chaos_link_up", "chaos_peer_phi",
                 "chaos_scheduler_term", "chaos_scheduler", "chaos_auth_failures",
                 "chaos_daemon_counter"):
        assert name in families, name
    assert not any(f.startswith(("python_", "process_")) for f in families)  # its own registry
    steps = value(first, "chaos_steps_total")
    assert steps is not None and steps > 0
    assert (value(first, "chaos_scheduler_term") or 0) >= 1
    assert value(first, "chaos_auth_failures_total") == 0
    assert value(first, "chaos_daemon_counter_total", kind="commands")  # connect, replicate

    def settled() -> Samples | None:
        # The scale-out of node-2 with its delay, the RTT of the new link, a higher step count.
        _, now = scrape(ports[n1])
        ok = ((value(now, "chaos_steps_total") or 0) > (steps or 0)
              and (value(now, "chaos_cluster_events_total", kind="scale-out") or 0) >= 1
              and (value(now, "chaos_cluster_event_delay_seconds_count", kind="scale-out")
                   or 0) >= 1
              and value(now, "chaos_link_rtt_seconds", peer=n2) is not None
              and value(now, "chaos_link_up", peer=n2) == 1
              and (value(now, "chaos_allreduce_seconds_count") or 0) > 0)
        return now if ok else None

    now = wait_until(settled, 30, "steps, a scale-out and the link's RTT in the metrics")
    # A measured RTT and a suspicion level: their sizes are timing, their presence is not.
    assert 0 < (value(now, "chaos_link_rtt_seconds", peer=n2) or 0) < math.inf
    assert (value(now, "chaos_cluster_event_delay_seconds_sum", kind="scale-out") or -1) >= 0
    assert 0 <= (value(now, "chaos_peer_phi", peer=n2) or -1) < math.inf
    # Every daemon serves the same families; only one is the scheduler.
    leaders = 0
    for node in r.c.node_ids:
        fams, samples = scrape(ports[node])
        assert "chaos_peer_phi" in fams
        leaders += int(value(samples, "chaos_scheduler") or 0)
    assert leaders == 1


def test_metrics_listen_is_checked_at_start_up(tmp_path: Path) -> None:
    conf = tmp_path / "c.toml"
    for bad in ("9464", "127.0.0.1:", "127.0.0.1:99999", ":9464", "localhost:http"):
        conf.write_text(f'[metrics]\nlisten = "{bad}"\n')
        with pytest.raises(ConfigError, match=r"^config: metrics.listen must be host:port"):
            load_config(conf)
    conf.write_text('[metrics]\nlisten = "[::1]:9464"\n')
    assert load_config(conf).metrics.listen == "[::1]:9464"
    assert load_config(None, node_id="n").metrics.listen == ""  # off by default


def test_a_taken_metrics_address_stops_the_daemon_with_one_line(tmp_path: Path) -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen(1)
        port = held.getsockname()[1]
        conf = tmp_path / "c.toml"
        conf.write_text(f'[metrics]\nlisten = "127.0.0.1:{port}"\n')
        proc = subprocess.run(
            [*chaosd_command(), "--config", str(conf), "--insecure", "--node-id", "n1",
             "--broker", f"mqtt://127.0.0.1:{free_port()}", "--socket", str(tmp_path / "s"),
             "--data-dir", str(tmp_path / "d")],
            capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)
    assert proc.returncode == 1, proc.stderr
    assert f"metrics: cannot listen on 127.0.0.1:{port}" in proc.stderr
    assert "Traceback" not in proc.stderr
