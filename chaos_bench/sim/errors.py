"""The simulator's one exception family; the CLI prints its message as one line."""

from __future__ import annotations

from chaosctl.client import CtlError


class SimError(CtlError):
    """A simulation input is missing or wrong, or a measurement it needs failed."""
