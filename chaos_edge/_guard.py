"""Detect python-daemon shadowing our ``daemon`` package, before anything imports from it.

python-daemon and chaos-edge both install a top-level ``daemon``. Whichever comes first on
``sys.path`` wins, and pip installing one over the other mixes their files: silently, either
way. Ours carries a marker (``daemon.CHAOS_EDGE``), and python-daemon's own modules beside it
mean that one package was unpacked over the other.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
from types import ModuleType

FIX = ("install chaos-edge in its own virtual environment, or run `pip uninstall python-daemon` "
       "and then `pip install --force-reinstall chaos-edge`")
# Modules of python-daemon that Chaos's package never has.
FOREIGN = ("daemon.daemon", "daemon.runner", "daemon.pidfile")


class DaemonPackageClash(ImportError):
    """``import daemon`` finds a package that is not Chaos's, or not only Chaos's.

    An ImportError, because that is what it is to a script that imports :mod:`chaos_edge`;
    its message is one line that names the problem and the fix.
    """


def _where(mod: ModuleType) -> str:
    path = getattr(mod, "__file__", None) or next(iter(getattr(mod, "__path__", ())), None)
    return str(path or "?")


def _exists(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):  # ``daemon`` is a module, not a package: not ours anyway
        return False


def _one_line(exc: BaseException) -> str:
    return " ".join(f"{type(exc).__name__}: {exc}".split())


@functools.cache
def ensure_own_daemon_package() -> None:
    """Raise :class:`DaemonPackageClash` unless ``import daemon`` is Chaos's package alone.

    Cheap: it imports ``daemon``'s ``__init__`` (a docstring and the marker), nothing below
    it. Passing is remembered; a clash is checked again on the next call.
    """
    try:
        mod = importlib.import_module("daemon")
    except Exception as exc:  # a foreign ``daemon`` may fail on its own imports: still one line
        raise DaemonPackageClash(f"cannot import the package 'daemon' ({_one_line(exc)}); "
                                 f"{FIX}") from None
    if not getattr(mod, "CHAOS_EDGE", False):
        raise DaemonPackageClash(f"'import daemon' finds another package (python-daemon?) at "
                                 f"{_where(mod)}, not Chaos's: {FIX}")
    foreign = [name for name in FOREIGN if _exists(name)]
    if foreign:
        raise DaemonPackageClash(f"python-daemon's files ({', '.join(foreign)}) were installed "
                                 f"into Chaos's 'daemon' package at {_where(mod)}: {FIX}")
