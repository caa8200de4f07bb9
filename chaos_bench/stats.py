"""The benches' one summary of repeats: median, mean and range over seeds or rounds."""

from __future__ import annotations

import statistics
from typing import Any


def spread(values: list[Any]) -> dict[str, float] | None:
    """Median, mean, least, largest and count of the values that are not None (None: no
    value at all, e.g. a target no seed reached)."""
    vals = [v for v in values if v is not None]
    if not vals:
        return None
    return {"median": statistics.median(vals), "min": min(vals), "max": max(vals),
            "mean": statistics.fmean(vals), "n": len(vals)}
