"""Where a member's snapshots live and how they are named: shared by the worker, which
writes and verifies them (``chaos_edge.trainer.snapshots``), and by chaosd, which only reads
the names to tell the scheduler the newest step its box holds on disk."""

from __future__ import annotations

import re
from pathlib import Path

SNAPSHOT_DIR = "snapshots"  # under the data dir
PREFIX, SUFFIX = "snap-", ".chaos"
_NAME = re.compile(r"^snap-(\d{12})\.chaos$")


def snapshot_name(step: int) -> str:
    return f"{PREFIX}{step:012d}{SUFFIX}"


def snapshot_step(path: Path) -> int | None:
    """The step a snapshot file's name says, or None for any other file."""
    m = _NAME.match(path.name)
    return int(m.group(1)) if m else None


def newest_snapshot_step(directory: str | Path) -> int:
    """The newest step named in ``directory`` (-1: none). A hint: the worker verifies the file,
    and its join says the step it really restored."""
    try:
        steps = [s for p in Path(directory).iterdir() if (s := snapshot_step(p)) is not None]
    except OSError:
        return -1
    return max(steps, default=-1)
