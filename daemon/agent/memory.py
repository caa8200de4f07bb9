"""What a node remembers across restarts, in its data dir: the best election term it knew.

A scheduler that crashes while the broker is down has no last will delivered, and a broker
without persistence comes back with no retained claim or snapshot. Without a memory, the
rebooted node would see an empty cluster and elect itself at term 1: a second cluster, whose
commands the others fence and whose fresh model its own worker would train. With it, the node
knows a cluster exists (and stands, if ever, above every term it fenced before).
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

log = logging.getLogger("chaosd.memory")
FILE = "election.json"


class TermMemory:
    """The best term this node has seen in ``cluster``, kept in ``data_dir``."""

    def __init__(self, data_dir: str, cluster: str) -> None:
        self.path = Path(data_dir) / FILE
        self.cluster = cluster
        self.saved = 0

    def load(self) -> int:
        """The remembered term; 0 when none (first start, another cluster, unreadable)."""
        try:
            doc = json.loads(self.path.read_text())
        except FileNotFoundError:
            return 0
        except (OSError, ValueError) as exc:
            log.warning("ignoring %s: %s", self.path, exc)
            return 0
        term = doc.get("term") if isinstance(doc, dict) else None
        if doc.get("cluster") != self.cluster or not isinstance(term, int) or term < 0:
            return 0
        self.saved = term
        return term

    def save(self, term: int, leader: str | None) -> None:
        """Remember ``term`` if it is new (atomically: a crash leaves the old or the new)."""
        if term <= self.saved:
            return
        tmp = self.path.with_suffix(".tmp")
        try:  # chaosd made the data dir at start-up; a missing one is not ours to create
            tmp.write_text(json.dumps({"cluster": self.cluster, "term": term,
                                       "leader": leader}))
            os.replace(tmp, self.path)
            self.saved = term
        except OSError as exc:  # a full or read-only disk must not stop the daemon
            log.warning("cannot remember term %d in %s: %s", term, self.path, exc)
            self.saved = term  # once per term, not a line every tick
