"""Commands that change the cluster: ``join``, ``leave``, ``link add|del`` and ``probe``."""

from __future__ import annotations

import os
from typing import Annotated, Any

import typer

from chaosctl import views
from chaosctl.common import check_node_id, console, print_json, state_of

# Probing runs an iperf3 test (a few seconds, queued behind other tests on the same server).
PROBE_TIMEOUT_S = 60.0
# Joining may wait for the scheduler to plan and acknowledge the scale-out.
JOIN_TIMEOUT_S = 30.0

JsonOpt = Annotated[bool, typer.Option("--json", help="Print the daemon's answer as JSON.")]
PeerArg = Annotated[
    str, typer.Argument(metavar="PEER", callback=check_node_id, help="The peer's node id.")
]

link_app = typer.Typer(
    name="link",
    help="Open or close a data-plane link to a peer (connect-link / disconnect-link).",
    no_args_is_help=True,
)


def _check_ids(values: list[str] | None) -> list[str]:
    return [check_node_id(v) for v in values or []]


def _summary(data: Any, op: str) -> str:
    row = views.expect_dict(data, op)
    return f"{views.cell(row.get('node'))}: {views.cell(row.get('state'))}"


def join(
    ctx: typer.Context,
    neighbors: Annotated[list[str] | None, typer.Option(
        "--neighbor", "-n", metavar="ID", callback=_check_ids,
        help="Preferred neighbour to connect to (repeatable); the scheduler picks otherwise.",
    )] = None,
    command: Annotated[list[str] | None, typer.Argument(
        metavar="[-- CMD ARGS...]",
        help="Training command for the daemon to supervise on this node.",
    )] = None,
    as_json: JsonOpt = False,
) -> None:
    """Join this node to the training job (scale-out)."""
    # The daemon runs the command where and as the caller would (a relative script, a
    # venv's python), and remembers all three to start the job again after a reboot.
    args: dict[str, object] = {"neighbors": neighbors or [], "command": command or []}
    if command:
        args.update(cwd=os.getcwd(), env=dict(os.environ))
    with state_of(ctx).client(JOIN_TIMEOUT_S) as client:
        data = client.call("join", args)
    if as_json:
        print_json(data)
    else:
        console.print(_summary(data, "join"), highlight=False)


def leave(ctx: typer.Context, as_json: JsonOpt = False) -> None:
    """Leave the training job gracefully, after the current all-reduce (scale-in)."""
    with state_of(ctx).client(JOIN_TIMEOUT_S) as client:
        data = client.call("leave")
    if as_json:
        print_json(data)
    else:
        console.print(_summary(data, "leave"), highlight=False)


def _link(ctx: typer.Context, action: str, peer: str, as_json: bool) -> None:
    with state_of(ctx).client(PROBE_TIMEOUT_S) as client:
        data = client.call("link", {"action": action, "peer": peer})
    if as_json:
        print_json(data)
        return
    row = views.expect_dict(data, "link")
    console.print(
        f"link {views.cell(row.get('a'))} -- {views.cell(row.get('b'))}: "
        f"{views.cell(row.get('state'))}",
        highlight=False,
    )


@link_app.command("add")
def link_add(ctx: typer.Context, peer: PeerArg, as_json: JsonOpt = False) -> None:
    """Connect a link from this node to PEER and probe it."""
    _link(ctx, "add", peer, as_json)


@link_app.command("del")
def link_del(ctx: typer.Context, peer: PeerArg, as_json: JsonOpt = False) -> None:
    """Disconnect the link from this node to PEER."""
    _link(ctx, "del", peer, as_json)


def probe(ctx: typer.Context, peer: PeerArg, as_json: JsonOpt = False) -> None:
    """Measure RTT and bandwidth from this node to PEER."""
    with state_of(ctx).client(PROBE_TIMEOUT_S) as client:
        data = client.call("probe", {"peer": peer})
    if as_json:
        print_json(data)
    else:
        console.print(views.probe_view(views.expect_dict(data, "probe")))
