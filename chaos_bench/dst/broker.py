"""A simulated MQTT 3.1.1 broker, and the agent's bus on top of it.

The broker keeps what chaosd relies on, and breaks it the ways a real one does:

- clean sessions: a client's subscriptions live as long as its connection;
- topic filters with ``+`` and ``#``; a new subscription gets the matching retained messages;
- retained messages (an empty payload clears one), lost when the broker restarts without
  persistence;
- QoS 0 may be lost; QoS 1 reaches every connected subscriber, sometimes twice; a delivery in
  flight when the subscriber's connection ends is lost, and so is everything in flight when
  the broker restarts;
- each connection is one TCP stream, in order both ways (what a client publishes reaches the
  broker in order, and what the broker sends a client arrives in order); latency with jitter,
  and now and then a long stall that holds up everything behind it, so messages of different
  senders overtake each other;
- the last will of a connection that ends without a goodbye (a crash, or silence for 1.5
  keepalives: a frozen box or a cut link), published as the client asked.

:class:`SimBus` is the agent's real :class:`~daemon.agent.bus.Bus` with its network half
replaced: publishing, subscribing, the outbox of reliable messages while disconnected, and a
reconnect loop with the real backoff, all on the simulated clock.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from chaos_bench.dst.loop import Sim, drive
from daemon.agent.bus import Bus, Outgoing
from daemon.contracts.config import Config

KEEPALIVE_GRACE = 1.5  # the broker drops a silent client after 1.5 keepalives (MQTT 3.1.1)


def matches(pattern: str, topic: str) -> bool:
    """MQTT topic filter matching (``+`` one level, ``#`` the rest)."""
    pp, tp = pattern.split("/"), topic.split("/")
    for i, part in enumerate(pp):
        if part == "#":
            return True
        if i >= len(tp) or (part != "+" and part != tp[i]):
            return False
    return len(pp) == len(tp)


@dataclass
class Net:
    """How the simulated network treats a message (seconds, probabilities)."""

    latency_s: float = 0.002
    jitter_s: float = 0.004
    delay_p: float = 0.0  # a message now and then takes delay_s longer (it is overtaken)
    delay_s: float = 0.8
    qos0_loss_p: float = 0.0
    dup_p: float = 0.0  # a QoS 1 delivery that arrives twice


@dataclass(eq=False)
class Session:
    """One connection of one client."""

    client: SimBus
    epoch: int
    filters: set[str] = field(default_factory=set)
    will: Outgoing | None = None
    down_at: float = 0.0  # when the last message sent down this connection arrives


class SimBroker:
    """The broker, with its retained store, sessions and the faults of a real one."""

    def __init__(self, sim: Sim, net: Net, count: Callable[[str], None]) -> None:
        self.sim, self.net, self.count = sim, net, count
        self.up = True
        self.retained: dict[str, bytes] = {}
        self.sessions: dict[str, Session] = {}  # client id -> its live session
        self._epoch = 0  # every connection (and every broker life) has its own number
        self.life = 0

    # --- connections --------------------------------------------------------------------
    def connect(self, client: SimBus) -> Session | None:
        if not self.up:
            return None
        old = self.sessions.pop(client.client_id, None)
        if old is not None:  # a client id taking over its own old session: no will
            old.client.lost_session(old.epoch)
        self._epoch += 1
        s = Session(client, self._epoch, will=client.will_now())
        self.sessions[client.client_id] = s
        return s

    def owns(self, client: SimBus, epoch: int) -> bool:
        """Whether ``epoch`` is ``client``'s live session."""
        s = self.sessions.get(client.client_id)
        return self.up and s is not None and s.epoch == epoch

    def disconnect(self, client: SimBus, epoch: int, graceful: bool) -> None:
        """The connection ends: said (no will) or not (the will is published)."""
        s = self.sessions.get(client.client_id)
        if s is None or s.epoch != epoch:
            return
        del self.sessions[client.client_id]
        client.lost_session(epoch)
        if not graceful and s.will is not None:
            self.count("will")
            w = s.will
            self.publish(None, w.topic, w.payload, w.qos, w.retain)

    def restart(self, down_s: float, persistent: bool = False) -> None:
        """The broker goes down for ``down_s`` and comes back empty (unless persistent)."""
        if not self.up:
            return
        self.up = False
        self.life += 1
        sessions, self.sessions = list(self.sessions.values()), {}
        for s in sessions:
            s.client.lost_session(s.epoch)
        if not persistent:
            self.retained.clear()
        self.sim.at(down_s, self._back)

    def _back(self) -> None:
        self.up = True
        self.sim.note("broker up")

    # --- traffic ------------------------------------------------------------------------
    def subscribe(self, client: SimBus, epoch: int, filters: list[str]) -> None:
        s = self.sessions.get(client.client_id)
        if s is None or s.epoch != epoch:
            return
        new = [f for f in filters if f not in s.filters]
        s.filters.update(filters)
        for topic in sorted(self.retained):
            if any(matches(f, topic) for f in new):
                self._deliver(s, topic, self.retained[topic], 1, retained=True)

    def unsubscribe(self, client: SimBus, epoch: int, filters: list[str]) -> None:
        s = self.sessions.get(client.client_id)
        if s is not None and s.epoch == epoch:
            s.filters.difference_update(filters)

    def publish(self, sender: SimBus | None, topic: str, payload: bytes, qos: int,
                retain: bool) -> None:
        """A message the broker has received (from ``sender``, or a will)."""
        if not self.up:
            return
        if retain:
            if payload:
                self.retained[topic] = payload
            else:
                self.retained.pop(topic, None)
        for s in list(self.sessions.values()):
            if any(matches(f, topic) for f in s.filters):
                self._deliver(s, topic, payload, qos, retained=False)

    def _deliver(self, s: Session, topic: str, payload: bytes, qos: int,
                 retained: bool) -> None:
        net, rng = self.net, self.sim.rng
        if qos == 0 and net.qos0_loss_p and rng.random() < net.qos0_loss_p:
            self.count("fault:qos0-lost")
            return
        copies = 2 if qos and net.dup_p and rng.random() < net.dup_p else 1
        if copies == 2:
            self.count("fault:duplicated")
        life = self.life
        for _ in range(copies):
            delay = net.latency_s + rng.random() * net.jitter_s
            if net.delay_p and rng.random() < net.delay_p:
                self.count("fault:delayed")
                delay += rng.random() * net.delay_s
            at = max(self.sim.now + delay, s.down_at)  # one stream: in order
            s.down_at = at
            self.sim.at(at - self.sim.now,
                        lambda: self._arrive(s, life, topic, payload, retained))

    def _arrive(self, s: Session, life: int, topic: str, payload: bytes,
                retained: bool) -> None:
        if life != self.life or self.sessions.get(s.client.client_id) is not s:
            return  # the broker restarted, or the connection ended, on the way
        s.client.arrive(s.epoch, topic, payload, retained)


class SimBus(Bus):
    """The agent's bus on the simulated broker.

    The box it runs on tells it whether it can reach the broker (:attr:`reachable`) and
    whether it runs at all (:attr:`frozen`); the bus notices a lost connection as the real
    one does, after a keepalive of silence, and reconnects with the real backoff.
    """

    def __init__(self, sim: Sim, broker: SimBroker, cfg: Config, client_id: str,
                 will: Callable[[], Outgoing], on_message: Callable[[str, bytes], None],
                 on_connect: Callable[[], Any], on_disconnect: Callable[[], None],
                 subscriptions: list[str]) -> None:
        super().__init__(cfg, client_id=client_id, will=will, subscriptions=subscriptions,
                         on_message=on_message, on_connect=on_connect,
                         on_disconnect=on_disconnect, wall=sim.clock.wall)
        self.sim, self.broker = sim, broker
        self.client_id = client_id
        self.reachable = True  # a cut link: nothing passes either way
        self.frozen = False  # SIGSTOP: the process does nothing
        self.alive = True  # the process exists
        self._epoch = 0  # the broker's session epoch of our connection (0: none)
        self._backoff = cfg.mqtt.reconnect_min_s
        self._retry_pending = False
        self._inbox: list[tuple[int, str, bytes, bool]] = []  # arrived while frozen or cut
        self._pending: list[Outgoing] = []  # sent into a cut link not yet noticed (in TCP)
        self._cuts = 0
        self._freezes = 0
        self._up_at = 0.0  # when the last message we sent reaches the broker

    def will_now(self) -> Outgoing:
        will = self._will() if callable(self._will) else self._will
        return will

    # --- connection life ----------------------------------------------------------------
    def start(self) -> None:
        """The process starts: connect now."""
        self.alive, self.frozen = True, False
        self._try_connect()

    def _try_connect(self) -> None:
        self._retry_pending = False
        if not self.alive or self.connected:
            return
        if self.frozen:
            self._retry_later()
            return
        s = self.broker.connect(self) if self.reachable else None
        if s is None:
            self._retry_later()
            return
        self._epoch = s.epoch
        self._active = set(self._wanted)
        self.broker.subscribe(self, s.epoch, sorted(self._active))
        self.connected = True
        self.connects += 1
        self._backoff = self._cfg.mqtt.reconnect_min_s
        drive(self._on_connect())
        self._flush_outbox()

    def _retry_later(self) -> None:
        if self._retry_pending or not self.alive:
            return
        self._retry_pending = True
        delay, self._backoff = self._backoff, min(self._backoff * 2,
                                                  self._cfg.mqtt.reconnect_max_s)
        self.sim.at(delay, self._try_connect)

    def lost_session(self, epoch: int) -> None:
        """The broker ended our session (it restarted, or gave up on us); we notice when we
        next talk to it, which a live client does within a keepalive."""
        if epoch != self._epoch:
            return
        self._epoch = 0
        if self.alive and not self.frozen and self.connected:
            self.sim.at(0.05, self._notice_loss)

    def _notice_loss(self) -> None:
        if self.connected and self._epoch == 0 and self.alive and not self.frozen:
            self._drop()

    def _drop(self) -> None:
        self.connected = False
        self._active = set()
        # What waited in TCP on the dead connection: the real publish times out, and the
        # reliable messages go to the outbox for the next connection.
        pending, self._pending, self._inbox = self._pending, [], []
        self._outbox.extend(out for out in pending if out.qos)
        self._on_disconnect()
        self._retry_later()

    def link_cut(self) -> None:
        """Our link to the broker is cut. Both ends notice only after a keepalive of silence:
        until then what either sends waits in TCP and arrives once the link heals."""
        self.reachable = False
        self._cuts += 1
        cut, epoch = self._cuts, self._epoch
        keep = self._cfg.mqtt.keepalive_s
        self.sim.at(keep * KEEPALIVE_GRACE, lambda: self._broker_gives_up(cut, epoch))
        self.sim.at(keep, lambda: self._notice_cut(cut))

    def _broker_gives_up(self, cut: int, epoch: int) -> None:
        if not self.reachable and cut == self._cuts and epoch:
            self.broker.disconnect(self, epoch, graceful=False)

    def _notice_cut(self, cut: int) -> None:
        if (not self.reachable and cut == self._cuts and self.connected and self.alive
                and not self.frozen):
            self._epoch = 0
            self._drop()

    def link_healed(self) -> None:
        self.reachable = True
        if not self.alive:
            return
        if self.connected and self._epoch:
            # The connection outlived the cut: what waited in TCP goes through now.
            pending, self._pending = self._pending, []
            for out in pending:
                self._up(out)
            if not self.frozen:
                inbox, self._inbox = self._inbox, []
                for epoch, topic, payload, retained in inbox:
                    if epoch == self._epoch:
                        self.deliver(topic, payload, retained=retained)
        elif not self.connected:
            self._try_connect()

    def freeze(self) -> None:
        """SIGSTOP: the process stops; the broker drops it after 1.5 keepalives of silence."""
        self.frozen = True
        self._freezes += 1
        freeze, epoch = self._freezes, self._epoch
        self.sim.at(self._cfg.mqtt.keepalive_s * KEEPALIVE_GRACE,
                    lambda: self._frozen_timeout(freeze, epoch))

    def _frozen_timeout(self, freeze: int, epoch: int) -> None:
        if self.frozen and freeze == self._freezes and epoch == self._epoch and epoch:
            self.broker.disconnect(self, epoch, graceful=False)

    def thaw(self) -> None:
        """SIGCONT: messages that waited in the socket are read; a lost session is noticed."""
        self.frozen = False
        inbox: list[tuple[int, str, bytes, bool]] = []
        if self.reachable:  # still cut: they wait for the link
            inbox, self._inbox = self._inbox, []
        for epoch, topic, payload, retained in inbox:
            if epoch == self._epoch:
                self.deliver(topic, payload, retained=retained)
        if self.connected and self._epoch == 0:
            self._drop()
        elif not self.connected:
            self._try_connect()

    def kill(self) -> None:
        """The process dies (no goodbye): the broker sees the socket close and sends the will."""
        self.alive = False
        if self._epoch:
            self.broker.disconnect(self, self._epoch, graceful=False)
        self._epoch = 0
        self.connected = False
        self._outbox.clear()
        self._inbox.clear()

    def close(self) -> None:
        """A graceful exit: DISCONNECT, after what we sent before it, so no will."""
        epoch = self._epoch
        if epoch:
            self.sim.at(max(0.0, self._up_at - self.sim.now) + 1e-6,
                        lambda: self.broker.disconnect(self, epoch, graceful=True))
        self._epoch = 0
        self.connected = False
        self.alive = False

    # --- traffic ------------------------------------------------------------------------
    def arrive(self, epoch: int, topic: str, payload: bytes, retained: bool) -> None:
        if not self.alive or epoch != self._epoch:
            return
        if self.frozen or not self.reachable:
            self._inbox.append((epoch, topic, payload, retained))
            return
        self.deliver(topic, payload, retained=retained)

    async def publish(self, topic: str, payload: bytes, *, qos: int = 0,
                      retain: bool = False, reliable: bool = False) -> bool:
        out = Outgoing(topic, payload, qos, retain)
        if not self.connected or not self._epoch:
            # Disconnected: reliable messages wait in the outbox, the others are gone.
            if reliable:
                self._outbox.append(out)
            else:
                self.dropped += 1
            return False
        if not self.reachable:  # a cut not noticed yet: it waits in TCP
            self._pending.append(out)
            return True
        self._up(out)
        return True

    def _up(self, out: Outgoing) -> None:
        """Send one message up our stream: it reaches the broker after the link's latency,
        in order, if the connection is still the same then."""
        net = self.broker.net
        at = max(self.sim.now + net.latency_s + self.sim.rng.random() * net.jitter_s,
                 self._up_at)
        self._up_at = at
        epoch = self._epoch

        def reach() -> None:
            if epoch and self.broker.owns(self, epoch):
                self.broker.publish(self, out.topic, out.payload, out.qos, out.retain)

        self.sim.at(at - self.sim.now, reach)

    def _flush_outbox(self) -> None:
        while self._outbox and self.connected and self._epoch:
            self._up(self._outbox.popleft())

    async def sync(self) -> None:
        if not self.connected or not self._epoch:
            return
        add, drop = sorted(self._wanted - self._active), sorted(self._active - self._wanted)
        if not add and not drop:
            return
        self._active = (self._active | set(add)) - set(drop)
        if add:
            self.broker.subscribe(self, self._epoch, add)
        if drop:
            self.broker.unsubscribe(self, self._epoch, drop)

    async def run(self) -> None:  # pragma: no cover - the simulator drives the connection
        raise NotImplementedError("SimBus is driven by the simulator, not run")
