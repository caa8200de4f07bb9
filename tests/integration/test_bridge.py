"""Two mosquitto brokers bridged into one topic space: one cluster, whatever broker a node uses.

The hub is the LocalCluster's mosquitto; a site mosquitto bridges ``chaos/#`` both ways to it
with the settings of ``deploy/bridge/site.conf``. The bridge runs through a TCP relay in this
process, so the test can cut the link between the sites (and only it) and heal it. node-1 and
node-3 attach to the hub, node-2 to the site, and their workers train together. Faults: the
scheduler is killed -9 (node-2, on the other broker, takes over), the bridge is cut and healed,
and the site broker restarts. Real chaosd processes, real brokers, real workers.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from chaosctl.cluster import Child, LocalCluster, free_port, mosquitto_binary
from tests.integration.conftest import need_mosquitto, wait_until
from tests.training._run import Run


class Relay:
    """A TCP relay from a local port to ``target``; :meth:`cut` drops the link, :meth:`heal`
    lets it through again (a cable between two sites, pulled and plugged back)."""

    def __init__(self, target: int) -> None:
        self.target = target
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self.listener.getsockname()[1])
        self.open = True
        self.conns: list[socket.socket] = []
        self.lock = threading.Lock()
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def _accept(self) -> None:
        while True:
            try:
                near, _ = self.listener.accept()
            except OSError:
                return  # closed
            if not self.open:
                near.close()
                continue
            try:
                far = socket.create_connection(("127.0.0.1", self.target), timeout=2)
            except OSError:
                near.close()
                continue
            # The timeout bounds the connect only: left on, a recv on a link quiet for 2 s
            # (the bridge's keepalive is 5 s) raised, and the pump dropped a live bridge.
            far.settimeout(None)
            with self.lock:
                self.conns += [near, far]
            for a, b in ((near, far), (far, near)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := src.recv(65536):
                dst.sendall(data)
        for s in (src, dst):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)

    def cut(self) -> None:
        self.open = False
        with self.lock:
            for s in self.conns:
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
                s.close()
            self.conns.clear()

    def heal(self) -> None:
        self.open = True

    def close(self) -> None:
        self.cut()
        with contextlib.suppress(OSError):
            self.listener.shutdown(socket.SHUT_RDWR)  # wakes the accept (close alone does not)
        self.listener.close()
        self.thread.join(timeout=2)


def site_conf(port: int, hub: int) -> str:
    """deploy/bridge/site.conf, on loopback: anonymous, no persistence, no TLS."""
    return (f"listener {port} 127.0.0.1\nallow_anonymous true\npersistence false\n"
            "log_dest stderr\nlog_type all\n"
            f"connection chaos-hub\naddress 127.0.0.1:{hub}\nremote_clientid chaos-bridge-site\n"
            "topic chaos/# both 1\nbridge_protocol_version mqttv311\ntry_private true\n"
            "cleansession true\nlocal_cleansession true\nstart_type automatic\n"
            "restart_timeout 1 2\nkeepalive_interval 5\nnotifications true\n")


class Sites:
    """The hub cluster, the site broker and the relay between them."""

    def __init__(self, workdir: Path, site_nodes: tuple[str, ...]) -> None:
        self.site_port = 0  # chosen at start, once the relay listens
        self.site_nodes = site_nodes
        self.c = LocalCluster(workdir, 3, cluster="bridged", broker_kind="mosquitto")
        self.relay: Relay | None = None
        self.site: Child | None = None

    def start(self) -> None:
        self.c.start_broker()
        self.relay = Relay(self.c.port)
        # A port free a moment ago can be taken before mosquitto binds it (the relay's own
        # listener, or an outgoing connection of another test): then another port.
        for attempt in range(3):
            self.site_port = free_port()
            if self.start_site(last=attempt == 2):
                break
        self.c.node_port = {n: self.site_port for n in self.site_nodes}
        for node in self.c.node_ids:
            self.c.start_node(node)

    def start_site(self, last: bool = True) -> bool:
        """Start the site broker on ``site_port``; False if the port was taken and this is
        not the ``last`` try."""
        assert self.relay is not None
        conf = self.c.workdir / "site.conf"
        conf.write_text(site_conf(self.site_port, self.relay.port))
        site = self.site = Child("site", [mosquitto_binary(), "-c", str(conf)],
                                 self.c.workdir / "site.log")
        offset = site.log.stat().st_size if site.log.exists() else 0
        self.c._spawn(site)
        wait_until(lambda: b"Connecting bridge" in site.log.read_bytes()[offset:]
                   or not site.alive(), 10, "the site broker to start its bridge")
        taken = b"Address already in use" in site.log.read_bytes()[offset:]
        if not site.alive() and taken and not last:
            return False
        assert site.alive(), f"the site broker exited; see {site.log}"
        return True

    def stop_site(self) -> None:
        if self.site is not None:
            LocalCluster.kill_child(self.site, signal.SIGKILL)

    def close(self, r: Run) -> None:
        for pid in [r.worker_pid(n) for n in self.c.node_ids]:
            if pid:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pid, signal.SIGKILL)
        self.c.close(grace=3.0)
        self.stop_site()
        if self.relay is not None:
            self.relay.close()


MakeSites = Callable[[tuple[str, ...]], tuple["Sites", Run]]


@pytest.fixture
def sites(tmp_path: Path) -> Iterator[MakeSites]:
    """Start the two brokers and three nodes, the given ones on the site broker."""
    need_mosquitto("mosquitto")
    made: list[tuple[Sites, Run]] = []

    def make(site_nodes: tuple[str, ...]) -> tuple[Sites, Run]:
        s = Sites(tmp_path / "c", site_nodes)
        r = Run(s.c, tmp_path)
        made.append((s, r))
        s.start()
        return s, r

    yield make
    for s, r in made:
        s.close(r)


@contextlib.contextmanager
def stopped(pid: int) -> Iterator[None]:
    """Hold a worker's process group stopped (SIGSTOP) for the block."""
    os.killpg(pid, signal.SIGSTOP)
    try:
        yield
    finally:  # its daemon may have killed it as hung meanwhile (a stopped worker polls not)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGCONT)


def leaders(c: LocalCluster) -> dict[str, int]:
    """node -> term, for every running node that says it is the scheduler."""
    out = {}
    for node in c.node_ids:
        info = c.query(node, "ping") or {}
        if info.get("leader"):
            out[node] = int(info["term"])
    return out


def consistent_after(r: Run, marks: dict[str, int]) -> int:
    """The steps each node committed after its first ``marks[node]`` records have one digest
    per step across nodes; how many steps two nodes or more shared."""
    by_step: dict[int, dict[str, str]] = {}
    for node, skip in marks.items():
        for row in r.records(node)[skip:]:
            by_step.setdefault(row["step"], {})[node] = row["digest"]
    diverged = {s: d for s, d in by_step.items() if len(set(d.values())) > 1}
    assert not diverged, f"steps diverged: {sorted(diverged.items())[:3]}"
    shared = sum(len(d) > 1 for d in by_step.values())
    assert shared > 0, "no step was committed by two nodes"
    return shared


def train_all(r: Run) -> tuple[str, int]:
    """One scheduler over both brokers, then every node trains; returns (scheduler, term)."""
    c, ids = r.c, r.c.node_ids
    sched, term = wait_until(lambda: c.agreed(ids, {"standby": 3}), 30,
                             "one scheduler across both brokers")
    r.join_all(ids)  # the first bootstraps the model, the others join it
    r.advance(ids, 5)
    return sched, term


def test_failover_across_brokers_and_a_broker_restart(sites: MakeSites) -> None:
    s, r = sites(("node-2",))
    c, ids = s.c, s.c.node_ids
    sched, term = train_all(r)
    assert sched == "node-1"  # on the hub
    # The scheduler dies with its worker: the lowest live id stands, on the site broker.
    r.signal_node(sched, signal.SIGKILL)
    survivors = [n for n in ids if n != sched]
    new, new_term = wait_until(lambda: c.agreed(survivors), 30, "a failover across brokers")
    assert new == "node-2" and new_term > term
    r.advance(survivors, 5)
    c.start_node(sched)  # it starts the job it remembers: no `chaosctl join`
    wait_until(lambda: c.agreed(ids), 30, "the restarted node to follow")
    wait_until(lambda: r.active(ids), 60, "the restarted node to rejoin")
    r.advance(ids, 5)
    # The site broker (the scheduler's) restarts with nothing retained: its nodes and its
    # bridge reconnect, and the hub's retained topics come back over the bridge.
    s.stop_site()
    s.start_site()
    wait_until(lambda: c.agreed(ids, {"active": 3}), 40, "one scheduler after the restart")
    r.advance(ids, 5)
    assert len(leaders(c)) == 1
    r.assert_consistent()


def test_bridge_cut_and_healed_follows_the_partition_rules(sites: MakeSites) -> None:
    s, r = sites(("node-1",))
    c, ids = s.c, s.c.node_ids
    hub = ["node-2", "node-3"]
    sched, term = train_all(r)
    assert sched == "node-1"  # on the site: the hub's side elects a newer term when cut
    assert s.relay is not None
    s.relay.cut()
    # Either hub node may stand: the stagger orders nodes that judge the silence at the same
    # moment, and node-3's detector may judge it first (its own echo came back sooner).
    hub_sched = wait_until(lambda: next((n for n, t in leaders(c).items()
                                         if n in hub and t > term), None),
                           90, "the hub side to elect")
    assert leaders(c).get("node-1") == term  # the site keeps its own, alone: two for now
    # The site's node trains alone, faster than two can: held, so that the hub's branch is
    # the newer one when the bridge heals (a contest ranks the newer state first).
    with stopped(r.worker_pid("node-1")):
        site_step = r.step("node-1")
        r.advance(hub, 5)
        wait_until(lambda: r.step("node-2") > site_step + 3, 60, "the hub to pass the site")
        s.relay.heal()
        # The newer term wins; the site's scheduler steps down and its node rejoins by
        # scale-out from the part that kept training, dropping the steps it took alone.
        wait_until(lambda: c.agreed(ids) and len(leaders(c)) == 1, 30,
                   "one scheduler after the bridge healed")
    assert (c.agreed(ids) or ("", 0))[0] == hub_sched
    # The healed bridge resent the retained topics, which reach subscribed nodes as live
    # copies of messages they had already accepted: the replay cache dropped them.
    replayed = sum((c.query(n, "ping") or {}).get("counters", {}).get("auth_replayed", 0)
                   for n in ids)
    assert replayed > 0
    wait_until(lambda: r.active(ids), 60, "the site's node a member again")
    marks = {n: len(r.records(n)) for n in ids}
    r.advance(ids, 5)
    consistent_after(r, marks)
    assert [e for e in r.events("scale-out") if e["node"] == "node-1" and e["term"] > term]


def test_the_larger_part_keeps_its_scheduler_when_the_cut_heals(sites: MakeSites) -> None:
    """The partition rule keeps the largest part, and a bridge cut no longer overturns it:
    the scheduler's side (two nodes on the hub, holding the newer state) outnumbers the
    cut-off site (one node, which elected a newer term), so after the heal it outbids that
    term; the site's node rejoins and the hub's nodes train on without a re-replication."""
    s, r = sites(("node-3",))
    c, ids = s.c, s.c.node_ids
    hub = ["node-1", "node-2"]
    sched, term = train_all(r)
    # On the hub: node-1 as a rule; node-2 when a loaded box started node-1 late (this
    # stop's suite run). Either is the hub's part, and that part keeps its scheduler.
    assert sched in hub
    assert s.relay is not None
    s.relay.cut()
    wait_until(lambda: leaders(c).get("node-3", 0) > term, 90, "the site to elect")
    site_term = leaders(c)["node-3"]
    r.advance(hub, 5)
    r.advance(["node-3"], 3)  # the site trains alone under its own term
    # A contest ranks the newer state first, then the nodes training: one node alone steps
    # faster than two, so its branch could be the newer one by the time the bridge heals.
    # Its worker waits (the daemon keeps its seat) until the hub's branch is clearly ahead.
    with stopped(r.worker_pid("node-3")):
        site_step = r.step("node-3")
        wait_until(lambda: r.step("node-1") > site_step + 3, 60, "the hub to pass the site")
        hub_joins = len([e for e in r.events("scale-out") if e["node"] in hub])
        s.relay.heal()
        wait_until(lambda: c.agreed(ids) and len(leaders(c)) == 1, 30,
                   "one scheduler after the bridge healed")
    new, new_term = c.agreed(ids) or ("", 0)
    assert new == sched and new_term > site_term
    outbid = [e for e in r.events("scheduler-elected") if e.get("contest")]
    assert outbid and outbid[-1]["contest"]["own"] > outbid[-1]["contest"]["rival"]
    wait_until(lambda: r.active(ids), 60, "the site's node a member again")
    marks = {n: len(r.records(n)) for n in ids}
    r.advance(ids, 5)
    consistent_after(r, marks)
    assert [e for e in r.events("scale-out") if e["node"] == "node-3" and e["term"] > term]
    # The larger part never left: no scale-out of a hub node since the cut.
    assert len([e for e in r.events("scale-out") if e["node"] in hub]) == hub_joins
