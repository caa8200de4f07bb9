"""What ``chaosctl demo`` shows: narration lines and one node's live table, or plain lines."""

from __future__ import annotations

import time
from types import TracebackType
from typing import Any

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.panel import Panel
from rich.text import Text

from chaosctl import views

KEEP_LINES = 12


class DemoView:
    """Narration plus the observer node's ``nodes`` table.

    With ``live`` the table refreshes in place (rich Live); without it (CI, pipes) every
    narration is one plain line and the table is printed after each step.

    Args:
        console: Where to draw.
        title: The header line.
        live: Whether to use a live view.
    """

    def __init__(self, console: Console, title: str, live: bool) -> None:
        self.console = console
        self.title = title
        self.live = live
        self.observer: str | None = None
        self.rows: list[dict[str, Any]] = []
        self.lines: list[Text] = []
        self._t0 = time.monotonic()
        self._live: Live | None = None

    def __enter__(self) -> DemoView:
        if self.live:
            self._live = Live(get_renderable=self.render, console=self.console,
                              refresh_per_second=4, transient=False)
            self._live.start()
        else:
            self.console.print(self.title, style="bold", soft_wrap=True)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._live is not None:
            self._live.stop()
            self._live = None

    def elapsed(self) -> float:
        """Seconds since the demo started."""
        return time.monotonic() - self._t0

    def narrate(self, message: str, style: str = "") -> None:
        """Add one narration line, stamped with the elapsed time."""
        line = Text(f"[{self.elapsed():6.1f}s] ", style="dim")
        line.append(message, style=style)
        if self.live:
            self.lines = [*self.lines[-(KEEP_LINES - 1):], line]
        else:
            self.console.print(line, soft_wrap=True)

    def update(self, rows: Any) -> None:
        """Replace the table rows with a fresh ``nodes`` answer (ignored if malformed)."""
        if isinstance(rows, list) and all(isinstance(r, dict) for r in rows):
            self.rows = rows

    def snapshot(self) -> None:
        """In plain mode, print the current table (live mode shows it all the time)."""
        if not self.live and self.rows:
            self.console.print(self._table())

    def _table(self) -> RenderableType:
        title = f"nodes as seen by {self.observer}" if self.observer else "nodes"
        return views.nodes_table(self.rows, title=title)

    def render(self) -> RenderableType:
        """The whole live frame."""
        parts: list[RenderableType] = [Text(self.title, style="bold")]
        parts.append(self._table() if self.rows else Text("waiting for the nodes...", style="dim"))
        parts.append(Panel(Group(*self.lines) if self.lines else Text(""), title="what happens",
                           title_align="left", border_style="dim"))
        return Group(*parts)
