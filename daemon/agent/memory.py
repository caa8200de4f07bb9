"""What a node remembers across restarts, in its data dir: the best election term it knew,
and the job it supervises.

The term: a scheduler that crashes while the broker is down has no last will delivered, and a broker
without persistence comes back with no retained claim or snapshot. Without a memory, the
rebooted node would see an empty cluster and elect itself at term 1: a second cluster, whose
commands the others fence and whose fresh model its own worker would train. With it, the node
knows a cluster exists (and stands, if ever, above every term it fenced before).

The job (:class:`JobMemory`): the command of the last ``chaosctl join``, its working
directory and environment. A box that reboots (a power cut, an update) comes back with chaosd
started by systemd, and rejoins by itself: chaosd starts the job again. It forgets the job
when the operator says ``leave`` or the script ends on its own (exit 0), not when chaosd itself
is stopped (a reboot stops it too).
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

log = logging.getLogger("chaosd.memory")
FILE = "election.json"
JOB_FILE = "job.json"


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


@dataclass(frozen=True)
class Job:
    """What ``chaosctl join -- CMD`` asked this node to run."""

    argv: list[str]
    cwd: str = ""  # "" : chaosd's own
    env: dict[str, str] = field(default_factory=dict)  # {} : chaosd's own
    neighbors: list[str] = field(default_factory=list)

    @classmethod
    def parse(cls, doc: object) -> Job | None:
        """The job a file holds, or None if it is not one."""
        if not isinstance(doc, dict):
            return None
        argv, cwd, env, nbrs = (doc.get(k) for k in ("argv", "cwd", "env", "neighbors"))
        if not (isinstance(argv, list) and argv and all(isinstance(a, str) for a in argv)
                and isinstance(cwd, str) and isinstance(env, dict)
                and all(isinstance(k, str) and isinstance(v, str) for k, v in env.items())
                and isinstance(nbrs, list) and all(isinstance(n, str) for n in nbrs)):
            return None
        return cls(list(argv), cwd, dict(env), list(nbrs))


class JobMemory:
    """The job this node supervises, kept in ``data_dir`` (readable by its owner only: the
    environment may hold secrets)."""

    def __init__(self, data_dir: str) -> None:
        self.path = Path(data_dir) / JOB_FILE

    def load(self) -> Job | None:
        """The remembered job; None when there is none or the file is not one (said once)."""
        try:
            doc = json.loads(self.path.read_text())
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            log.warning("ignoring the remembered job in %s: %s", self.path, exc)
            return None
        job = Job.parse(doc)
        if job is None:
            log.warning("ignoring the remembered job in %s: not a job", self.path)
        return job

    def save(self, job: Job) -> None:
        """Remember ``job`` (atomically: a crash leaves the old or the new)."""
        tmp = self.path.with_suffix(".tmp")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as f:
                json.dump(asdict(job), f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
        except OSError as exc:  # a full or read-only disk must not stop the daemon
            log.warning("cannot remember the job in %s (it will not restart after a "
                        "reboot): %s", self.path, exc)

    def forget(self) -> None:
        """Nothing to start again after a restart."""
        try:
            self.path.unlink(missing_ok=True)
        except OSError as exc:
            log.warning("cannot forget the job in %s: %s", self.path, exc)
