"""Shared CLI plumbing: the global options carried in the typer context, consoles, JSON output."""

from __future__ import annotations

import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import typer
from rich.console import Console

from chaosctl.client import DEFAULT_TIMEOUT_S, ControlClient, CtlUsageError

# Node ids use the daemon's charset (chaosd.toml(5)); checking here turns a typo into exit 2
# before anything is sent.
NODE_ID_RE = re.compile(r"[A-Za-z0-9_.-]{1,64}")

# Piped output (logs, CI) gets a wide fixed width, not rich's 80 columns, so tables with an
# event's details stay one row per event.
console = Console(width=None if sys.stdout.isatty() else 160)


@dataclass(frozen=True)
class CliState:
    """Global options, stored as ``ctx.obj`` by the app callback.

    Attributes:
        socket: Path of the daemon's control socket.
        timeout: Seconds to wait for each answer (operations that measure take longer).
    """

    socket: Path
    timeout: float = DEFAULT_TIMEOUT_S

    def client(self, at_least: float = 0.0) -> ControlClient:
        """Return a client for the socket, waiting ``--timeout`` or ``at_least``, the longer."""
        return ControlClient(self.socket, max(self.timeout, at_least))


def state_of(ctx: typer.Context) -> CliState:
    """Return the global options of this invocation."""
    obj = ctx.find_root().obj
    assert isinstance(obj, CliState), "the app callback sets ctx.obj"
    return obj


def print_json(data: Any, compact: bool = False) -> None:
    """Print ``data`` as JSON on stdout, exactly as received (no rich markup or wrapping)."""
    text = json.dumps(data, separators=(",", ":")) if compact else json.dumps(data, indent=2)
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def check_node_id(value: str) -> str:
    """Validate a node id argument (typer callback)."""
    if not NODE_ID_RE.fullmatch(value):
        raise CtlUsageError(f"invalid node id {value!r} (allowed: A-Z a-z 0-9 _ . -, 1-64)")
    return value
