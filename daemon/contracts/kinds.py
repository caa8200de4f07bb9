"""Every name the worker, the daemon, the scheduler and chaosctl exchange, defined once.

Each set is a ``Literal`` type, so mypy checks both ends: a sender can only send a member, and
a handler that dispatches with ``match``/``if`` and ends in ``assert_never`` fails to type-check
when a new member has no branch. The tuples are the same sets at run time, for validating what
arrives over a socket or MQTT. docs/control-protocol.md and docs/training-protocol.md list them
for people; a test checks that the docs and these tuples agree.
"""

from __future__ import annotations

from typing import Literal, TypeVar, get_args

K = TypeVar("K", bound=str)

# --- nodes -------------------------------------------------------------------------------
NodeState = Literal["standby", "joining", "active", "leaving", "failed", "left"]
"""A node's state in ``chaosctl nodes`` (DESIGN.md) and in the scheduler's table."""
WorkerState = Literal["standby", "joining", "active", "leaving"]
"""A worker's own state, as it tells its daemon in ``worker.poll`` (``standby``: none attached)."""

NODE_STATES: tuple[NodeState, ...] = get_args(NodeState)
WORKER_STATES: tuple[WorkerState, ...] = get_args(WorkerState)
LIVE_STATES: tuple[NodeState, ...] = ("standby", "joining", "active", "leaving")
"""States of a node whose daemon is up."""
MEMBER_STATES: tuple[NodeState, ...] = ("joining", "active")
"""States of a node that takes part in the all-reduce (or is being given the state to)."""
GONE_STATES: tuple[NodeState, ...] = ("failed", "left")

# --- requests to the scheduler (``sched/req``) ----------------------------------------------
RequestOp = Literal["join", "leave", "link", "policy", "report", "worker-exit"]
REQUEST_OPS: tuple[RequestOp, ...] = get_args(RequestOp)
WorkerExitReason = Literal["worker-exit", "worker-unresponsive", "state-refused", "job-failed"]
"""Why a daemon reports its worker gone (``worker-exit {code, reason, detail}``); the scale-in
event carries it: the process ended, or it stopped polling and was killed (a hang), or its
state did not fit, or the job's command could not start at all (a ``job-failed`` event)."""
WORKER_EXIT_REASONS: tuple[WorkerExitReason, ...] = get_args(WorkerExitReason)

ReportKind = Literal[
    "link-failed", "link-recovered", "link-metrics", "round-aborted", "round-stuck",
    "replicated", "stall", "serve-declined", "state-diverged", "state-refused",
    "snapshot-failed",
]
"""What a node reports to the scheduler (``report`` requests). The worker sends those in
:data:`WORKER_REPORT_KINDS` through its daemon; the daemon itself sends ``link-metrics`` and
``link-recovered`` from its probes."""
REPORT_KINDS: tuple[ReportKind, ...] = get_args(ReportKind)
WORKER_REPORT_KINDS: tuple[ReportKind, ...] = (
    "link-failed", "round-aborted", "round-stuck", "replicated", "stall", "serve-declined",
    "state-diverged", "state-refused", "snapshot-failed",
)

# --- commands from the scheduler (``node/<id>/cmd``) ----------------------------------------
CommandOp = Literal["connect", "disconnect", "replicate", "bootstrap", "copy-snapshot", "reply"]
COMMAND_OPS: tuple[CommandOp, ...] = get_args(CommandOp)
WorkerCommandOp = Literal["connect", "disconnect", "replicate", "bootstrap"]
"""The commands a daemon hands on to its worker (``reply`` answers the daemon itself)."""
WORKER_COMMAND_OPS: tuple[WorkerCommandOp, ...] = get_args(WorkerCommandOp)

# --- the control socket (docs/control-protocol.md) ------------------------------------------
ReadOp = Literal["status", "nodes", "links", "events", "ping", "policy.show"]
ActionOp = Literal["join", "leave", "link", "probe", "policy"]
WorkerOp = Literal[
    "worker.attach", "worker.poll", "worker.report", "worker.leave", "worker.detach",
    "worker.probe",
]
ControlOp = Literal[ReadOp, ActionOp, WorkerOp]
CONTROL_OPS: tuple[ControlOp, ...] = (*get_args(ReadOp), *get_args(ActionOp),
                                      *get_args(WorkerOp))

# --- events (``chaosctl events``) -------------------------------------------------------------
EventKind = Literal[
    "scale-out", "scale-in", "connect-link", "disconnect-link", "node-failed", "link-failed",
    "scheduler-elected", "partition", "state-diverged", "state-restored", "state-lost",
    "job-failed", "round-stuck", "snapshot-failed", "policy-changed", "straggler",
]
EVENT_KINDS: tuple[EventKind, ...] = get_args(EventKind)


def member(value: object, allowed: tuple[K, ...]) -> K | None:
    """``value`` as a member of ``allowed`` (one of the tuples above), or None.

    The return type is the ``Literal`` of ``allowed``, so what passes can be dispatched on
    exhaustively.
    """
    for name in allowed:
        if value == name:
            return name
    return None
