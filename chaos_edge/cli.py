"""Console entry points: check the ``daemon`` import name, then run ``chaosd``."""

from __future__ import annotations

import sys

from chaos_edge._guard import DaemonPackageClash, ensure_own_daemon_package


def chaosd() -> int:
    """``chaosd``: stop with one line (exit 2) if python-daemon shadows our package.

    Returns:
        The daemon's exit status (the console script passes it to ``sys.exit``).
    """
    try:
        ensure_own_daemon_package()
    except DaemonPackageClash as exc:
        print(f"chaosd: {exc}", file=sys.stderr)
        return 2
    # Only now: before the guard, ``daemon.agent`` could name python-daemon's package.
    from daemon.agent.main import main

    return main()


if __name__ == "__main__":
    sys.exit(chaosd())
