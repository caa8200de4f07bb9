"""Where a bench's results go: the one output writer, and matplotlib for the plots.

An :class:`Output` is one bench's folder (``--out``), created when the first file is written.
It writes JSON in one format (``indent=1``, a final newline), markdown, and PNGs drawn with
matplotlib when it is installed (the ``bench`` extra), and says every path it wrote.
:func:`keep_copy` copies what a run worked in (``--keep``, or a failed run's logs).
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from chaos_bench.progress import Say
from chaosctl.client import CtlUsageError

NO_MATPLOTLIB = "matplotlib missing (pip install 'chaos-edge[bench]'): plots skipped"


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


def writable(path: Path | None, option: str = "--out", file: bool = False) -> None:
    """Refuse, in one line and before a bench starts anything, a results path it could not
    write at the end (a two-hour run must not be lost to a typo). Nothing is created here: a
    folder that does not exist yet is made when the first result is written.

    Args:
        path: The folder (or, with ``file``, the file) the bench will write; None: none.
        option: The option's name, for the message.
        file: ``path`` is a file: its folder must be writable.
    """
    if path is None:
        return
    if file and path.is_dir():
        raise CtlUsageError(f"{option} {path}: is a folder, not a file")
    probe = path.parent if file else path
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent  # the nearest folder that exists is where it would be made
    if not probe.is_dir():
        raise CtlUsageError(f"{option} {path}: {probe} is not a folder")
    try:  # a real file: os.access says yes to root, and to read-only mounts
        with tempfile.TemporaryFile(dir=probe):
            pass
    except OSError as exc:
        raise CtlUsageError(f"{option} {path}: cannot write in {probe} "
                            f"({exc.strerror or exc})") from None


def keep_copy(work: Path, dest: Path, say: Say, what: str, *skip: str) -> None:
    """Copy a run's working folder into ``dest``, its sockets (and ``skip``) left out, and
    say that ``what`` is kept there."""
    shutil.copytree(work, dest, dirs_exist_ok=True,
                    ignore=shutil.ignore_patterns("*.sock", *skip))
    say(f"kept {what} in {dest}")


class Output:
    """A bench's results folder: every file goes through here, and each is said."""

    def __init__(self, folder: Path, say: Say) -> None:
        self.dir = folder
        self.say = say
        self._told_no_plots = False

    def folder(self) -> Path:
        """The folder, created (with its parents) if it does not exist yet."""
        self.dir.mkdir(parents=True, exist_ok=True)
        return self.dir

    def _wrote(self, path: Path) -> Path:
        self.say(f"wrote {path}")
        return path

    def json(self, name: str, doc: Any) -> Path:
        """``doc`` as ``name``, in the benches' one JSON format."""
        path = self.folder() / name
        path.write_text(json.dumps(doc, indent=1) + "\n")
        return self._wrote(path)

    def text(self, name: str, text: str) -> Path:
        """``text`` (markdown) as ``name``, ending with a newline."""
        path = self.folder() / name
        path.write_text(text if text.endswith("\n") else text + "\n")
        return self._wrote(path)

    def figure(self, name: str, draw: Callable[[Any], Any], dpi: int = 110) -> Path | None:
        """The PNG ``name`` of the figure that ``draw(pyplot)`` returns (None: nothing to
        plot); None, said once, without matplotlib."""
        plt = pyplot()
        if plt is None:
            if not self._told_no_plots:
                self.say(NO_MATPLOTLIB)
                self._told_no_plots = True
            return None
        fig = draw(plt)
        if fig is None:
            return None
        path = self.folder() / name
        fig.tight_layout()
        fig.savefig(path, dpi=dpi)
        plt.close(fig)
        return self._wrote(path)
