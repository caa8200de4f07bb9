"""``chaosctl demo``: a one-box showcase of membership, failure detection and failover.

It starts the embedded broker and N ``chaosd`` nodes in a temp dir (see
:mod:`chaosctl.cluster`), waits until every node sees one scheduler, then runs a script while
one node's table stays on screen: kill -9 of a follower (it goes ``failed``), kill -9 of the
scheduler (a new one takes over with a higher term), and a restart of the old scheduler (it
comes back as ``standby`` and does not take the lead back). It ends with the events and the
measured delays, and always tears every process down.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import tempfile
import time
from pathlib import Path
from types import FrameType
from typing import Annotated, Any

import typer
from rich.table import Table

from chaosctl import views
from chaosctl.client import CtlUsageError
from chaosctl.cluster import ClusterError, LocalCluster
from chaosctl.common import console
from chaosctl.demo.script import Cast, Script, Timings
from chaosctl.demo.train import TrainingAct, example_command, losses
from chaosctl.demo.view import DemoView


def _dump_worker_stacks(cluster: LocalCluster) -> None:
    """Have every worker write its threads' stacks into its worker.log (the example registers
    faulthandler on SIGUSR1): a failed demo keeps its logs, and a stack says where a stalled
    worker waits."""
    for node in cluster.node_ids:
        pid = ((cluster.query(node, "ping", timeout=2.0) or {}).get("worker") or {}).get("pid")
        if isinstance(pid, int) and pid > 0:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGUSR1)
    time.sleep(0.5)  # faulthandler writes from a signal handler: let it finish


def _find(events: list[dict[str, Any]], kind: str, node: str) -> Any:
    for ev in reversed(events):
        if ev.get("kind") == kind and ev.get("node") == node:
            return ev.get("delay_ms")
    return None


def summary(events: list[dict[str, Any]], timings: Timings, cast: Cast) -> Table:
    """The delays table: the daemon's own ``delay_ms`` next to the demo's clock."""
    victim, leader, new_leader = cast.victim, cast.old_leader, cast.new_leader
    table = Table(title="measured delays")
    table.add_column("WHAT")
    table.add_column("EVENT delay_ms", justify="right")
    table.add_column("DEMO CLOCK", justify="right")
    rows = [
        (f"{victim} kill -9 -> failed", _find(events, "node-failed", victim), "follower failed"),
        (f"{leader} kill -9 -> failed", _find(events, "node-failed", leader), "scheduler failed"),
        (f"{leader} kill -9 -> {new_leader} elected",
         _find(events, "scheduler-elected", new_leader), "failover"),
        (f"{leader} restart -> back", None, "restart"),
    ]
    for what, delay_ms, key in rows:
        secs = timings.seconds.get(key)
        table.add_row(what, views.delay(delay_ms), f"{secs:.2f} s" if secs is not None else "-")
    table.caption = ("delay_ms: the daemon's own measure; demo clock: from the kill until "
                     "the observer shows it (polled every 0.2 s)")
    table.caption_justify = "left"
    return table


def _raise_interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt  # SIGTERM takes the same clean-up path as Ctrl-C


def demo(
    nodes: Annotated[
        int, typer.Option("--nodes", min=3, max=16, help="How many chaosd nodes to start.")
    ] = 5,
    duration: Annotated[float, typer.Option(
        "--duration", min=0.0, metavar="SECONDS",
        help="How long to keep the cluster running after the script.",
    )] = 3.0,
    keep_dir: Annotated[
        bool, typer.Option("--keep-dir", help="Keep the temp dir with sockets and logs.")
    ] = False,
    no_live: Annotated[
        bool, typer.Option("--no-live", help="Plain lines instead of a live view (CI, pipes).")
    ] = False,
    train: Annotated[bool, typer.Option(
        "--train/--no-train", help="Also train a real model through joins, link changes, a "
        "leave and a kill (needs at least 5 nodes).")] = True,
) -> None:
    """Start a local cluster (embedded broker + N chaosd): failures and failover, then a real
    model training while nodes join, leave, fail and links change."""
    if train and nodes < 5:
        raise CtlUsageError("the training act needs --nodes 5 or more (or --no-train)")
    if train:
        example_command()  # fail now, not after the first act, if scikit-learn is missing
    workdir = Path(tempfile.mkdtemp(prefix="chaos-demo-"))
    live = not no_live and console.is_terminal
    view = DemoView(console, f"chaosctl demo: {nodes} nodes, cluster 'demo', dir {workdir}", live)
    cluster = LocalCluster(workdir, nodes)
    script = Script(cluster, view, train=train)
    script.act = TrainingAct(script).run
    previous = signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        with view:
            cast = script.run(duration)
            events = views.expect_rows(
                cluster.query(cast.observer, "events", timeout=5.0) or [], "events")
            trained = {n: losses(workdir, n) for n in script.survivors}
    except ClusterError as exc:
        keep_dir = True
        _dump_worker_stacks(cluster)
        raise ClusterError(f"demo failed: {exc} (logs kept in {workdir})") from None
    finally:
        cluster.close()
        signal.signal(signal.SIGTERM, previous)
        if not keep_dir:
            shutil.rmtree(workdir, ignore_errors=True)
    console.print(views.events_table(events, title=f"events seen by {cast.observer}"))
    console.print(summary(events, script.timings, cast))
    for node, seen in trained.items():
        if len(seen) >= 2:
            console.print(f"{node}: loss {seen[0][1]:.3f} at step {seen[0][0]} -> "
                          f"{seen[-1][1]:.3f} at step {seen[-1][0]} (accuracy {seen[-1][2]:.3f})")
    console.print("demo finished; every process is stopped"
                  + (f"; logs kept in {workdir}" if keep_dir else ""), style="green")
