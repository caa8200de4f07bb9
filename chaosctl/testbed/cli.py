"""``chaosctl testbed ...``: build, drive and remove a network-namespace testbed (needs root).

The commands are thin: :class:`chaosctl.testbed.core.Testbed` does the work. ``up`` leaves the
testbed running and returns (``--foreground`` keeps a live table until Ctrl-C, then removes
it); every other command finds the testbed through ``--dir``'s state file.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from types import FrameType
from typing import Annotated

import typer
from rich.live import Live

from chaosctl.client import CtlUsageError
from chaosctl.common import console, print_json
from chaosctl.testbed import view as testbed_view
from chaosctl.testbed.core import DEFAULT_DIR, Testbed
from chaosctl.testbed.procs import requirements
from chaosctl.testbed.state import TestbedError, TestbedState, clean_dir
from chaosctl.testbed.topo import TOPOLOGIES, TopologyError, parse_bw
from netprobe import tc
from netprobe.errors import TcError

testbed_app = typer.Typer(
    name="testbed",
    help=(
        "Network-namespace testbeds (needs root): chaosd nodes in namespaces joined by veth "
        "links in a chosen or random topology, bandwidth shaped with tbf/htb and redrawn on a "
        "period, links cut, healed and re-shaped on command, and a clean teardown even after "
        "a crash. Delay and loss need netem, which these kernels lack: they are refused."
    ),
    no_args_is_help=True,
)

DirOpt = Annotated[Path, typer.Option(
    "--dir", "-d", metavar="DIR", help="The testbed's run directory (state, logs, sockets).",
)]
NodeArg = Annotated[str, typer.Argument(metavar="NODE", help="A node: n1, n2, ...")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON.")]
DelayOpt = Annotated[float, typer.Option(
    "--delay", metavar="MS", help="Per-link delay (needs netem; refused where it is missing).")]
LossOpt = Annotated[float, typer.Option(
    "--loss", metavar="PCT", help="Per-link loss (needs netem; refused where it is missing).")]
LIVE_REFRESH_S = 1.0


def _refuse_delay_loss(delay: float, loss: float) -> None:
    if not delay and not loss:
        return
    try:
        has_netem = tc.probe_qdisc_support(["netem"])["netem"]
    except TcError as exc:
        raise CtlUsageError(f"--delay/--loss need the netem qdisc, and {exc}") from None
    if not has_netem:
        raise CtlUsageError(f"--delay/--loss: {tc.NETEM_MISSING}")
    # netem would have to sit under the tbf/htb shaper; until that is built, refuse plainly.
    raise CtlUsageError("--delay/--loss are not supported by the testbed yet (netem exists "
                        "here, but chaining it under the bandwidth shaper is not built)")


@testbed_app.command()
def up(
    nodes: Annotated[int, typer.Option("--nodes", "-n", min=1, max=200,
                                       help="Number of nodes n1..nN.")] = 4,
    topology: Annotated[str, typer.Option(
        help=f"One of {', '.join(TOPOLOGIES)} (random: each new node links to --degree "
             "random earlier nodes).")] = "random",
    degree: Annotated[int, typer.Option(min=1, help="Neighbours per new node (random).")] = 2,
    bw: Annotated[str, typer.Option(metavar="LOW-HIGH",
                                    help="Link bandwidth range in Mbit/s.")] = "100-1000",
    redraw_period: Annotated[float, typer.Option(
        metavar="SECONDS", min=0.0, help="Redraw every link's bandwidth this often (0: never)."
    )] = 0.0,
    seed: Annotated[int, typer.Option(help="Seed for the topology and the bandwidths.")] = 0,
    qdisc: Annotated[str, typer.Option(help="Shaper: tbf or htb.")] = "tbf",
    directory: DirOpt = Path(DEFAULT_DIR),
    foreground: Annotated[bool, typer.Option(
        "--foreground", "-f", help="Stay up with a live table; Ctrl-C removes the testbed.",
    )] = False,
    wait: Annotated[float, typer.Option(metavar="SECONDS", min=1.0,
                                        help="How long to wait for the election.")] = 60.0,
    delay: DelayOpt = 0.0,
    loss: LossOpt = 0.0,
    as_json: JsonOpt = False,
) -> None:
    """Build a testbed and start chaosd in every node (a testbed left in --dir is removed)."""
    _refuse_delay_loss(delay, loss)
    try:
        tb = Testbed(directory, nodes, topology, parse_bw(bw), seed, degree, redraw_period,
                     qdisc)
    except TopologyError as exc:
        raise CtlUsageError(str(exc)) from None
    problems = requirements(qdisc)
    if problems:  # before touching a testbed left in --dir
        raise TestbedError("cannot build a testbed: " + "; ".join(problems))
    old = clean_dir(directory)
    if old is not None and not as_json:
        console.print(f"[dim]removed a testbed left in {directory} "
                      f"({len(old.namespaces)} namespaces)[/]")
    previous = signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        # SIGTERM during the build raises KeyboardInterrupt like Ctrl-C, so up() unwinds and
        # removes what it built instead of dying with namespaces left behind.
        tb.up(wait_s=wait)
    finally:
        signal.signal(signal.SIGTERM, previous)
    snap = testbed_view.snapshot(tb)
    if as_json:
        print_json(snap)
    else:
        console.print(testbed_view.render(snap))
    if foreground:
        _foreground(tb)
    elif not as_json:
        console.print(f"testbed up; drive it with 'chaosctl testbed ... --dir {directory}', "
                      f"remove it with 'chaosctl testbed down --dir {directory}'",
                      highlight=False)


def _foreground(tb: Testbed) -> None:
    stop = False

    def on_signal(_sig: int, _frame: FrameType | None) -> None:
        nonlocal stop
        stop = True  # only a flag: the loop below notices it at its next tick

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        with Live(testbed_view.render(testbed_view.snapshot(tb)), console=console,
                  refresh_per_second=4, transient=False) as live:
            next_at = time.monotonic() + LIVE_REFRESH_S
            while not stop:
                if time.monotonic() >= next_at:
                    live.update(testbed_view.render(testbed_view.snapshot(tb)))
                    next_at += LIVE_REFRESH_S
                time.sleep(0.1)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        console.print("removing the testbed ...")
        report = tb.down()
        console.print(f"removed {len(report.namespaces)} namespaces and "
                      f"{len(report.killed_pids)} processes")


@testbed_app.command()
def down(directory: DirOpt = Path(DEFAULT_DIR)) -> None:
    """Remove the testbed in --dir: every process, namespace, veth, socket and the state."""
    state = TestbedState.load(directory)
    if state is None:
        console.print(f"no testbed in {directory}; nothing to do", highlight=False)
        return
    report = clean_dir(directory)
    assert report is not None
    console.print(f"removed {len(report.namespaces)} namespaces and "
                  f"{len(report.killed_pids)} processes ({state.prefix}*)", highlight=False)


@testbed_app.command()
def status(directory: DirOpt = Path(DEFAULT_DIR), as_json: JsonOpt = False) -> None:
    """Show the testbed's nodes (chaosd, scheduler, view) and links (up or cut, bandwidth)."""
    snap = testbed_view.snapshot(Testbed.attach(directory))
    if as_json:
        print_json(snap)
    else:
        console.print(testbed_view.render(snap))


@testbed_app.command()
def cut(a: NodeArg, b: NodeArg, directory: DirOpt = Path(DEFAULT_DIR)) -> None:
    """Cut the data link between A and B (both ends go down; routes vanish)."""
    Testbed.attach(directory).cut(a, b)
    console.print(f"{a}-{b}: cut", highlight=False)


@testbed_app.command()
def heal(a: NodeArg, b: NodeArg, directory: DirOpt = Path(DEFAULT_DIR)) -> None:
    """Heal a cut data link between A and B."""
    Testbed.attach(directory).heal(a, b)
    console.print(f"{a}-{b}: up", highlight=False)


@testbed_app.command()
def shape(
    a: NodeArg,
    b: NodeArg,
    mbit: Annotated[float, typer.Option("--mbit", min=0.001, help="New bandwidth, Mbit/s.")],
    directory: DirOpt = Path(DEFAULT_DIR),
    delay: DelayOpt = 0.0,
    loss: LossOpt = 0.0,
) -> None:
    """Set the bandwidth of the link A-B, both directions (until the next redraw, if any)."""
    _refuse_delay_loss(delay, loss)
    Testbed.attach(directory).shape(a, b, mbit)
    console.print(f"{a}-{b}: {mbit:g} Mbit/s", highlight=False)


@testbed_app.command(name="exec", context_settings={"allow_interspersed_args": False})
def exec_(
    node: NodeArg,
    command: Annotated[list[str], typer.Argument(metavar="-- CMD ARGS...",
                                                 help="The command to run in the node.")],
    directory: DirOpt = Path(DEFAULT_DIR),
) -> None:
    """Run a command inside NODE's namespace, with CHAOS_SOCKET set to its chaosd.

    For example 'chaosctl testbed exec n1 -- chaosctl join -- python train.py'. The command
    replaces chaosctl, so its exit status is this command's.
    """
    if command and command[0] == "--":
        command = command[1:]  # after NODE, click keeps the separator as an argument
    if not command:
        raise CtlUsageError("exec needs a command: chaosctl testbed exec NODE -- CMD ARGS...")
    tb = Testbed.attach(directory)
    rec = tb.state.nodes.get(node)
    if rec is None:
        raise TestbedError(f"no node {node!r} in this testbed (nodes: {', '.join(tb.nodes)})")
    env = {**os.environ, "CHAOS_SOCKET": rec.socket, "CHAOS_NODE_ID": node}
    try:
        os.execvpe("ip", ["ip", "netns", "exec", rec.ns, *command], env)
    except OSError as exc:
        raise TestbedError(f"cannot run ip netns exec: {exc}") from None


@testbed_app.command()
def run(
    scenario: Annotated[Path, typer.Argument(metavar="SCENARIO", help="A scenario TOML file.")],
    directory: DirOpt = Path(DEFAULT_DIR),
) -> None:
    """Run a scripted chaos scenario on a fresh testbed, then check the invariants.

    Exits 1 if any invariant fails: states diverged, a step was lost or applied twice, the
    loss did not fall, or the survivors do not agree on a scheduler.
    """
    from chaosctl.testbed import scenario as sc_mod

    sc = sc_mod.load(scenario)
    report = sc_mod.Runner(sc, directory, lambda line: console.print(f"[dim]{line}[/]")).run()
    for node, span in sorted(report["steps"].items()):
        console.print(f"{node}: committed steps {span[0]}..{span[1]}" if span else
                      f"{node}: no steps")
    console.print(f"report: {directory / 'scenario.json'}")
    if report["failures"]:
        raise TestbedError("scenario failed: " + "; ".join(report["failures"]))
    console.print(f"[green]scenario {sc.name}: all invariants hold[/]")
