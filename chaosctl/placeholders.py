"""Placeholder group for ``chaosctl testbed``, filled by later work."""

from __future__ import annotations

import typer

from chaosctl.client import OperationFailed

testbed_app = typer.Typer(
    name="testbed",
    help=(
        "Network-namespace testbeds (coming soon): nodes in netns joined by veth links, "
        "bandwidth shaping with tbf/htb, and fault injection (link down, partition, delay "
        "and loss where the kernel allows) for scripted chaos tests. Needs root."
    ),
    invoke_without_command=True,
)

def _not_yet(ctx: typer.Context) -> None:
    if ctx.invoked_subcommand is None:
        raise OperationFailed(
            f"'{ctx.command_path}' has no commands in this version yet "
            f"(see '{ctx.command_path} --help')"
        )


testbed_app.callback()(_not_yet)
