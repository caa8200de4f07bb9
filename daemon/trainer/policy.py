"""The policies a worker has been given, and which one governs a round.

Rule (docs/training-protocol.md): round ``s`` runs under the newest policy whose
``effective_step <= s``. Policies arrive through ``worker.poll`` in any order and may repeat;
each is validated once (:meth:`SyncPolicy.from_dict`), and a malformed one is dropped with a
log line rather than crashing the training loop.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from daemon.dataplane import PolicyError, SyncPolicy

log = logging.getLogger("chaos.trainer")
KEEP = 8  # older policies can no longer govern any round once newer ones are effective


@dataclass(frozen=True)
class Published:
    """One policy as the scheduler published it.

    Attributes:
        policy: The all-reduce tree.
        effective_step: The first round it governs.
        addrs: Data-plane address per member (``host:port``).
    """

    policy: SyncPolicy
    effective_step: int
    addrs: Mapping[str, str]

    @property
    def version(self) -> int:
        """Policy version."""
        return self.policy.version


def parse_addr(addr: str) -> tuple[str, int]:
    """``host:port`` -> ``(host, port)``."""
    host, _, port = addr.rpartition(":")
    return host.strip("[]"), int(port)


class PolicyBook:
    """Every policy this worker knows, by version."""

    def __init__(self) -> None:
        self._by_version: dict[int, Published] = {}

    def add(self, doc: Mapping[str, Any] | None) -> Published | None:
        """Record a policy from ``worker.poll``; returns it if it is new."""
        if not doc:
            return None
        try:
            policy = SyncPolicy.from_dict(doc)
            eff = int(doc.get("effective_step", 0))
            addrs = {str(k): str(v) for k, v in dict(doc.get("addrs") or {}).items()}
        except (PolicyError, TypeError, ValueError) as exc:
            log.warning("ignoring a malformed sync policy: %s", exc)
            return None
        if policy.version in self._by_version:
            return None
        pub = Published(policy, eff, addrs)
        self._by_version[policy.version] = pub
        for old in sorted(self._by_version)[:-KEEP]:
            del self._by_version[old]
        return pub

    @property
    def newest_version(self) -> int:
        """The newest known policy version (-1 before the first)."""
        return max(self._by_version, default=-1)

    @property
    def newest(self) -> Published | None:
        """The newest policy, effective or not."""
        return self._by_version[max(self._by_version)] if self._by_version else None

    def for_round(self, step: int) -> Published | None:
        """The policy governing round ``step`` (None if none is effective yet)."""
        ok = [v for v, p in self._by_version.items() if p.effective_step <= step]
        return self._by_version[max(ok)] if ok else None

    def knows(self, node: str) -> bool:
        """Whether ``node`` is a member of any recent policy (data-plane admission)."""
        return any(node in p.policy.members for p in self._by_version.values())

    def addr_of(self, node: str) -> str | None:
        """The newest known data-plane address of ``node``."""
        for v in sorted(self._by_version, reverse=True):
            addr = self._by_version[v].addrs.get(node)
            if addr:
                return addr
        return None
