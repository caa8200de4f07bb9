"""chaosd: startup, main loop, shutdown (the uvicorn shape).

Signal handlers only set flags. The main loop ticks every 0.1 s and exits on ``should_exit``;
a second SIGINT/SIGTERM forces the exit. Shutdown is bounded: say 'left' on the bus, stop the
control socket and the broker, then cancel whatever is still running.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import inspect
import logging
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from daemon.agent.broker import EmbeddedBroker
from daemon.agent.control import ControlServer, Handler
from daemon.agent.copies import SnapshotCopies
from daemon.agent.node import NodeAgent
from daemon.agent.ops import HANDLERS as OPS
from daemon.agent.probes import LinkMonitor
from daemon.agent.systemd import Notifier
from daemon.agent.views import HANDLERS
from daemon.contracts.config import Config, load_config, require_secret
from daemon.contracts.errors import ChaosError, ConfigError

log = logging.getLogger("chaosd")
TICK_S = 0.1
SHUTDOWN_S = 3.0


class Daemon:
    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg
        self.agent = NodeAgent(cfg)
        self.notifier = Notifier()
        self.broker: EmbeddedBroker | None = None
        self.control = ControlServer(cfg.socket, self._handlers())
        self._tasks: list[asyncio.Task[None]] = []
        self._signals = 0

    def _handlers(self) -> dict[str, Handler]:
        agent = self.agent

        def bind(fn: Callable[[NodeAgent, dict[str, Any]], Any]) -> Handler:
            async def call(args: dict[str, Any]) -> Any:
                result = fn(agent, args)
                return await result if inspect.isawaitable(result) else result
            return call

        out: dict[str, Handler] = {op: bind(fn) for op, fn in HANDLERS.items()}
        out.update((op, bind(fn)) for op, fn in OPS.items())
        return out

    def _on_signal(self, signum: int) -> None:
        self._signals += 1
        if self._signals > 1:
            log.warning("second %s: forcing exit", signal.Signals(signum).name)
            raise SystemExit(1)
        log.info("%s: shutting down", signal.Signals(signum).name)
        self.agent.should_exit = True

    async def serve(self) -> int:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, self._on_signal, sig)
        try:
            await self.startup()
            await self.main_loop()
        finally:
            await self.shutdown()
        return 1 if self.agent.exit_reason else 0

    async def startup(self) -> None:
        Path(self.cfg.data_dir).mkdir(parents=True, exist_ok=True)
        await self.control.start()
        self.agent.metrics.start()  # a taken address ends chaosd here, in one line (exit 1)
        if self.cfg.probe.enabled:
            agent = self.agent
            monitor = LinkMonitor(self.cfg.probe, self.cfg.advertise, agent.request)
            await monitor.start()
            agent.monitor = monitor
        if self.cfg.snapshots.enabled:
            copies = SnapshotCopies(self.cfg, self.agent.clock, self.agent.restore_from_copy)
            await copies.start()
            self.agent.copies = copies
        if self.cfg.broker == "embedded":
            self.broker = EmbeddedBroker(self.cfg.mqtt.embedded_bind, self.cfg.mqtt.embedded_port)
            await self.broker.start()
        self._tasks.append(asyncio.create_task(self.agent.bus.run(), name="bus"))
        self._tasks.append(asyncio.create_task(self._heartbeats(), name="heartbeats"))
        if self.cfg.insecure:
            log.warning("INSECURE development mode: control messages are neither signed nor "
                        "checked, so any client of the broker can steer this cluster%s",
                        "" if self.cfg.secret else "; the data plane's key derives from the "
                        "cluster name and protects nothing")
        log.info("chaosd %s up: cluster %s, broker %s, socket %s", self.cfg.node_id,
                 self.cfg.cluster, self.cfg.broker, self.cfg.socket)
        self.notifier.ready(f"node {self.cfg.node_id} in cluster {self.cfg.cluster}")
        # Back from a reboot or a crash mid-job: the job starts again, and its worker rejoins
        # by scale-out (or, if the whole cluster went down, is held with the state it has).
        job = self.agent.supervisor.resume()
        if job is not None:
            self.agent.worker.neighbors = list(job.neighbors)

    async def _heartbeats(self) -> None:
        while True:
            await self.agent.heartbeat()
            await asyncio.sleep(self.cfg.detector.heartbeat_interval_s)

    async def main_loop(self) -> None:
        loop = asyncio.get_running_loop()
        next_watchdog = 0.0
        while not self.agent.should_exit:
            try:
                await self.agent.tick()
            except Exception:  # a bug in one decision must not take the node off the bus
                self.agent.counters["tick_errors"] += 1
                log.exception("tick failed; carrying on")
            for task in self._tasks:
                if task.done() and not task.cancelled() and task.exception() is not None:
                    raise task.exception()  # type: ignore[misc]
            # The watchdog is fed from the loop itself, so a wedged loop gets restarted.
            interval = self.notifier.watchdog_interval_s
            if interval is not None and loop.time() >= next_watchdog:
                self.notifier.watchdog()
                next_watchdog = loop.time() + interval
            await asyncio.sleep(TICK_S)

    async def shutdown(self) -> None:
        self.notifier.stopping()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.agent.leave(), timeout=SHUTDOWN_S)
        await self.agent.supervisor.stop()
        if self.agent.monitor is not None:
            await self.agent.monitor.stop()
        if self.agent.copies is not None:
            await self.agent.copies.close()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.control.stop()
        self.agent.metrics.stop()
        if self.broker is not None:
            await self.broker.stop()
        log.info("chaosd %s stopped", self.cfg.node_id)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="chaosd", description="Chaos node agent (see chaosd(8)).")
    p.add_argument("--config", help="TOML config file (default /etc/chaos/chaosd.toml if present)")
    p.add_argument("--node-id")
    p.add_argument("--cluster")
    p.add_argument("--broker", help="embedded | mqtt://host:port | mqtts://host:port")
    p.add_argument("--socket", help="control socket path")
    p.add_argument("--advertise", help="address peers use to reach this node")
    p.add_argument("--data-dir")
    p.add_argument("--log-level", choices=["debug", "info", "warning", "error"])
    p.add_argument("--insecure", action="store_true", default=None,
                   help="development only: run without a secret; control messages unsigned")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        cfg = load_config(args.config, node_id=args.node_id, cluster=args.cluster,
                          broker=args.broker, socket=args.socket, advertise=args.advertise,
                          data_dir=args.data_dir, log_level=args.log_level,
                          insecure=args.insecure)
        require_secret(cfg)
    except ConfigError as exc:
        print(f"chaosd: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(level=cfg.log_level.upper(), stream=sys.stderr,
                        format=f"%(asctime)s {cfg.node_id} %(levelname)s %(name)s: %(message)s")
    try:
        return asyncio.run(Daemon(cfg).serve())
    except ChaosError as exc:
        print(f"chaosd: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 1


if __name__ == "__main__":
    sys.exit(main())
