"""Authenticated control messages: an HMAC-SHA256 envelope over the JSON of messages.py.

A sealed payload is the message's JSON with two members appended, in this order::

    {"v":1,"kind":"hb",...,"_ts":1712345678123456,"_sig":"<64 hex digits>"}

``_ts`` is the sender's wall clock in integer microseconds when it handed the message to the
broker. ``_sig`` is ``HMAC-SHA256(control_key, topic || 0x00 || P)``, where ``P`` is every
byte of the payload before ``,"_sig":``. The MAC covers exact bytes (no JSON canonicalisation)
and the topic (a command for one node cannot be replayed onto another's topic). The key is
derived from the cluster secret with a label of its own (:func:`control_key`), so it is never
the data plane's key.

Freshness (docs/control-protocol.md has the reasoning per message type):

* a message delivered *live* must carry a ``_ts`` within ``window_s`` of the receiver's clock,
  and the same signature is accepted only once (a replay cache that spans the window);
* a *retained* delivery (the broker replaying its stored copy to a new subscription) may be
  old; only the retained topics (status, leader claim, cluster state) accept one, and the node
  fences those by incarnation, term and version;
* the non-retained topics (heartbeats, requests, commands) never accept a retained delivery.

Everything that fails raises :class:`AuthError` and nothing else; the layer keeps no state
beyond the replay cache, so a bad payload cannot change anything.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
from collections import OrderedDict

from daemon.contracts.errors import MessageError

# messages.MAX_PAYLOAD, repeated so that config (which derives the key) need not import
# messages (which imports config); tests/unit/test_signing.py checks that they agree.
MAX_BODY = 256 * 1024

LABEL = b"chaos control-plane v1"
SIG_HEX = 64
_SIG_OPEN = b',"_sig":"'
_SIG_TAIL = len(_SIG_OPEN) + SIG_HEX + 2  # ,"_sig":"<hex>"}
_TS_RE = re.compile(rb',"_ts":(\d{1,20})\Z')
ENVELOPE_MAX = 128  # bytes a seal adds, at most
MAX_SEALED = MAX_BODY + ENVELOPE_MAX
DEFAULT_WINDOW_S = 60.0
# The replay cache holds one entry per accepted live message for 2x the window; heartbeats of a
# large cluster fill it fastest (2/s/node). Past this, the oldest are forgotten early, which
# only matters for a replay inside the window *and* past this many fresher messages.
REPLAY_CACHE_MAX = 200_000


class AuthError(MessageError):
    """A control message that failed authentication; ``reason`` is a short category."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason


def _is_will(body: bytes) -> bool:
    """Is ``body`` a last will: a status that says its connection was lost?"""
    try:
        doc = json.loads(body)
    except ValueError:
        return False
    return isinstance(doc, dict) and doc.get("online") is False and doc.get("reason") == "lost"


def control_key(secret: str, cluster: str) -> bytes:
    """The control plane's HMAC key: HMAC-SHA256(secret, label || 0 || cluster).

    The label keeps it apart from the data plane's key (SHA-256 of the secret); the cluster
    name keeps two clusters that share a secret by mistake apart.
    """
    return hmac.new(secret.encode(), LABEL + b"\x00" + cluster.encode(), hashlib.sha256).digest()


def _mac(key: bytes, topic: str, signed: bytes) -> bytes:
    return hmac.new(key, topic.encode() + b"\x00" + signed, hashlib.sha256).hexdigest().encode()


class ControlAuth:
    """Seal outgoing payloads and open incoming ones for one node.

    Args:
        key: from :func:`control_key`.
        window_s: how far a live message's ``_ts`` may be from the receiver's clock.
    """

    def __init__(self, key: bytes, window_s: float = DEFAULT_WINDOW_S) -> None:
        if len(key) < 16:
            raise ValueError("control key too short")
        self._key = key
        self._window_us = int(window_s * 1e6)
        self._seen: OrderedDict[bytes, int] = OrderedDict()  # sig -> its _ts, oldest first

    def seal(self, topic: str, body: bytes, now: float) -> bytes:
        """Sign ``body`` (a JSON object from :func:`~daemon.contracts.messages.encode`) for
        ``topic`` at wall-clock time ``now``."""
        if not body.startswith(b"{") or not body.endswith(b"}") or len(body) < 3:
            raise AuthError("unsealable", "not a non-empty JSON object")
        signed = body[:-1] + b',"_ts":' + str(int(now * 1e6)).encode()
        return signed + _SIG_OPEN + _mac(self._key, topic, signed) + b'"}'

    def open(self, topic: str, payload: bytes, now: float, *, retained: bool = False,
             retainable: bool = False, timeless: bool = False) -> bytes:
        """Check a sealed payload; return the message's JSON without the envelope.

        Args:
            topic: the topic it arrived on (it is part of what is signed).
            payload: the raw MQTT payload.
            now: the receiver's wall clock, in seconds.
            retained: the broker delivered its retained copy (the MQTT RETAIN flag).
            retainable: the topic legitimately carries retained messages.
            timeless: a presence topic, where a last will comes live but was signed when
                its connection opened, maybe hours before: a will outside the window is
                accepted (the receiver fences it by incarnation and connection time), any
                other message outside it is still ``stale``.

        Raises:
            AuthError: ``oversized``, ``unsigned``, ``bad-signature``, ``retained`` (a retained
                copy on a topic that is never retained), ``stale`` or ``replayed``.
        """
        if len(payload) > MAX_SEALED:
            raise AuthError("oversized", f"{len(payload)} bytes")
        cut = len(payload) - _SIG_TAIL
        if cut < 2 or payload[cut:cut + len(_SIG_OPEN)] != _SIG_OPEN \
                or not payload.endswith(b'"}'):
            raise AuthError("unsigned", "no signature")
        signed, sig = payload[:cut], payload[cut + len(_SIG_OPEN):-2]
        if not hmac.compare_digest(_mac(self._key, topic, signed), sig):
            raise AuthError("bad-signature", "wrong key, or altered in transit")
        match = _TS_RE.search(signed)
        if match is None:  # only a signer with the key could have made this
            raise AuthError("unsigned", "no timestamp")
        ts = int(match.group(1))
        body = signed[:match.start()] + b"}"
        if retained:
            if not retainable:
                raise AuthError("retained", "a retained copy on a topic that is never retained")
            return body  # old by nature: fenced by incarnation, term and version
        now_us = int(now * 1e6)
        if abs(now_us - ts) > self._window_us:
            if timeless and _is_will(body):
                return body
            raise AuthError("stale", f"timestamp {(ts - now_us) / 1e6:+.1f} s off this clock")
        self._expire(now_us)
        if sig in self._seen:
            raise AuthError("replayed", "seen before")
        self._seen[sig] = ts
        return body

    def _expire(self, now_us: int) -> None:
        # Entries are inserted in arrival order, which is ts order to within the window; an
        # entry older than the window can never match again (its ts would be refused).
        seen = self._seen
        while seen:
            sig, ts = next(iter(seen.items()))
            if now_us - ts <= self._window_us and len(seen) < REPLAY_CACHE_MAX:
                break
            del seen[sig]
