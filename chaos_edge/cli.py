"""Console entry points: check the ``daemon`` import name, then run ``chaosd``."""

from __future__ import annotations

import sys

from chaos_edge._guard import DaemonPackageClash, ensure_own_daemon_package


def chaosd() -> None:
    """``chaosd``: stop with one line (exit 2) if python-daemon shadows our package."""
    try:
        ensure_own_daemon_package()
    except DaemonPackageClash as exc:
        print(f"chaosd: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    from daemon.agent.main import main

    main()
