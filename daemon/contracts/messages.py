"""Versioned, validated MQTT messages and the topic names they travel on.

Every payload is a compact JSON object ``{"v": 1, "kind": ..., ...}``. :func:`decode` checks the
size, the version, the kind and every field's type (recursively, from the dataclass
annotations) and raises :class:`MessageError` on anything off, so a bad payload is one log line
and never a crash or a half-applied state. Unknown extra keys are ignored, which lets a newer
daemon of the same protocol version add fields.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import zlib
from dataclasses import dataclass, field
from typing import Any, ClassVar

from daemon.contracts.config import NAME_RE
from daemon.contracts.errors import MessageError
from daemon.contracts.kinds import EVENT_KINDS, NODE_STATES
from daemon.contracts.records import build
from daemon.contracts.statepack import pack, unpack

PROTOCOL_VERSION = 1
MAX_PAYLOAD = 256 * 1024
# The retained snapshot travels packed (daemon/contracts/statepack.py, docs/control-protocol.md):
# ``{"v": 2, "kind": "state", <the header fields>, "z": base85(deflate(JSON of the packed
# rest))}`` (base85: 5 characters per 4 bytes, none that JSON escapes). Version 2 so that a
# daemon that only knows the plain form drops it, rather than reading a snapshot without
# nodes. Plain (v1) snapshots are still accepted.
STATE_PACKED_VERSION = 2
STATE_HEADER = ("term", "leader", "version", "policy_version", "step")
MAX_UNPACKED = 64 << 20  # bytes a packed snapshot may inflate to (a 10,000-node one: ~10 MB)


class Topics:
    """Topic names under ``chaos/<cluster>/``, as DESIGN.md fixes them."""

    def __init__(self, cluster: str) -> None:
        self.root = f"chaos/{cluster}"

    def hb(self, node: str) -> str:
        return f"{self.root}/node/{node}/hb"

    def status(self, node: str) -> str:
        return f"{self.root}/node/{node}/status"

    def cmd(self, node: str) -> str:
        return f"{self.root}/node/{node}/cmd"

    @property
    def leader(self) -> str:
        return f"{self.root}/sched/leader"

    @property
    def req(self) -> str:
        return f"{self.root}/sched/req"

    @property
    def state(self) -> str:
        return f"{self.root}/cluster/state"

    def retainable(self, topic: str) -> bool:
        """Does ``topic`` legitimately carry retained messages (presence, claim, snapshot)?"""
        if topic in (self.leader, self.state):
            return True
        return topic.endswith("/status") and self.node_of(topic) is not None

    def is_status(self, topic: str) -> bool:
        """Is ``topic`` a node's presence (``node/<id>/status``)?"""
        return topic.endswith("/status") and self.node_of(topic) is not None

    def node_of(self, topic: str) -> str | None:
        """The node id in a ``node/<id>/...`` topic, if it is one."""
        parts = topic.split("/")
        if len(parts) == 5 and parts[2] == "node" and NAME_RE.match(parts[3]):
            return parts[3]
        return None


@dataclass(frozen=True)
class Heartbeat:
    KIND: ClassVar[str] = "hb"
    node: str
    seq: int
    incarnation: int
    step: int
    state: str
    cpu_percent: float
    mem_percent: float
    battery_percent: float | None = None
    # The sync policy the worker last committed a round under (-1: no worker, none yet).
    policy_version: int = -1
    # The scheduler this node follows ("": none yet): a scheduler contesting a claim counts
    # the nodes that train following it, and the newest step they hold.
    leader: str = ""
    # The newest step a snapshot on this node's disk holds, by its file name (-1: none): a
    # scheduler with no member left waits for the node to bring it (a power cut of every box).
    snapshot: int = -1
    # The step the attached worker holds (-1: no worker attached). Not policy_version: a
    # worker that restored a snapshot, or rejoins, holds a state before it commits a round.
    holds: int = -1
    # The attached worker's step time outside the collectives, averaged, and the elements its
    # rounds all-reduce (-1: not known): the policy controller's inputs.
    compute_ms: float = -1.0
    elements: int = -1
    # Why the attached worker cannot run DiLoCo's local steps ("": it can, or none attached):
    # the controller never switches the cluster into a diloco mode while a member says so.
    cannot_diloco: str = ""


@dataclass(frozen=True)
class Status:
    """Retained presence. The last will is a Status with ``online=False, reason="lost"``."""

    KIND: ClassVar[str] = "status"
    node: str
    online: bool
    reason: str  # "up" | "left" | "lost"
    incarnation: int
    addr: str = ""
    ts: float = 0.0
    probe_port: int = 0   # UDP RTT responder
    bw_port: int = 0      # bandwidth probe server
    bw_kind: str = ""     # "iperf3" or "bulk": both ends must speak the same tool
    # The best election term the node knew when it connected (0: it knows no cluster): a
    # newcomer that sees one above 0 knows a cluster with a state exists, and lets it lead.
    term: int = 0
    shelf_port: int = 0  # TCP port taking copies of snapshots (0: none), at ``addr``


@dataclass(frozen=True)
class LeaderClaim:
    KIND: ClassVar[str] = "leader"
    id: str
    term: int
    ts: float = 0.0
    training: int = -1  # nodes training under the claimant's policies (-1: not counted)
    step: int = -1  # the newest step its trainees committed (-1: not said): who keeps more


@dataclass(frozen=True)
class Request:
    """A node's request to whoever the scheduler is. Its ``args`` are one of the bodies of
    :mod:`daemon.contracts.protocol` (``op`` says which); ``reply``: the requester waits for
    a ``reply`` command naming ``req_id`` (the others get none)."""

    KIND: ClassVar[str] = "req"
    node: str
    req_id: str
    op: str
    args: dict[str, Any] = field(default_factory=dict)
    reply: bool = False


@dataclass(frozen=True)
class Command:
    """A scheduler's command; ``term`` fences it against stale schedulers. Its ``args`` are
    one of the bodies of :mod:`daemon.contracts.protocol` (``op`` says which)."""

    KIND: ClassVar[str] = "cmd"
    term: int
    leader: str
    seq: int
    op: str
    args: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class NodeRecord:
    state: str
    addr: str = ""
    neighbors: list[str] = field(default_factory=list)
    incarnation: int = 0
    joined_at: float = 0.0
    since: float = 0.0
    step: int = 0
    data_addr: str = ""  # host:port of the node's training worker, once attached
    # Wall time of the node's last heartbeat as the scheduler heard it, stamped when the
    # snapshot is published (followers hear only the scheduler: this is their news of the rest).
    heard_at: float | None = None


@dataclass(frozen=True)
class LinkRecord:
    a: str
    b: str
    state: str
    rtt_ms: float | None = None
    bandwidth_mbps: float | None = None
    measured_at: float | None = None


@dataclass(frozen=True)
class Event:
    seq: int
    ts: float
    kind: str
    node: str | None = None
    peer: str | None = None
    term: int = 0
    delay_ms: float | None = None
    detail: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ClusterState:
    """The scheduler's retained snapshot; a newly elected one resumes from it."""

    KIND: ClassVar[str] = "state"
    term: int
    leader: str
    version: int
    nodes: dict[str, NodeRecord] = field(default_factory=dict)
    links: list[LinkRecord] = field(default_factory=list)
    policy_version: int = 0
    step: int = 0
    events: list[Event] = field(default_factory=list)
    policy: dict[str, Any] = field(default_factory=dict)  # see docs/training-protocol.md
    # The last few policies, oldest first: two published within one snapshot interval must
    # both reach the workers, since each governs its own range of rounds.
    policies: list[dict[str, Any]] = field(default_factory=list)


Message = Heartbeat | Status | LeaderClaim | Request | Command | ClusterState
_KINDS: dict[str, type] = {c.KIND: c for c in (Heartbeat, Status, LeaderClaim, Request, Command,
                                              ClusterState)}


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not allowed")


def _build(cls: type, data: Any, where: str) -> Any:
    return build(cls, data, where, _check_semantics)


def _check_semantics(obj: Any, where: str) -> None:
    # Ids end up in topics and file names: hold them to the config's charset.
    for key in ("node", "id", "leader"):
        value = getattr(obj, key, None)
        if value == "" and isinstance(obj, Heartbeat):
            continue  # a heartbeat's leader: none followed yet
        if isinstance(value, str) and not NAME_RE.match(value):
            raise MessageError(f"{where}.{key}: bad node id {value[:40]!r}")
    if isinstance(obj, (NodeRecord, Heartbeat)) and obj.state not in NODE_STATES:
        raise MessageError(f"{where}.state: unknown node state {obj.state[:20]!r}")
    if isinstance(obj, Event) and obj.kind not in EVENT_KINDS:
        raise MessageError(f"{where}.kind: unknown event kind {obj.kind[:20]!r}")
    if isinstance(obj, ClusterState):
        for node_id in obj.nodes:
            if not NAME_RE.match(node_id):
                raise MessageError(f"{where}.nodes: bad node id {node_id[:40]!r}")
    if isinstance(obj, (LeaderClaim, Command, ClusterState)) and obj.term < 0:
        raise MessageError(f"{where}.term: negative")


def _json(doc: Any) -> bytes:
    return json.dumps(doc, separators=(",", ":"), allow_nan=False).encode()


def plain_state(st: ClusterState) -> dict[str, Any]:
    """``dataclasses.asdict`` of a snapshot, without its deep copies (a 10,000-node one has
    40,000 records): the records' own dicts, read only."""
    return {"term": st.term, "leader": st.leader, "version": st.version,
            "nodes": {k: dict(vars(r)) for k, r in st.nodes.items()},
            "links": [dict(vars(lk)) for lk in st.links],
            "policy_version": st.policy_version, "step": st.step,
            "events": [dataclasses.asdict(e) for e in st.events],
            "policy": st.policy, "policies": st.policies}


def encode_state(st: ClusterState) -> bytes:
    """The packed wire form of a snapshot (what :func:`encode` sends), whatever its size."""
    doc = plain_state(st)
    head = {k: doc.pop(k) for k in STATE_HEADER}
    blob = base64.b85encode(zlib.compress(_json(pack(doc)), 6)).decode("ascii")
    return _json({"v": STATE_PACKED_VERSION, "kind": ClusterState.KIND, **head, "z": blob})


def encode(msg: Message) -> bytes:
    """Serialise a message with its version and kind (a snapshot packed, see above)."""
    if isinstance(msg, ClusterState):
        try:
            data = encode_state(msg)
        except (TypeError, KeyError, ValueError, AttributeError):
            # Only a snapshot built by hand with values of the wrong types: sent plain, and
            # its receivers' validation says what is wrong with it.
            data = _json({"v": PROTOCOL_VERSION, "kind": msg.KIND, **dataclasses.asdict(msg)})
    else:
        data = _json({"v": PROTOCOL_VERSION, "kind": msg.KIND, **dataclasses.asdict(msg)})
    if len(data) > MAX_PAYLOAD:
        raise MessageError(f"{msg.KIND}: payload of {len(data)} bytes exceeds {MAX_PAYLOAD}")
    return data


def decode(payload: bytes | bytearray | str, expect: type | None = None) -> Message:
    """Parse and validate one payload.

    Args:
        payload: the raw MQTT payload.
        expect: if given, the message class the topic carries; anything else is rejected.

    Raises:
        MessageError: with a short reason; the caller logs it and drops the message.
    """
    if len(payload) > MAX_PAYLOAD:
        raise MessageError(f"payload of {len(payload)} bytes exceeds {MAX_PAYLOAD}")
    try:
        data = json.loads(payload, parse_constant=_reject_constant)
    except (ValueError, RecursionError, UnicodeDecodeError) as exc:
        raise MessageError(f"not JSON: {str(exc)[:80]}") from None
    if not isinstance(data, dict):
        raise MessageError("not a JSON object")
    if data.get("v") == STATE_PACKED_VERSION and data.get("kind") == ClusterState.KIND:
        data = _unpack_state(data)
    if data.get("v") != PROTOCOL_VERSION:
        raise MessageError(f"unsupported protocol version {str(data.get('v'))[:20]!r}")
    kind = data.get("kind")
    cls = _KINDS.get(kind) if isinstance(kind, str) else None
    if cls is None:
        raise MessageError(f"unknown kind {str(kind)[:20]!r}")
    if expect is not None and cls is not expect:
        raise MessageError(f"expected {expect.KIND!r} here, got {kind!r}")  # type: ignore[attr-defined]
    msg: Message = _build(cls, data, cls.KIND)  # type: ignore[attr-defined]
    return msg


def _unpack_state(data: dict[str, Any]) -> dict[str, Any]:
    """A packed snapshot as the plain (v1) dict that :func:`decode` validates."""
    blob = data.get("z")
    if not isinstance(blob, str):
        raise MessageError("state: packed snapshot without 'z'")
    try:
        raw = base64.b85decode(blob)
        inflate = zlib.decompressobj()
        text = inflate.decompress(raw, MAX_UNPACKED)
        if inflate.unconsumed_tail or not inflate.eof:
            raise MessageError(f"state: packed snapshot truncated or over {MAX_UNPACKED} bytes")
        inner = json.loads(text, parse_constant=_reject_constant)
        rest = unpack(inner)
    except (zlib.error, ValueError, RecursionError) as exc:
        raise MessageError(f"state: bad packed snapshot: {str(exc)[:80]}") from None
    head = {k: data[k] for k in STATE_HEADER if k in data}
    return {"v": PROTOCOL_VERSION, "kind": ClusterState.KIND, **head, **rest}
