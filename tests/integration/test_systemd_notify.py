"""chaosd as a Type=notify service: READY, the watchdog, STOPPING, and a graceful SIGTERM.

The test plays systemd: it binds the ``$NOTIFY_SOCKET`` datagram socket, sets
``WATCHDOG_USEC`` and reads what chaosd sends. A SIGTERM must end in exit 0 with a retained
``left`` status (not the last will's ``lost``), so peers record a departure, not a failure.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion

from chaosctl.client import ControlFailure, call_once
from chaosctl.cluster import LocalCluster, chaosd_command
from daemon.contracts.messages import Status, decode
from tests.integration.conftest import BROKERS, wait_until

pytestmark = pytest.mark.timeout(90)
MakeCluster = Callable[..., LocalCluster]
WATCHDOG_USEC = 400_000
NODE = "sd-node"  # sorts after node-1, so the peer is the scheduler


@dataclass
class NotifyListener:
    """The test's stand-in for systemd's notify socket: records (time, fields) datagrams."""

    path: Path
    got: list[tuple[float, dict[str, str]]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(self.path))
        self.sock.settimeout(0.1)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        while not self._stop.is_set():
            try:
                data = self.sock.recv(4096)
            except TimeoutError:
                continue
            except OSError:
                return
            fields = dict(line.split("=", 1) for line in data.decode().splitlines() if "=" in line)
            self.got.append((time.monotonic(), fields))

    def times(self, key: str, value: str = "1") -> list[float]:
        return [t for t, f in list(self.got) if f.get(key) == value]

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2)
        self.sock.close()


@dataclass
class Notified:
    cluster: LocalCluster
    listener: NotifyListener
    proc: subprocess.Popen[bytes]
    sock: Path
    log: Path

    def query(self, op: str) -> Any:
        try:
            return call_once(self.sock, op, timeout=1.0)
        except ControlFailure:
            return None


@pytest.fixture
def notified(make_cluster: MakeCluster, request: pytest.FixtureRequest) -> Iterator[Notified]:
    """A 1-node cluster (node-1; mosquitto unless parametrized) plus ``sd-node`` started as if
    by systemd."""
    c = make_cluster(1, getattr(request, "param", "mosquitto"))
    wait_until(lambda: c.query("node-1", "status"), 15, "node-1")
    listener = NotifyListener(c.workdir / "notify")
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "NOTIFY_SOCKET": str(listener.path),
           "WATCHDOG_USEC": str(WATCHDOG_USEC)}
    env.pop("WATCHDOG_PID", None)
    sock, log = c.workdir / f"{NODE}.sock", c.workdir / f"{NODE}.log"
    conf = c.workdir / f"{NODE}.toml"
    conf.write_text(f'secret = "{c.secret}"\n')
    argv = [*chaosd_command(), "--config", str(conf), "--node-id", NODE, "--cluster", c.cluster,
            "--broker", f"mqtt://127.0.0.1:{c.port}", "--socket", str(sock),
            "--data-dir", str(c.workdir / NODE)]
    with open(log, "ab") as out:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out,
                                stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        yield Notified(c, listener, proc, sock, log)
    finally:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=5)
        listener.close()


def test_ready_watchdog_stopping(notified: Notified) -> None:
    n = notified
    ready = wait_until(lambda: n.listener.times("READY"), 20, "READY=1")
    # READY comes only once the control socket is up: it answers right away.
    answered = n.query("status")
    assert answered is not None and answered["node"] == NODE
    assert len(ready) == 1, "READY=1 sent more than once"
    ready_fields = next(f for _t, f in n.listener.got if f.get("READY") == "1")
    assert NODE in ready_fields.get("STATUS", ""), ready_fields
    # The watchdog: fed at half of WATCHDOG_USEC (0.2 s) from the event loop. How close each
    # gap comes to that is timing (a loaded box stretches it), so the test asserts only that
    # the feeding goes on after READY; the interval itself is the daemon's arithmetic.
    def beats() -> list[float]:
        return [t for t in n.listener.times("WATCHDOG") if t >= ready[0]]

    wait_until(lambda: len(beats()) >= 4, 20, "four WATCHDOG=1 after READY=1")
    assert not n.listener.times("STOPPING")
    # SIGTERM: STOPPING=1, then a clean exit 0.
    n.proc.send_signal(signal.SIGTERM)
    assert n.proc.wait(timeout=10) == 0, n.log.read_text(errors="replace")
    wait_until(lambda: n.listener.times("STOPPING"), 2, "STOPPING=1")
    stopping = n.listener.times("STOPPING")
    assert len(stopping) == 1 and stopping[0] > ready[0]
    assert not n.sock.exists(), "the control socket was left behind"
    assert "Traceback" not in n.log.read_text(errors="replace")


def _retained_status(port: int, topic: str) -> Status | None:
    got: list[bytes] = []
    done = threading.Event()

    def on_message(_c: Any, _u: Any, msg: mqtt.MQTTMessage) -> None:
        if msg.retain and msg.topic == topic:
            got.append(bytes(msg.payload))
            done.set()

    client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=f"probe-{time.time_ns()}")
    client.on_message = on_message
    client.connect("127.0.0.1", port, keepalive=30)
    client.loop_start()
    try:
        client.subscribe(topic, qos=1)
        done.wait(3.0)
    finally:
        client.disconnect()
        client.loop_stop()
    if not got:
        return None
    st = decode(got[0], Status)
    assert isinstance(st, Status)
    return st


def _row(n: Notified, node: str) -> dict[str, Any] | None:
    rows = n.cluster.query("node-1", "nodes") or []
    return next((r for r in rows if r["id"] == node), None)


@pytest.mark.parametrize("notified", BROKERS, indirect=True)
def test_sigterm_is_a_graceful_leave(notified: Notified) -> None:
    n = notified
    c = n.cluster
    topic = f"chaos/{c.cluster}/node/{NODE}/status"
    wait_until(lambda: (r := _row(n, NODE)) and r["state"] == "standby", 20,
               f"node-1 to see {NODE} as standby")
    wait_until(lambda: (s := c.query("node-1", "status")) and s["scheduler"]
               and s["scheduler"]["id"] == "node-1", 15, "node-1 elected")
    up = _retained_status(c.port, topic)
    assert up is not None and up.online and up.reason == "up"
    n.proc.send_signal(signal.SIGTERM)
    assert n.proc.wait(timeout=10) == 0, n.log.read_text(errors="replace")
    # Give a last will (if the broker were to fire one) time to land before looking.
    time.sleep(1.0)
    st = _retained_status(c.port, topic)
    assert st is not None, "no retained status after the exit"
    assert (st.online, st.reason) == (False, "left"), st
    assert st.incarnation == up.incarnation
    row = wait_until(lambda: (r := _row(n, NODE)) and r["state"] in ("left", "failed") and r,
                     10, f"node-1 to see {NODE} gone")
    assert row["state"] == "left", row
    time.sleep(1.0)  # and it stays a departure: no failure detected later
    assert (_row(n, NODE) or {}).get("state") == "left"
    failed = [e for e in c.query("node-1", "events") or []
              if e["kind"] == "node-failed" and e["node"] == NODE]
    assert not failed, failed
    assert c.query("node-1", "status")["nodes"] == {"left": 1, "standby": 1}
