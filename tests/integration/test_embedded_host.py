"""``broker = "embedded"``: a chaosd that hosts the broker in-process, the single-box default."""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from chaosctl.client import call_once
from chaosctl.cluster import chaosd_command, free_port
from tests.integration.conftest import wait_until

pytestmark = pytest.mark.timeout(90)
SECRET = "embedded-host-test-secret"


@pytest.fixture
def procs() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for proc in started:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    for proc in started:
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def start(procs: list[subprocess.Popen[bytes]], tmp: Path, node: str, broker: str,
          config: Path | None = None) -> Path:
    sock = tmp / f"{node}.sock"
    if config is None:
        config = tmp / f"{node}.toml"
        config.write_text(f'secret = "{SECRET}"\n')
    argv = [*chaosd_command(), "--node-id", node, "--cluster", "emb", "--broker", broker,
            "--socket", str(sock), "--data-dir", str(tmp / node), "--config", str(config)]
    with open(tmp / f"{node}.log", "wb") as log:
        procs.append(subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT))
    return sock


def status(sock: Path) -> dict[str, object] | None:
    try:
        data = call_once(sock, "status", timeout=1.0)
    except Exception:
        return None
    return data if isinstance(data, dict) else None


def test_hosting_daemon_and_a_peer_elect_one_scheduler(
        tmp_path: Path, procs: list[subprocess.Popen[bytes]]) -> None:
    port = free_port()
    conf = tmp_path / "host.toml"
    conf.write_text(f'secret = "{SECRET}"\n[mqtt]\nembedded_port = {port}\n')
    host = start(procs, tmp_path, "host", "embedded", conf)
    wait_until(lambda: status(host), 20, "the hosting daemon")
    peer = start(procs, tmp_path, "peer", f"mqtt://127.0.0.1:{port}")

    def agreed() -> bool:
        a, b = status(host), status(peer)
        return bool(a and b and a["scheduler"] and a["scheduler"] == b["scheduler"]
                    and a["nodes"] == {"standby": 2})

    wait_until(agreed, 30, "one scheduler on the embedded broker")


def test_port_in_use_is_one_clear_line(tmp_path: Path,
                                       procs: list[subprocess.Popen[bytes]]) -> None:
    port = free_port()
    blocker = subprocess.Popen([sys.executable, "-m", "daemon.agent.broker", "--port", str(port)],
                               stdout=subprocess.PIPE)
    procs.append(blocker)
    assert blocker.stdout is not None and blocker.stdout.readline().startswith(b"ready")
    conf = tmp_path / "host.toml"
    conf.write_text(f'secret = "{SECRET}"\n[mqtt]\nembedded_port = {port}\n')
    argv = [*chaosd_command(), "--node-id", "x", "--broker", "embedded", "--config", str(conf),
            "--socket", str(tmp_path / "x.sock"), "--data-dir", str(tmp_path / "x")]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    assert proc.returncode == 1
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("chaosd: ")]
    assert len(errors) == 1 and "in use" in errors[0] and str(port) in errors[0]
    assert "Traceback" not in proc.stderr
