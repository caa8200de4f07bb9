"""The MQTT bus: one aiomqtt client inside an outer reconnect loop (aiomqtt's recipe).

While the broker is away nothing local is lost: heartbeats (QoS 0) are simply not sent, and
reliable messages (requests, commands) wait in a bounded outbox that is flushed, in order, as
soon as the connection is back. Each (re)connect calls ``on_connect`` so the node can
re-announce itself.

The subscriptions are a wanted set that the node may change at any time (a follower hears
only the scheduler's heartbeat, the scheduler hears everyone's): :meth:`Bus.want` sets it,
:meth:`Bus.sync` makes the broker agree, and every (re)connect subscribes the whole set again
(the session is clean, so the broker forgets it with the connection).

With a cluster secret, the bus seals every payload as it hands it to the broker (so a message
that waited in the outbox carries the time it was really sent) and opens every payload before
the node sees it (daemon.contracts.signing); one that fails goes to ``on_auth_error`` instead.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import aiomqtt

from daemon.contracts.config import Config
from daemon.contracts.messages import Topics
from daemon.contracts.signing import AuthError, ControlAuth

log = logging.getLogger("chaosd.bus")
OUTBOX_LIMIT = 1000
CALL_TIMEOUT_S = 5.0
QOS0_TIMEOUT_S = 0.25
PUBLISH_TIMEOUT_S = 1.0  # a QoS 1 message that times out is queued again, never lost


@dataclass(frozen=True)
class Outgoing:
    topic: str
    payload: bytes
    qos: int
    retain: bool


class Bus:
    """Connect, subscribe, dispatch, publish; reconnect forever with capped backoff."""

    def __init__(
        self,
        cfg: Config,
        *,
        client_id: str,
        will: Outgoing | Callable[[], Outgoing],
        subscriptions: list[str],
        on_message: Callable[[str, bytes], None],
        on_connect: Callable[[], Awaitable[None]],
        on_disconnect: Callable[[], None],
        on_auth_error: Callable[[str, AuthError], None] | None = None,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self._cfg = cfg
        self._client_id = client_id
        self._will = will  # a callable is asked again at every connect
        self._on_auth_error = on_auth_error
        self._wall = wall
        key = cfg.control_key
        self.auth = ControlAuth(key, cfg.auth_window_s) if key is not None else None
        self._topics = Topics(cfg.cluster)
        self._wanted = set(subscriptions)
        self._active: set[str] = set()  # what the broker holds for this connection
        self._on_message = on_message
        self._on_connect = on_connect
        self._on_disconnect = on_disconnect
        self._client: aiomqtt.Client | None = None
        self._outbox: deque[Outgoing] = deque(maxlen=OUTBOX_LIMIT)
        self.connected = False
        self.connects = 0
        self.dropped = 0

    def _make_client(self) -> aiomqtt.Client:
        scheme, host, port = self._cfg.broker_endpoint
        mq = self._cfg.mqtt
        tls: ssl.SSLContext | None = None
        if scheme == "mqtts":
            tls = ssl.create_default_context(cafile=mq.ca_file or None)
            if mq.cert_file:  # mutual TLS: the broker asks for a certificate from the CA
                tls.load_cert_chain(mq.cert_file, mq.key_file or None)
            if mq.tls_insecure:
                tls.check_hostname = False
                tls.verify_mode = ssl.CERT_NONE
        will = self._will() if callable(self._will) else self._will
        return aiomqtt.Client(
            host,
            port,
            identifier=self._client_id,
            username=mq.username or None,
            password=mq.password or None,
            keepalive=mq.keepalive_s,
            will=aiomqtt.Will(will.topic, self.seal(will.topic, will.payload), will.qos,
                              will.retain),
            clean_session=True,
            tls_context=tls,
            timeout=CALL_TIMEOUT_S,
        )

    async def run(self) -> None:
        """Run until cancelled; never raises on broker trouble."""
        backoff = self._cfg.mqtt.reconnect_min_s
        last_error = ""
        while True:
            client = self._make_client()
            try:
                async with client:
                    self._client = client
                    self._active = set(self._wanted)
                    await self._subscribe(client, sorted(self._active))
                    self.connected = True
                    self.connects += 1
                    last_error = ""
                    backoff = self._cfg.mqtt.reconnect_min_s
                    log.info("connected to broker %s", self._cfg.broker)
                    await self._on_connect()
                    await self._flush()
                    async for message in client.messages:
                        payload = message.payload
                        if isinstance(payload, (bytes, bytearray)):
                            self.deliver(message.topic.value, bytes(payload),
                                         retained=bool(message.retain))
            except aiomqtt.MqttError as exc:
                if self.connected:
                    log.warning("lost the broker: %s; reconnecting", exc)
                elif str(exc) != last_error:
                    # Once per distinct reason, so a refused login or a wrong port is visible
                    # at the default level without a line every backoff.
                    log.warning("cannot connect to broker %s: %s; retrying", self._cfg.broker,
                                exc)
                last_error = str(exc)
            finally:
                self._client = None
                self._active = set()
                if self.connected:
                    self.connected = False
                    self._on_disconnect()
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, self._cfg.mqtt.reconnect_max_s)

    @property
    def subscriptions(self) -> frozenset[str]:
        """The topic filters this node wants (held by the broker while connected)."""
        return frozenset(self._wanted)

    def want(self, topics: set[str]) -> None:
        """Set the wanted subscriptions; :meth:`sync` (or the next connect) applies them."""
        self._wanted = set(topics)

    async def sync(self) -> None:
        """Subscribe what is wanted and not held, unsubscribe what is held and not wanted.

        Never raises on broker trouble: what failed is retried at the next call, and a lost
        connection subscribes the whole set again when it comes back.
        """
        client = self._client
        if client is None or not self.connected:
            return
        add, drop = sorted(self._wanted - self._active), sorted(self._active - self._wanted)
        if not add and not drop:
            return
        self._active = (self._active | set(add)) - set(drop)
        try:
            if add:
                await self._subscribe(client, add)
            if drop:
                await client.unsubscribe(drop, timeout=CALL_TIMEOUT_S)
        except aiomqtt.MqttError as exc:
            log.debug("subscription change failed: %s", exc)
            self._active = (self._active - set(add)) | set(drop)  # try again next time

    @staticmethod
    async def _subscribe(client: aiomqtt.Client, topics: list[str]) -> None:
        # One SUBSCRIBE packet for them all: the scheduler changes ~N filters at once.
        if topics:
            await client.subscribe([(t, 1) for t in topics], timeout=CALL_TIMEOUT_S)

    def seal(self, topic: str, payload: bytes) -> bytes:
        """``payload`` signed for ``topic`` now; unchanged when insecure, or empty (an empty
        retained payload only clears a topic)."""
        if self.auth is None or not payload:
            return payload
        return self.auth.seal(topic, payload, self._wall())

    def deliver(self, topic: str, payload: bytes, *, retained: bool = False) -> None:
        """Open one payload from the broker and hand it to ``on_message``, or report it."""
        if self.auth is not None and payload:
            try:
                payload = self.auth.open(topic, payload, self._wall(), retained=retained,
                                         retainable=self._topics.retainable(topic),
                                         timeless=self._topics.is_status(topic))
            except AuthError as exc:
                if self._on_auth_error is not None:
                    self._on_auth_error(topic, exc)
                else:
                    log.debug("dropped a message on %s: %s", topic, exc)
                return
        self._on_message(topic, payload)

    async def publish(self, topic: str, payload: bytes, *, qos: int = 0,
                      retain: bool = False, reliable: bool = False) -> bool:
        """Publish now if connected. ``reliable`` messages are queued while disconnected.

        Returns:
            True if handed to the broker, False if dropped or queued.
        """
        out = Outgoing(topic, payload, qos, retain)
        client = self._client
        if client is None or not self.connected:
            if reliable:
                self._outbox.append(out)
            else:
                self.dropped += 1
            return False
        # A QoS 0 message (a heartbeat) is stale within a second; waiting longer on a dead
        # connection would only delay the next one and make a live node look silent.
        timeout = PUBLISH_TIMEOUT_S if qos else QOS0_TIMEOUT_S
        try:
            await client.publish(topic, self.seal(topic, payload), qos=qos, retain=retain,
                                 timeout=timeout)
            return True
        except aiomqtt.MqttError as exc:
            log.debug("publish to %s failed: %s", topic, exc)
            if reliable:
                self._outbox.append(out)
            else:
                self.dropped += 1
            return False

    async def _flush(self) -> None:
        while self._outbox and self._client is not None:
            out = self._outbox.popleft()
            try:
                await self._client.publish(out.topic, self.seal(out.topic, out.payload),
                                           qos=out.qos, retain=out.retain, timeout=CALL_TIMEOUT_S)
            except aiomqtt.MqttError:
                self._outbox.appendleft(out)
                raise

    @property
    def queued(self) -> int:
        return len(self._outbox)
