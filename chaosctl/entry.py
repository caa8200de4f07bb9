"""The ``chaosctl`` console script: the error boundary's first line, before any import.

Importing the CLI (typer, rich, the bench) takes a second or more on a slow box, and a Ctrl-C
in that second would print the interpreter's traceback. Here it ends as every other
interruption does: one line and exit 130.
"""

from __future__ import annotations

import sys

EXIT_INTERRUPTED = 130  # as chaosctl.main's


def main() -> None:
    """Console-script entry point."""
    try:
        from chaosctl.main import run
    except KeyboardInterrupt:
        print("chaosctl: interrupted", file=sys.stderr, flush=True)
        sys.exit(EXIT_INTERRUPTED)
    sys.exit(run())
