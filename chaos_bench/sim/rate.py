"""Measure mosquitto's cost per message on this box: a small publisher/subscriber load run.

A private mosquitto on a free loopback port, ``subscribers`` clients on one wildcard topic and
one publisher sending QoS 0 messages at a paced rate, once with heartbeat-sized payloads and
once with large ones. The broker's own CPU time (``/proc/PID/stat``) over the copies the
subscribers counted gives CPU seconds per delivery; the two sizes separate the per-copy and
the per-byte costs. Measuring the broker's CPU, not the clients' throughput, keeps the Python
clients (the bottleneck on 2 shared cores) out of the figure.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import paho.mqtt.client as mqtt

from chaos_bench.progress import Say
from chaos_bench.sim.broker import HB_BYTES, BrokerModel
from chaos_bench.sim.errors import SimError

#: mosquitto 2 on this project's 2-core shared box, median of 3 runs of :func:`measure` (6 s
#: each, 8 subscribers): 5.86 us per copy, 0.57 ns per byte, about 168,000 heartbeat
#: deliveries per broker CPU-second (`chaosctl bench simulate --measure-broker` redoes it).
DEFAULT_MODEL = BrokerModel(per_publish_s=5.86e-6, per_delivery_s=5.86e-6, per_byte_s=5.7e-10)
BIG_BYTES = 16384


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@contextlib.contextmanager
def _mosquitto() -> Iterator[tuple[int, int]]:
    """A private mosquitto on a free loopback port: (pid, port); stopped on exit."""
    from chaosctl.cluster import ClusterError, free_port, mosquitto_binary

    try:
        binary = mosquitto_binary()
    except ClusterError as exc:
        raise SimError(str(exc)) from None
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="chaos-sim-rate-") as tmp:
        conf = Path(tmp) / "mosquitto.conf"
        conf.write_text(f"listener {port} 127.0.0.1\nallow_anonymous true\n"
                        "max_queued_messages 100000\n")
        proc = subprocess.Popen([binary, "-c", str(conf)], stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 15  # a loaded box starts it slowly
            while time.monotonic() < deadline:
                with contextlib.suppress(OSError), socket.create_connection(
                        ("127.0.0.1", port), timeout=0.2):
                    break
                time.sleep(0.05)
            else:
                raise SimError("mosquitto did not start listening within 15 s")
            yield proc.pid, port
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _client(port: int, name: str) -> mqtt.Client:
    c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=name)
    c.connect("127.0.0.1", port, keepalive=30)
    return c


def _run(pid: int, port: int, subscribers: int, payload: int, rate: float, seconds: float
         ) -> tuple[float, int, int]:
    """One load run: (broker CPU s, publishes, deliveries counted)."""
    got = [0]
    lock = threading.Lock()

    def on_message(_c: mqtt.Client, _u: object, _m: mqtt.MQTTMessage) -> None:
        with lock:
            got[0] += 1

    clients: list[mqtt.Client] = []
    try:  # every client's network thread is stopped, whatever happens
        for i in range(subscribers):
            c = _client(port, f"sub{i}")
            clients.append(c)
            c.on_message = on_message
            c.subscribe("chaos/sim/node/+/hb", qos=0)
            c.loop_start()
        pub = _client(port, "pub")
        clients.append(pub)
        pub.loop_start()
        time.sleep(0.5)
        body, sent = b"x" * payload, 0
        cpu0, t0 = _cpu_s(pid), time.monotonic()
        while (now := time.monotonic()) - t0 < seconds:
            while sent < (now - t0) * rate:
                pub.publish(f"chaos/sim/node/n{sent % 64}/hb", body, qos=0)
                sent += 1
            time.sleep(0.002)
        time.sleep(0.5)  # let the last copies drain
        cpu = _cpu_s(pid) - cpu0
    except OSError as exc:
        raise SimError(f"the mosquitto load run failed: {exc}") from None
    finally:
        for c in clients:
            c.loop_stop()
            c.disconnect()
    return cpu, sent, got[0]


def measure(say: Say, seconds: float = 6.0, subscribers: int = 8) -> BrokerModel:
    """CPU seconds per publish, per delivery and per delivered byte of mosquitto here.

    Raises:
        SimError: No mosquitto, or the run delivered nothing.
    """
    out = []
    with _mosquitto() as (pid, port):
        for payload, rate in ((HB_BYTES, 2000.0), (BIG_BYTES, 300.0)):
            cpu, sent, got = _run(pid, port, subscribers, payload, rate, seconds)
            if got == 0 or cpu <= 0:
                raise SimError(f"the mosquitto load run delivered {got} copies in "
                               f"{cpu:.2f} CPU s: nothing to measure")
            say(f"mosquitto: {sent} publishes of {payload} B, {got} deliveries, "
                f"{cpu:.2f} broker CPU s ({got / cpu:,.0f} deliveries per CPU s)")
            out.append((payload, cpu / got))
    (small, c_small), (big, c_big) = out
    per_byte = max(0.0, (c_big - c_small) / (big - small))
    per_copy = max(1e-9, c_small - small * per_byte)
    # A publish costs the broker about one delivery's work (read, parse, route).
    return BrokerModel(per_publish_s=per_copy, per_delivery_s=per_copy, per_byte_s=per_byte)


def scaled(service_rate: float) -> BrokerModel:
    """The measured model, scaled so that one core serves ``service_rate`` heartbeat copies/s."""
    k = DEFAULT_MODEL.service_rate() / service_rate
    return BrokerModel(DEFAULT_MODEL.per_publish_s * k, DEFAULT_MODEL.per_delivery_s * k,
                       DEFAULT_MODEL.per_byte_s * k)
