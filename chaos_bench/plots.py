"""matplotlib for the benches' plots, which are optional (the ``bench`` extra)."""

from __future__ import annotations

from typing import Any


def pyplot() -> Any | None:
    """``matplotlib.pyplot`` on the file-only Agg backend, or None without matplotlib.

    Agg because the benches run on headless boxes and in CI, where an interactive backend
    would fail or try to open a window.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    return plt
