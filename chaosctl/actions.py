"""Commands that change the cluster: ``join``, ``leave``, ``link add|del``, ``probe`` and
``policy show|set|auto``."""

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


policy_app = typer.Typer(
    name="policy",
    help="Show or set the cluster's sync policy (sync mode, DiLoCo's H, fragments, wire).",
    no_args_is_help=True,
)
SYNC_CHOICES = ("every-step", "diloco", "streaming")
WIRE_CHOICES = ("fp32", "fp16", "bf16", "int8")


@policy_app.command("show")
def policy_show(ctx: typer.Context, as_json: JsonOpt = False) -> None:
    """Show the newest sync policy: its mode, wire, tree and the parts an operator pinned."""
    with state_of(ctx).client() as client:
        data = client.call("policy.show")
    if as_json:
        print_json(data)
    elif data is None:
        console.print("no sync policy yet: no node has joined", highlight=False)
    else:
        console.print(views.policy_view(views.expect_dict(data, "policy.show")))


def _choice(choices: tuple[str, ...], what: str) -> Any:
    def check(value: str | None) -> str | None:
        if value is not None and value not in choices:
            raise typer.BadParameter(f"{what} {value!r} is not one of {', '.join(choices)}")
        return value
    return check


@policy_app.command("set")
def policy_set(
    ctx: typer.Context,
    sync: Annotated[str | None, typer.Option(
        "--sync", metavar="MODE", callback=_choice(SYNC_CHOICES, "sync mode"),
        help="every-step, diloco or streaming.")] = None,
    inner_steps: Annotated[int | None, typer.Option(
        "--inner-steps", "-H", min=1, help="DiLoCo's H: local steps per outer step.")] = None,
    fragments: Annotated[int | None, typer.Option(
        "--fragments", min=2, help="streaming: parts synced in turn (must divide H).")] = None,
    overlap: Annotated[bool | None, typer.Option(
        "--overlap/--no-overlap", help="streaming: a round runs beside the next step.")] = None,
    wire: Annotated[str | None, typer.Option(
        "--wire", metavar="FORMAT", callback=_choice(WIRE_CHOICES, "wire format"),
        help="fp32, fp16, bf16 or int8.")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Set parts of the cluster's policy and pin them against the controller. The rest stays
    as in force; the switch lands at the cluster's next round boundary."""
    args: dict[str, Any] = {}
    if sync:
        args["sync"] = sync
    if inner_steps:
        args["inner_steps"] = inner_steps
    if fragments:
        args["fragments"] = fragments
    if overlap is not None:
        args["overlap"] = "on" if overlap else "off"
    if wire:
        args["wire"] = wire
    if not args:
        raise typer.BadParameter("name at least one of --sync, --inner-steps, --fragments, "
                                 "--overlap/--no-overlap, --wire")
    _policy(ctx, args, as_json)


@policy_app.command("auto")
def policy_auto(ctx: typer.Context, as_json: JsonOpt = False) -> None:
    """Hand the parts an operator pinned back to the policy controller."""
    _policy(ctx, {"auto": True}, as_json)


def _policy(ctx: typer.Context, args: dict[str, Any], as_json: bool) -> None:
    with state_of(ctx).client(JOIN_TIMEOUT_S) as client:
        data = client.call("policy", args)
    if as_json:
        print_json(data)
    else:
        said = ", ".join(f"{k}={v}" for k, v in args.items())
        console.print(f"policy: {said} sent to the scheduler; `chaosctl events` shows the "
                      "switch", highlight=False)
