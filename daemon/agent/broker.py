"""The embedded MQTT broker (amqtt, pure Python) for the single-box default.

``chaosd`` with ``broker = "embedded"`` hosts it in-process.
``python -m daemon.agent.broker`` runs it on its own, which the demo and the tests use so that
killing a node never takes the broker with it. It speaks MQTT 3.1.1, which is all chaosd relies on.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import signal
import socket
import sys

from daemon.contracts.errors import BusError

log = logging.getLogger("chaosd.broker")


def _config(bind: str, port: int) -> dict[str, object]:
    return {
        "listeners": {"default": {"type": "tcp", "bind": f"{bind}:{port}", "max_connections": 0}},
        # Anonymous on loopback only by default; $SYS and packet logging cost CPU for nothing.
        "plugins": {"amqtt.plugins.authentication.AnonymousAuthPlugin": {"allow_anonymous": True}},
    }


def port_free(bind: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((bind, port))
        except OSError:
            return False
    return True


class EmbeddedBroker:
    """An amqtt broker listening on ``bind:port``."""

    def __init__(self, bind: str, port: int) -> None:
        self.bind = bind
        self.port = port
        self._broker: object | None = None

    async def start(self) -> None:
        if not port_free(self.bind, self.port):
            raise BusError(
                f"embedded broker: {self.bind}:{self.port} is in use; set mqtt.embedded_port "
                f"or point broker at the running one (mqtt://{self.bind}:{self.port})"
            )
        from amqtt.broker import Broker  # heavy import: only where a broker is hosted

        # amqtt logs every connect/disconnect at INFO; keep our logs readable.
        logging.getLogger("amqtt").setLevel(logging.WARNING)
        logging.getLogger("transitions").setLevel(logging.WARNING)
        broker = Broker(_config(self.bind, self.port))
        await broker.start()
        self._broker = broker
        log.info("embedded broker listening on %s:%d", self.bind, self.port)

    async def stop(self) -> None:
        broker, self._broker = self._broker, None
        if broker is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(broker.shutdown(), timeout=5)  # type: ignore[attr-defined]


async def _serve(bind: str, port: int) -> None:
    broker = EmbeddedBroker(bind, port)
    await broker.start()
    print(f"ready {port}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await broker.stop()


def main(argv: list[str] | None = None) -> int:
    """``python -m daemon.agent.broker [--bind HOST] [--port N]``: run the embedded broker alone."""
    parser = argparse.ArgumentParser(prog="python -m daemon.agent.broker", description=__doc__)
    parser.add_argument("--bind", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=1883)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    try:
        asyncio.run(_serve(args.bind, args.port))
    except BusError as exc:
        print(f"chaos-broker: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
