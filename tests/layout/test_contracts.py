"""The typed contract: defined once in daemon.contracts.kinds, handled everywhere, documented.

mypy proves the dispatch is exhaustive (``assert_never``); these tests pin what mypy cannot
see: that every control op has a handler, and that the docs list the same names as the code.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from daemon.agent import ops, views
from daemon.contracts import kinds

pytestmark = pytest.mark.timeout(30)
DOC = Path(__file__).resolve().parents[2] / "docs" / "control-protocol.md"


def test_every_control_op_has_one_handler() -> None:
    assert not set(views.HANDLERS) & set(ops.HANDLERS)
    assert set(views.HANDLERS) | set(ops.HANDLERS) == set(kinds.CONTROL_OPS)


def test_worker_sets_are_subsets_of_the_wire_sets() -> None:
    assert set(kinds.WORKER_REPORT_KINDS) <= set(kinds.REPORT_KINDS)
    assert set(kinds.WORKER_COMMAND_OPS) <= set(kinds.COMMAND_OPS)
    assert set(kinds.WORKER_STATES) <= set(kinds.NODE_STATES)
    assert set(kinds.MEMBER_STATES) <= set(kinds.LIVE_STATES) <= set(kinds.NODE_STATES)


@pytest.mark.parametrize(("row", "names"), [
    ("node states", kinds.NODE_STATES),
    ("worker states", kinds.WORKER_STATES),
    ("requests to the scheduler", kinds.REQUEST_OPS),
    ("report kinds", kinds.REPORT_KINDS),
    ("commands from the scheduler", kinds.COMMAND_OPS),
    ("control-socket ops", kinds.CONTROL_OPS),
    ("event kinds", kinds.EVENT_KINDS),
])
def test_the_docs_list_the_same_names(row: str, names: tuple[str, ...]) -> None:
    line = next(ln for ln in DOC.read_text().splitlines() if ln.startswith(f"| {row} |"))
    assert re.findall(r"`([^`]+)`", line) == list(names)


def test_member_narrows_or_refuses() -> None:
    assert kinds.member("stall", kinds.REPORT_KINDS) == "stall"
    assert kinds.member("nonsense", kinds.REPORT_KINDS) is None
    assert kinds.member(3, kinds.REPORT_KINDS) is None
