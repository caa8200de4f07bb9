"""The policies a worker has been given, and which one governs a round.

Rule (docs/training-protocol.md): round ``s`` runs under the newest policy whose
``effective_step <= s``. Policies arrive through ``worker.poll`` in any order and may repeat;
each is validated once (:meth:`SyncPolicy.from_dict`), and a malformed one is dropped with a
log line rather than crashing the training loop.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from daemon.contracts.policy import POLICY_KEEP, SyncPolicy, parse

log = logging.getLogger("chaos.trainer")


def parse_addr(addr: str) -> tuple[str, int]:
    """``host:port`` -> ``(host, port)``."""
    host, _, port = addr.rpartition(":")
    return host.strip("[]"), int(port)


class PolicyBook:
    """Every policy this worker knows, by version (only the training thread adds)."""

    def __init__(self) -> None:
        self._by_version: dict[int, SyncPolicy] = {}

    def add(self, doc: Mapping[str, Any] | None) -> SyncPolicy | None:
        """Record a policy document; returns it if it is new."""
        pub = parse(doc)
        return None if pub is None else self.put(pub)

    def put(self, pub: SyncPolicy) -> SyncPolicy | None:
        """Record a parsed policy; returns it if it is new."""
        if pub.version in self._by_version:
            return None
        self._by_version[pub.version] = pub
        for old in sorted(self._by_version)[:-POLICY_KEEP]:
            del self._by_version[old]
        return pub

    @property
    def newest_version(self) -> int:
        """The newest known policy version (-1 before the first)."""
        return max(self._by_version, default=-1)

    @property
    def newest(self) -> SyncPolicy | None:
        """The newest policy, effective or not."""
        return self._by_version[max(self._by_version)] if self._by_version else None

    def get(self, version: int) -> SyncPolicy | None:
        """The policy of ``version``, if still kept."""
        return self._by_version.get(version)

    def for_round(self, step: int) -> SyncPolicy | None:
        """The policy governing round ``step`` (None if none is effective yet)."""
        ok = [v for v, p in self._by_version.items() if p.effective_step <= step]
        return self._by_version[max(ok)] if ok else None

    def governing_from(self, step: int) -> list[SyncPolicy]:
        """The policies that govern round ``step`` or a later one: the one in force and every
        newer one not overtaken before it takes effect (a newer version that takes effect
        no later than it does)."""
        out: list[SyncPolicy] = []
        start = None  # the earliest effective step of a newer policy seen so far
        for v in sorted(self._by_version, reverse=True):
            p = self._by_version[v]
            if start is None or max(p.effective_step, step) < start:
                out.append(p)
                start = max(p.effective_step, step)
            if p.effective_step <= step:
                break
        return out

    def knows(self, node: str) -> bool:
        """Whether ``node`` is a member of any recent policy (data-plane admission)."""
        return any(node in p.members for p in self._by_version.values())

    def addr_of(self, node: str) -> str | None:
        """The newest known data-plane address of ``node``."""
        for v in sorted(self._by_version, reverse=True):
            addr = self._by_version[v].addrs.get(node)
            if addr:
                return addr
        return None
