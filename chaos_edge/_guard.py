"""Detect python-daemon shadowing our ``daemon`` package, before anything imports from it."""

from __future__ import annotations

import importlib
import importlib.util

FIX = ("the import name 'daemon' belongs to another package (python-daemon?) here; "
       "install chaos-edge in its own virtual environment, or `pip uninstall python-daemon`")


class DaemonPackageClash(ImportError):
    """``import daemon`` finds a package that is not Chaos's."""


def ensure_own_daemon_package() -> None:
    """Raise :class:`DaemonPackageClash` unless ``import daemon`` is Chaos's package.

    python-daemon and chaos-edge both install a top-level ``daemon``; whichever comes first
    on ``sys.path`` (or was installed last over the other) wins, silently. Ours carries a
    marker, and python-daemon's own modules (``daemon.daemon``, ``daemon.runner``) beside ours
    mean one package was unpacked over the other.
    """
    try:
        mod = importlib.import_module("daemon")
    except ImportError as exc:
        raise DaemonPackageClash(f"cannot import Chaos's 'daemon' package ({exc}); "
                                 "reinstall chaos-edge") from None
    foreign = [name for name in ("daemon.daemon", "daemon.runner", "daemon.pidfile")
               if importlib.util.find_spec(name) is not None]
    if not getattr(mod, "CHAOS_EDGE", False) or foreign:
        where = getattr(mod, "__file__", None) or "?"
        raise DaemonPackageClash(f"{FIX} (found {where})")
