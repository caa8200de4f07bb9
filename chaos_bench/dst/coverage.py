"""What a run of many seeds should exercise: every message kind, request, command, report
and fault, and how often each was hit.

The referee counts what happens under names like ``mqtt:hb``, ``cmd:replicate``,
``req:report:link-failed`` and ``fault:power``; :data:`EXPECTED` is the list a campaign is
judged against. A ``state-diverged`` report and a stale member are left out on purpose: only
a broken protocol (or a bit flip, which the simulator does not model) makes one. So is a
``round-stuck`` report: a round stuck for the step timeout (120 s) has outlasted the stall
bound (90 s), so only a run that already broke an invariant gets there. The simulator's disks
never fail, so no ``snapshot-failed`` either. Nor does it model the shelves that take copies
of snapshots (its boxes advertise none), so no ``copy-snapshot`` command: those copies are
tested end to end (tests/training/test_power_cut.py) and their rules by unit tests.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from chaos_bench.dst.faults import FAULT_KINDS
from daemon.contracts.kinds import COMMAND_OPS, REPORT_KINDS, REQUEST_OPS

MQTT_KINDS = ("hb", "status", "leader", "req", "cmd", "state")
NEVER_EXPECTED = ("req:report:state-diverged", "req:report:round-stuck",
                  "req:report:snapshot-failed")
EXPECTED: tuple[str, ...] = (
    *(f"mqtt:{k}" for k in MQTT_KINDS),
    *(f"req:{op}" for op in REQUEST_OPS if op != "report"),
    *(f"req:report:{k}" for k in REPORT_KINDS if f"req:report:{k}" not in NEVER_EXPECTED),
    *(f"cmd:{op}" for op in COMMAND_OPS if op != "copy-snapshot"),
    *(f"fault:{k}" for k in FAULT_KINDS),
    "fault:qos0-lost", "fault:duplicated", "fault:delayed", "will",
    "status:up", "status:left", "status:lost",
    "join:member", "join:abandoned", "bootstrap", "restored", "round", "worker:rejoin",
    "total-loss", "snapshot", "straggler:set-aside:compute", "straggler:set-aside:link",
)
# Counted but not expected: a member that reaches a round behind the others (the data plane
# turns it away, as the real agreement does) means the protocol let a stale state in.
RARE = ("worker:stale",)


def merge(counts: Iterable[dict[str, int]]) -> Counter[str]:
    """The coverage of many runs, summed."""
    total: Counter[str] = Counter()
    for c in counts:
        total.update(c)
    return total


def missing(total: Counter[str]) -> list[str]:
    """What a campaign never hit."""
    return [k for k in EXPECTED if not total.get(k)]
