"""The benches' progress lines: the one narration helper.

Every bench takes a :data:`Say` and reports what it is doing, and where it wrote its results,
one line at a time; the CLI passes :func:`say`, tests a list's ``append`` or ``print``.
"""

from __future__ import annotations

from collections.abc import Callable

from rich.markup import escape

from chaosctl.common import console

Say = Callable[[str], None]


def say(line: str) -> None:
    """A progress line on the console, dimmed, between the tables."""
    console.print(f"[dim]{escape(line)}[/]")
