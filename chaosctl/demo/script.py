"""The demo's script over a started :class:`LocalCluster`: elect, fail, fail over, rejoin.

The training act (:mod:`chaosctl.demo.train`) plugs in through :attr:`Script.act`, so this
module needs nothing from it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

from chaosctl.cluster import ClusterError, LocalCluster
from chaosctl.demo.view import DemoView
from chaosctl.polling import agreed

T = TypeVar("T")
POLL_S = 0.2
ELECT_TIMEOUT_S = 30.0
DETECT_TIMEOUT_S = 20.0
FAILOVER_TIMEOUT_S = 30.0
REJOIN_TIMEOUT_S = 30.0
STEP_PAUSE_S = 1.0
UP_STATES = ("standby", "joining", "active")


@dataclass
class Timings:
    """What the demo measured with its own clock, in seconds, keyed by step."""

    seconds: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Cast:
    """Who played which part in the script."""

    observer: str
    victim: str
    old_leader: str
    new_leader: str


class Script:
    """The demo's steps, over a started :class:`LocalCluster`."""

    def __init__(self, cluster: LocalCluster, view: DemoView, train: bool = True) -> None:
        self.cluster = cluster
        self.view = view
        self.train = train
        # The training act, run on the live nodes after the restart; returns the survivors.
        self.act: Callable[[list[str]], list[str]] | None = None
        self.survivors: list[str] = []
        self.killed: set[str] = set()
        self.timings = Timings()

    def wait(self, check: Callable[[], T | None], timeout: float, what: str) -> T:
        """Poll ``check`` (refreshing the view) until it returns a value, or fail."""
        deadline = time.monotonic() + timeout
        while True:
            self.refresh()
            result = check()
            if result is not None and result is not False:
                return result
            if time.monotonic() > deadline:
                raise ClusterError(f"timed out after {timeout:g}s waiting for {what}")
            time.sleep(POLL_S)

    def refresh(self) -> None:
        """Fail on an unexpected exit, and update the table from the observer."""
        dead = [name for name in self.cluster.exited() if name not in self.killed]
        if dead:
            raise ClusterError(f"{dead[0]} exited unexpectedly; see "
                               f"{self.cluster.workdir / (dead[0] + '.log')}")
        if self.view.observer:
            self.view.update(self.cluster.query(self.view.observer, "nodes"))

    def pause(self, seconds: float) -> None:
        """Keep the view refreshing for ``seconds``."""
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            self.refresh()
            time.sleep(POLL_S)

    def scheduler_of(self, node_id: str) -> tuple[str, int] | None:
        """``(id, term)`` of the scheduler ``node_id`` sees, if any."""
        status = self.cluster.query(node_id, "status")
        sched = status.get("scheduler") if isinstance(status, dict) else None
        if isinstance(sched, dict) and isinstance(sched.get("term"), int):
            return str(sched.get("id")), int(sched["term"])
        return None

    def agreed(self, ids: list[str]) -> tuple[str, int] | None:
        """The scheduler that every node in ``ids`` sees and that sees them all up."""
        return agreed(self.cluster.query, ids, check_leader=False)

    def state_of(self, node_id: str) -> str | None:
        """The state of ``node_id`` in the observer's table."""
        for row in self.view.rows:
            if row.get("id") == node_id:
                return str(row.get("state"))
        return None

    def kill(self, node_id: str, role: str) -> float:
        """kill -9 ``node_id`` and return the monotonic time of the kill."""
        self.view.narrate(f"kill -9 {node_id} ({role})", style="bold red")
        self.killed.add(node_id)
        t = time.monotonic()
        self.cluster.kill(node_id)
        return t

    def run(self, duration: float) -> Cast:
        """Run every step and return who played which part."""
        cluster, view = self.cluster, self.view
        ids = cluster.node_ids
        view.narrate("starting the embedded broker")
        port = cluster.start_broker()
        view.narrate(f"broker ready on 127.0.0.1:{port}; starting {len(ids)} chaosd nodes")
        t0 = time.monotonic()
        for node_id in ids:
            cluster.start_node(node_id)
        view.observer = ids[0]
        leader, term = self.wait(lambda: self.agreed(ids), ELECT_TIMEOUT_S,
                                 "all nodes to agree on one scheduler")
        self.timings.seconds["cluster up"] = time.monotonic() - t0
        followers = [i for i in ids if i != leader]
        observer, victim = followers[0], followers[-1]
        view.observer = observer
        view.narrate(f"all {len(ids)} nodes see scheduler {leader} (term {term}) after "
                     f"{self.timings.seconds['cluster up']:.1f}s; watching from {observer}",
                     style="green")
        self.pause(STEP_PAUSE_S)
        view.snapshot()

        t = self.kill(victim, "a follower")
        self.wait(lambda: self.state_of(victim) == "failed", DETECT_TIMEOUT_S,
                  f"{observer} to declare {victim} failed")
        self.timings.seconds["follower failed"] = time.monotonic() - t
        view.narrate(f"{observer} sees {victim} failed after "
                     f"{self.timings.seconds['follower failed']:.2f}s", style="yellow")
        self.pause(STEP_PAUSE_S)
        view.snapshot()

        t = self.kill(leader, "the scheduler")

        def new_leader() -> tuple[str, int] | None:
            if "scheduler failed" not in self.timings.seconds and self.state_of(leader) == "failed":
                self.timings.seconds["scheduler failed"] = time.monotonic() - t
            sched = self.scheduler_of(observer)
            return sched if sched and sched[0] != leader and sched[1] > term else None

        new_id, new_term = self.wait(new_leader, FAILOVER_TIMEOUT_S,
                                     f"a new scheduler with a term above {term}")
        self.timings.seconds["failover"] = time.monotonic() - t
        view.narrate(f"failover: {new_id} is the scheduler (term {new_term} > {term}) after "
                     f"{self.timings.seconds['failover']:.2f}s", style="bold blue")
        self.pause(STEP_PAUSE_S)
        view.snapshot()

        view.narrate(f"restarting {leader} (the old scheduler)")
        t = time.monotonic()
        cluster.start_node(leader)
        self.killed.discard(leader)

        def back() -> bool:
            return self.state_of(leader) in UP_STATES and self.scheduler_of(leader) == (
                new_id, new_term)

        self.wait(back, REJOIN_TIMEOUT_S, f"{leader} to come back under {new_id}")
        self.timings.seconds["restart"] = time.monotonic() - t
        view.narrate(f"{leader} is back as {self.state_of(leader)} and follows {new_id} "
                     f"(term {new_term}) after {self.timings.seconds['restart']:.1f}s",
                     style="green")
        if self.train and self.act is not None:
            self.survivors = self.act([i for i in ids if i not in self.killed])
        if duration > 0:
            view.narrate(f"letting the cluster run for {duration:g}s")
            self.pause(duration)
        view.snapshot()
        return Cast(observer, victim, leader, new_id)

    def kill_worker(self, pid: int) -> None:
        """kill -9 a training worker's process group (it runs in its own session)."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)

