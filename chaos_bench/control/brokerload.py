"""The broker's own account of its load: mosquitto's ``$SYS`` counters and its CPU time.

mosquitto publishes cumulative counters under ``$SYS/broker/`` every ``sys_interval`` seconds
(the control bench starts it with ``sys_interval 1``). Two readings a window apart give
messages received (publishes from the nodes) and sent (deliveries to subscribers) per second,
and bytes both ways. The reader's own subscription is a client too: the ``$SYS`` messages it
receives are counted and taken out of ``sent``. The CPU is the broker process's user+system
time over the same window, from psutil.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any

import psutil

MOSQUITTO_CONF = "sys_interval 1\n"
COUNTERS = {
    "$SYS/broker/publish/messages/received": "received",
    "$SYS/broker/publish/messages/sent": "sent",
    "$SYS/broker/bytes/received": "bytes_received",
    "$SYS/broker/bytes/sent": "bytes_sent",
}
FIRST_READING_S = 5.0  # mosquitto publishes them within sys_interval of a subscription


class BrokerLoadError(RuntimeError):
    """The broker's counters could not be read (not mosquitto, or no ``sys_interval``)."""


@dataclass(frozen=True)
class BrokerLoad:
    """Rates over one window, as the broker counted them."""

    seconds: float
    publishes_per_s: float   # PUBLISH packets the broker received
    deliveries_per_s: float  # PUBLISH packets it sent to subscribers (ours taken out)
    bytes_in_per_s: float
    bytes_out_per_s: float
    cpu_percent: float       # of one core


@dataclass(frozen=True)
class _Reading:
    at: float
    values: dict[str, int]
    own: int        # $SYS messages our reader had received by then
    cpu_s: float


class _SysReader:
    """A paho client that keeps the latest value of each counter."""

    def __init__(self, port: int) -> None:
        import paho.mqtt.client as mqtt  # aiomqtt's own dependency

        self._lock = threading.Lock()
        self._values: dict[str, int] = {}
        self._updated = 0.0
        self._own = 0
        self._client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2,
                                   client_id=f"chaos-bench-sys-{time.monotonic_ns()}")
        self._client.on_message = self._on_message
        self._client.connect("127.0.0.1", port)
        self._client.subscribe([(topic, 0) for topic in COUNTERS])
        self._client.loop_start()

    def _on_message(self, _client: Any, _userdata: Any, msg: Any) -> None:
        name = COUNTERS.get(msg.topic)
        try:
            value = int(msg.payload)
        except ValueError:
            return
        with self._lock:
            self._own += 1
            if name is not None:
                self._values[name] = value
                if name == "sent":
                    self._updated = time.monotonic()

    def read(self, after: float, timeout: float, pid: int) -> _Reading:
        """The counters as first published after ``after`` (monotonic)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._lock:
                if self._updated > after and len(self._values) == len(COUNTERS):
                    times = psutil.Process(pid).cpu_times()
                    return _Reading(self._updated, dict(self._values), self._own,
                                    times.user + times.system)
            time.sleep(0.02)
        raise BrokerLoadError("the broker published no $SYS counters (is it mosquitto with "
                              "'sys_interval 1'?)")

    def close(self) -> None:
        self._client.loop_stop()
        self._client.disconnect()


def measure(port: int, pid: int, seconds: float) -> BrokerLoad:
    """Count the broker's traffic and CPU over about ``seconds``.

    Args:
        port: the broker's port on 127.0.0.1.
        pid: the broker's process id (for its CPU time).
        seconds: the window; it is aligned to the broker's own counter updates.
    """
    reader = _SysReader(port)
    try:
        first = reader.read(time.monotonic(), FIRST_READING_S, pid)
        # The retained first values arrive at once: start from the next periodic update.
        start = reader.read(first.at + 0.01, FIRST_READING_S, pid)
        time.sleep(max(0.0, seconds - 0.5))
        end = reader.read(start.at + seconds - 0.5, FIRST_READING_S + 1.0, pid)
    finally:
        reader.close()
    dt = end.at - start.at

    def rate(name: str) -> float:
        return (end.values[name] - start.values[name]) / dt

    return BrokerLoad(
        seconds=round(dt, 3),
        publishes_per_s=rate("received"),
        deliveries_per_s=max(0.0, rate("sent") - (end.own - start.own) / dt),
        bytes_in_per_s=rate("bytes_received"),
        bytes_out_per_s=rate("bytes_sent"),
        cpu_percent=100.0 * (end.cpu_s - start.cpu_s) / dt,
    )
