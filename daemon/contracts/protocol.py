"""The bodies of requests, commands and reports: typed records that own their wire form.

The MQTT envelopes (:class:`~daemon.contracts.messages.Request` on ``sched/req``,
:class:`~daemon.contracts.messages.Command` on ``node/<id>/cmd``) carry an ``op`` and an
``args`` object. What ``args`` holds is defined here, once, for both ends: each body is a
frozen dataclass whose ``to_args()`` is what travels and which :func:`parse_request`,
:func:`parse_command` and :func:`parse_report` read back, refusing anything malformed or
unknown in this one place (a :class:`MessageError`). No handler sees a half-parsed message,
and mypy sees the sender and the receiver of every field.

The same records cross the control socket: the worker's ``worker.report`` args are a report's
``to_args()``, and ``worker.poll`` hands the worker the commands the daemon received, each as
``{"seq", "op", "args"}``.

Scale-out, as these records tell it (docs/architecture.md follows it through the code)::

    worker -> chaosd      worker.attach
    chaosd -> scheduler   JoinRequest(addr, neighbors, rtts)
    scheduler -> new node and each source
                          Replicate(version_step, new, sources, neighbors, policy_version, ...)
                     or   Bootstrap(new, policy_version)        (no member holds a state)
    source -> scheduler   ServeDeclined(new, reason)            (its memory guard said no)
    new node -> scheduler Replicated(version, bytes, ...)       (the join is done)
                     or   StateRefused(reason)                  (the state does not fit it)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, TypeAlias

from daemon.contracts.config import NAME_RE
from daemon.contracts.errors import MessageError
from daemon.contracts.kinds import WorkerExitReason
from daemon.contracts.policy import policy_term
from daemon.contracts.records import build, plain

Strategy = Literal["chaos", "single", "multi-source", "stop-resume"]
"""Scale-out strategies (a training cluster uses chaos or single; the others are baselines)."""
_HEX = frozenset("0123456789abcdefABCDEF")


def valid_addr(addr: str) -> bool:
    """Whether ``addr`` is a data-plane address, ``host:port`` (``[v6]:port`` too)."""
    host, sep, port = addr.rpartition(":")
    return bool(sep and host.strip("[]") and port.isdigit() and 0 < int(port) < 65536)


def _ids(*names: str) -> str | None:
    bad = [n for n in names if not NAME_RE.match(n)]
    return f"bad node id {bad[0][:40]!r}" if bad else None


def _digest(value: str) -> bool:
    return len(value) == 64 and set(value) <= _HEX


class _Body:
    """What every body shares: its op (and kind, for reports) and its wire form."""

    OP: ClassVar[str]

    def to_args(self) -> dict[str, Any]:
        """The ``args`` object that travels (the inverse of the parse functions)."""
        return plain(self)


# --- requests to the scheduler (``sched/req``) --------------------------------------------
@dataclass(frozen=True)
class JoinRequest(_Body):
    """A node's worker attached and asks to become a member (scale-out).

    Attributes:
        addr: The worker's data-plane address, ``host:port``.
        neighbors: The neighbours the operator asked for (``chaosctl join --neighbor``);
            empty: the scheduler picks the nearest by ``rtts``.
        rtts: Milliseconds to each live peer, as the joining node measured them.
        step: The step of the state the worker holds (0: a fresh model). When no member is
            left, only a node holding the cluster's newest state may start it again at once.
    """

    OP: ClassVar[str] = "join"
    addr: str
    neighbors: list[str] = field(default_factory=list)
    rtts: dict[str, float] = field(default_factory=dict)
    step: int = 0

    def check(self) -> str | None:
        if not valid_addr(self.addr):
            return f"addr {self.addr[:40]!r} is not host:port"
        return _ids(*self.neighbors, *self.rtts)


@dataclass(frozen=True)
class LeaveRequest(_Body):
    """A graceful leave (scale-in), asked at the worker's last committed ``step``."""

    OP: ClassVar[str] = "leave"
    step: int = 0

    def check(self) -> str | None:
        return "step must be >= 0" if self.step < 0 else None


@dataclass(frozen=True)
class LinkRequest(_Body):
    """``chaosctl link add|del PEER``: connect-link or disconnect-link (answered by a Reply)."""

    OP: ClassVar[str] = "link"
    peer: str
    action: Literal["add", "del"]

    def check(self) -> str | None:
        return _ids(self.peer)


@dataclass(frozen=True)
class PolicyRequest(_Body):
    """``chaosctl policy set|auto``: the operator sets parts of the cluster's policy (empty
    or 0: keep that part) and pins them against the controller, or (``auto``) hands them
    back to it. Answered by a Reply."""

    OP: ClassVar[str] = "policy"
    sync: str = ""
    inner_steps: int = 0
    fragments: int = 0
    overlap: Literal["", "on", "off"] = ""
    wire: str = ""
    auto: bool = False

    def check(self) -> str | None:
        if self.inner_steps < 0 or self.fragments < 0:
            return "inner_steps and fragments must be >= 0"
        if self.auto and (self.sync or self.inner_steps or self.fragments or self.overlap
                          or self.wire):
            return "auto sets nothing: it hands the policy back to the controller"
        return None


@dataclass(frozen=True)
class WorkerExit(_Body):
    """The node's worker is gone: it exited, or it hung and was killed, or its state did not
    fit. The scheduler scales the node in at once."""

    OP: ClassVar[str] = "worker-exit"
    code: int = -1
    reason: WorkerExitReason = "worker-exit"
    detail: str = ""  # job-failed: why the command could not start

    def to_args(self) -> dict[str, Any]:
        args = plain(self)
        if not self.detail:
            del args["detail"]  # said only when there is something to say
        return args


# --- reports (a ``report`` request; ``kind`` says which) ----------------------------------
class _Report(_Body):
    OP: ClassVar[str] = "report"
    KIND: ClassVar[str]

    def to_args(self) -> dict[str, Any]:
        return {"kind": self.KIND, **plain(self)}


@dataclass(frozen=True)
class LinkFailed(_Report):
    """A link to ``peer`` broke (the worker's data plane, or the daemon's probes)."""

    KIND: ClassVar[str] = "link-failed"
    peer: str
    reason: str = ""

    def check(self) -> str | None:
        return _ids(self.peer)


@dataclass(frozen=True)
class LinkRecovered(_Report):
    """The probes hear ``peer`` again after a link failure."""

    KIND: ClassVar[str] = "link-recovered"
    peer: str

    def check(self) -> str | None:
        return _ids(self.peer)


@dataclass(frozen=True)
class LinkMetrics(_Report):
    """A probe's measurement of the link to ``peer`` (either figure may be missing)."""

    KIND: ClassVar[str] = "link-metrics"
    peer: str
    rtt_ms: float | None = None
    bandwidth_mbps: float | None = None

    def check(self) -> str | None:
        return _ids(self.peer)


@dataclass(frozen=True)
class RoundAborted(_Report):
    """Round ``step`` aborted on this worker (it reruns); for the logs."""

    KIND: ClassVar[str] = "round-aborted"
    step: int
    reason: str = ""


@dataclass(frozen=True)
class RoundStuck(_Report):
    """Round ``step`` has not committed for ``waited_s`` (a step timeout, and each one after
    it): the worker keeps its state, serves it and waits, and the scheduler records a
    ``round-stuck`` event. ``reason``: the last abort, or what the round waits for."""

    KIND: ClassVar[str] = "round-stuck"
    step: int
    waited_s: float
    reason: str = ""


@dataclass(frozen=True)
class SnapshotFailed(_Report):
    """The disk refused this member's snapshot (full, read-only): it snapshots no more, and
    trains on; the scheduler records a ``snapshot-failed`` event."""

    KIND: ClassVar[str] = "snapshot-failed"
    reason: str = ""


@dataclass(frozen=True)
class Stall(_Report):
    """What the first step under a new policy (or a rerun) cost this worker."""

    KIND: ClassVar[str] = "stall"
    step: int
    ms: float
    reruns: int = 0
    policy_version: int = -1
    reason: str = ""


@dataclass(frozen=True)
class ServeDeclined(_Report):
    """A source's memory guard refused to snapshot for ``new``; it plans without us."""

    KIND: ClassVar[str] = "serve-declined"
    new: str
    reason: str = ""

    def check(self) -> str | None:
        return _ids(self.new)


@dataclass(frozen=True)
class StateDiverged(_Report):
    """The divergence guard found this member's state unlike the majority's at ``step``."""

    KIND: ClassVar[str] = "state-diverged"
    step: int
    digest: str
    majority: str
    variants: int = 2

    def check(self) -> str | None:
        if self.step < 0:
            return "step must be >= 0"
        if not (_digest(self.digest) and _digest(self.majority)):
            return "digest and majority must be 64 hex digits"
        if self.digest.lower() == self.majority.lower():
            return "equal digest and majority is no divergence"
        return None


@dataclass(frozen=True)
class StateRefused(_Report):
    """The cluster's state does not fit this worker's script; the join ends here."""

    KIND: ClassVar[str] = "state-refused"
    reason: str


@dataclass(frozen=True)
class SourceStats:
    """What one source sent a new node (``end_s``: when its last byte came, from the pull's
    start; ``failed``: why it stopped early)."""

    bytes: int
    end_s: float | None = None
    failed: str | None = None


@dataclass(frozen=True)
class PlanInputRecord:
    """One source as the planner saw it, so that every plan can be re-run and judged."""

    id: str
    t_prop_s: float
    t_trans_s_per_byte: float
    tau_sync_s: float = 0.0


@dataclass(frozen=True)
class Replicated(_Report):
    """The new node restored the state of step ``version``: the join is done.

    Attributes:
        version: The step of the state it restored.
        bytes: The state's size.
        delay_ms: From the pull's start (offers asked) to the verified state.
        transfer_ms: The bytes' own time.
        decision_ms: The planner's.
        strategy: The strategy that planned the pull.
        sources: The sources that sent bytes.
        per_source: What each source sent.
        plan_inputs: The planner's inputs.
        predicted_ms: The plan's makespan (None: no plan, e.g. stop-resume).
        lower_bound_ms: Water-filling over the same inputs: no plan can beat it.
        replans: Sources that failed and had their bytes re-planned.
        refetched_blocks: Blocks that failed verification and were fetched again.
        left_out: Sources that made no offer, and why.
        declined: Those of them that refused on their own (their memory guard).
        plan: The ``policy_version`` of the replicate command the pull carried out (None:
            unsaid), so the scheduler can tell a pull of an older plan of the join.
    """

    KIND: ClassVar[str] = "replicated"
    version: int
    bytes: int | None = None
    delay_ms: float | None = None
    transfer_ms: float | None = None
    decision_ms: float | None = None
    strategy: Strategy = "chaos"
    sources: list[str] = field(default_factory=list)
    per_source: dict[str, SourceStats] = field(default_factory=dict)
    plan_inputs: list[PlanInputRecord] = field(default_factory=list)
    predicted_ms: float | None = None
    lower_bound_ms: float | None = None
    replans: int = 0
    refetched_blocks: int = 0
    left_out: dict[str, str] = field(default_factory=dict)
    declined: dict[str, str] = field(default_factory=dict)
    plan: int | None = None

    def detail(self) -> dict[str, Any]:
        """What the ``scale-out`` event carries of it: everything but the worker's own
        ``delay_ms`` (the event's is the scheduler's, request to done) and the plan (the
        event's ``policy_version`` says it), empty parts left out."""
        doc = self.to_args()
        del doc["kind"], doc["delay_ms"]
        doc.pop("plan", None)
        return {k: v for k, v in doc.items() if v not in ({}, None) or k == "sources"}


Report: TypeAlias = (LinkFailed | LinkRecovered | LinkMetrics | RoundAborted | RoundStuck
                     | Stall | ServeDeclined | StateDiverged | StateRefused | Replicated
                     | SnapshotFailed)
ClusterRequest: TypeAlias = JoinRequest | LeaveRequest | LinkRequest | WorkerExit | Report
"""The requests the negotiator applies (a PolicyRequest goes to the policy's owner)."""
RequestBody: TypeAlias = ClusterRequest | PolicyRequest
WorkerReport: TypeAlias = (LinkFailed | RoundAborted | RoundStuck | Stall | ServeDeclined
                           | StateDiverged | StateRefused | Replicated | SnapshotFailed)
"""The reports a worker sends through its daemon (the daemon's probes send the others)."""

REPORTS: dict[str, type[Report]] = {c.KIND: c for c in (
    LinkFailed, LinkRecovered, LinkMetrics, RoundAborted, RoundStuck, Stall, ServeDeclined,
    StateDiverged, StateRefused, Replicated, SnapshotFailed)}
WORKER_REPORTS: dict[str, type[WorkerReport]] = {c.KIND: c for c in (
    LinkFailed, RoundAborted, RoundStuck, Stall, ServeDeclined, StateDiverged, StateRefused,
    Replicated, SnapshotFailed)}
REQUESTS: dict[str, type[JoinRequest | LeaveRequest | LinkRequest | PolicyRequest
                         | WorkerExit]] = {
    c.OP: c for c in (JoinRequest, LeaveRequest, LinkRequest, PolicyRequest, WorkerExit)}


# --- commands from the scheduler (``node/<id>/cmd``) ---------------------------------------
@dataclass(frozen=True)
class Connect(_Body):
    """Keep a data-plane link to ``peer`` at ``addr`` (the lower id dials)."""

    OP: ClassVar[str] = "connect"
    peer: str
    addr: str

    def check(self) -> str | None:
        if not valid_addr(self.addr):
            return f"addr {self.addr[:40]!r} is not host:port"
        return _ids(self.peer)


@dataclass(frozen=True)
class Disconnect(_Body):
    """Close the link to ``peer`` once no policy that governs a coming round needs it.

    Attributes:
        policy_version: The policy the scheduler publishes with the drop (0: none named). The
            worker closes nothing before it holds it: the command can overtake the snapshot
            that carries it and the policies published just before it, one of which may
            still route a round over the link (a demo run stalled so, stop 50).
    """

    OP: ClassVar[str] = "disconnect"
    peer: str
    policy_version: int = 0

    def check(self) -> str | None:
        if self.policy_version < 0:
            return f"policy_version {self.policy_version} is negative"
        return _ids(self.peer)


@dataclass(frozen=True)
class LinkEstimate:
    """What the scheduler knows of a source's link to the new node (None: unmeasured)."""

    rtt_ms: float | None = None
    bandwidth_mbps: float | None = None


@dataclass(frozen=True)
class Replicate(_Body):
    """Scale-out: replicate the state of ``version_step`` from ``sources`` to ``new``.

    Sent to the new node (which plans and pulls) and to every source (which snapshots at the
    boundary where the policy with the new node takes over, and serves).

    Attributes:
        version_step: The step whose state is replicated; ``new`` is a member from the next.
        new: The joining node.
        sources: Each source and its data-plane address (never empty: see :class:`Bootstrap`).
        neighbors: The new node's neighbours in the overlay (its links).
        policy_version: The policy that makes ``new`` a member.
        strategy: How the new node plans the pull.
        links: What the scheduler knows of each source's link.
    """

    OP: ClassVar[str] = "replicate"
    version_step: int
    new: str
    sources: dict[str, str]
    policy_version: int
    neighbors: list[str] = field(default_factory=list)
    strategy: Strategy = "chaos"
    links: dict[str, LinkEstimate] = field(default_factory=dict)

    def check(self) -> str | None:
        if self.version_step < 0:
            return "version_step must be >= 0"
        if not self.sources:
            return "a replicate command names at least one source (else: bootstrap)"
        if self.new in self.sources:
            return "a node cannot be its own source"
        bad = [a for a in self.sources.values() if not valid_addr(a)]
        if bad:
            return f"source address {bad[0][:40]!r} is not host:port"
        return _ids(self.new, *self.sources, *self.neighbors)


@dataclass(frozen=True)
class Bootstrap(_Body):
    """Scale-out with no source: ``new`` is the only member, and starts from its own state
    (a new cluster, or a former member after every other holder went)."""

    OP: ClassVar[str] = "bootstrap"
    new: str
    policy_version: int

    def check(self) -> str | None:
        return _ids(self.new)

    def stale(self, newest_version: int, newest_members: Collection[str]) -> bool:
        """Whether a policy newer than this command's leaves ``new`` out: the scheduler has
        since made another node the cluster's start (``new`` was frozen or cut off with the
        command in its queue), and starting from our own state now would fork the cluster."""
        return (self.policy_version > 0 and newest_version > self.policy_version
                and self.new not in newest_members)

    def ended(self, term: int) -> bool:
        """Whether the term of the scheduler that sent it has ended (``term``: the newest
        our chaosd knows): the next one did not start the cluster from us, and plans our
        join itself. A bootstrap held while chaosd was out of touch was carried out after a
        scheduler of the next term had planned our join from a holder of a newer step, with
        the worker's book still two terms old (the simulator's seed 2759)."""
        return self.policy_version > 0 and policy_term(self.policy_version) < term


@dataclass(frozen=True)
class CopySnapshot(_Body):
    """Push the snapshot of ``step`` on this box's disk to ``to``'s shelf at ``addr``, so
    that a box besides its holder keeps it (chaosd does it; the worker is not involved).

    Attributes:
        step: The snapshot's step (the newest on this disk, if that one is gone).
        to: The box that keeps the copy.
        addr: Its shelf, ``host:port``.
        restore: The copy is for ``to``'s worker to restore (a power cut took every member's
            newer snapshot with it): ``to``'s chaosd restarts its job once it lands.
    """

    OP: ClassVar[str] = "copy-snapshot"
    step: int
    to: str
    addr: str
    restore: bool = False

    def check(self) -> str | None:
        if self.step < 1:
            return "step must be >= 1"
        if not valid_addr(self.addr):
            return f"addr {self.addr[:40]!r} is not host:port"
        return _ids(self.to)


@dataclass(frozen=True)
class Reply(_Body):
    """The scheduler's answer to one request (``error`` None: done)."""

    OP: ClassVar[str] = "reply"
    req_id: str
    error: str | None = None


WorkerCommand: TypeAlias = Connect | Disconnect | Replicate | Bootstrap
"""The commands a daemon hands on to its worker."""
CommandBody: TypeAlias = WorkerCommand | CopySnapshot | Reply
COMMANDS: dict[str, type[CommandBody]] = {c.OP: c for c in (
    Connect, Disconnect, Replicate, Bootstrap, CopySnapshot, Reply)}
WORKER_COMMANDS: dict[str, type[WorkerCommand]] = {c.OP: c for c in (
    Connect, Disconnect, Replicate, Bootstrap)}


# --- parsing, in one place ------------------------------------------------------------------
def parse_report(args: Any, allowed: Mapping[str, type[Report]] = REPORTS) -> Report:
    """The report that ``args`` (``{"kind", ...}``) holds.

    Raises:
        MessageError: An unknown kind, or a malformed report.
    """
    kind = args.get("kind") if isinstance(args, dict) else None
    cls = allowed.get(kind) if isinstance(kind, str) else None
    if cls is None:
        raise MessageError(f"unknown report kind {str(kind)[:30]!r}")
    return build(cls, {k: v for k, v in args.items() if k != "kind"}, f"report {kind}")


def parse_request(op: str, args: Any) -> RequestBody:
    """The body of a request with ``op`` and ``args``.

    Raises:
        MessageError: An unknown op, or malformed args.
    """
    if op == "report":
        return parse_report(args)
    cls = REQUESTS.get(op)
    if cls is None:
        raise MessageError(f"unknown request {op[:30]!r}")
    return build(cls, args, f"request {op}")


def parse_command(op: str, args: Any,
                  allowed: Mapping[str, type[CommandBody]] = COMMANDS) -> CommandBody:
    """The body of a command with ``op`` and ``args``.

    Raises:
        MessageError: An unknown op, or malformed args.
    """
    cls = allowed.get(op)
    if cls is None:
        raise MessageError(f"unknown command {op[:30]!r}")
    return build(cls, args, f"command {op}")


def parse_worker_command(op: str, args: Any) -> WorkerCommand:
    """A command as the worker receives it in ``worker.poll`` (no replies)."""
    cmd = parse_command(op, args, WORKER_COMMANDS)
    assert not isinstance(cmd, (Reply, CopySnapshot))
    return cmd


def fields_of(cls: type) -> tuple[str, ...]:
    """The field names of a body (what its wire form may carry)."""
    return tuple(f.name for f in dataclasses.fields(cls))
