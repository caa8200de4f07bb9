"""Read commands: ``status``, ``nodes``, ``links`` and ``events``, with ``--watch``/``--follow``."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from datetime import datetime
from typing import Annotated, Any

import typer
from rich.console import Group, RenderableType
from rich.live import Live
from rich.text import Text

from chaosctl import views
from chaosctl.client import ControlClient, ControlFailure
from chaosctl.common import CliState, console, print_json, state_of

WATCH_INTERVAL_S = 1.0
FOLLOW_INTERVAL_S = 0.5

JsonOpt = Annotated[
    bool, typer.Option("--json", help="Print the daemon's data as JSON (stable keys).")
]
WatchOpt = Annotated[bool, typer.Option("--watch", "-w", help="Refresh every second until Ctrl-C.")]


def _watch(
    state: CliState,
    op: str,
    render: Callable[[Any], RenderableType],
    as_json: bool,
) -> None:
    """Poll ``op`` every second and show it live until Ctrl-C (which exits 0).

    The first poll's error is final (so a missing daemon still exits 3); later errors are shown
    in the view and polling goes on, because a monitor should outlive a daemon restart.
    """
    with state.client() as client:
        data = client.call(op)
        view = render(data)
        try:
            if as_json:
                # One compact document per line, so that scripts can read it as a stream.
                print_json(data, compact=True)
                while True:
                    time.sleep(WATCH_INTERVAL_S)
                    try:
                        print_json(client.call(op), compact=True)
                    except ControlFailure as exc:
                        print(f"chaosctl: {exc}", file=sys.stderr, flush=True)
                return
            with Live(_framed(view, state, None), console=console, auto_refresh=False) as live:
                while True:
                    time.sleep(WATCH_INTERVAL_S)
                    error = None
                    try:
                        view = render(client.call(op))
                    except ControlFailure as exc:
                        error = str(exc)
                    live.update(_framed(view, state, error), refresh=True)
        except KeyboardInterrupt:
            return


def _framed(view: RenderableType, state: CliState, error: str | None) -> RenderableType:
    stamp = datetime.now().strftime("%H:%M:%S")
    header = Text(f"chaosd at {state.socket}  ·  {stamp}  ·  Ctrl-C to quit", style="dim")
    return views.with_error(Group(header, view), error)


def _show(ctx: typer.Context, op: str, render: Callable[[Any], RenderableType],
          as_json: bool, watch: bool) -> None:
    state = state_of(ctx)
    if watch:
        _watch(state, op, render, as_json)
        return
    with state.client() as client:
        data = client.call(op)
    if as_json:
        print_json(data)
        return
    console.print(render(data))


def status(ctx: typer.Context, as_json: JsonOpt = False, watch: WatchOpt = False) -> None:
    """Show the cluster: scheduler and term, nodes per state, step, policy version."""
    _show(ctx, "status", lambda d: views.status_view(views.expect_dict(d, "status")),
          as_json, watch)


def nodes(ctx: typer.Context, as_json: JsonOpt = False, watch: WatchOpt = False) -> None:
    """List the nodes this daemon knows: state, address, heartbeat age, step."""
    _show(ctx, "nodes", lambda d: views.nodes_table(views.expect_rows(d, "nodes")),
          as_json, watch)


def links(ctx: typer.Context, as_json: JsonOpt = False, watch: WatchOpt = False) -> None:
    """List the data-plane links with their last RTT and bandwidth measurement."""
    _show(ctx, "links", lambda d: views.links_table(views.expect_rows(d, "links")),
          as_json, watch)


def events(
    ctx: typer.Context,
    as_json: JsonOpt = False,
    follow: Annotated[
        bool, typer.Option("--follow", "-f", help="Keep printing new events until Ctrl-C.")
    ] = False,
    limit: Annotated[
        int, typer.Option("--limit", "-n", min=1, help="Ask for at most this many events.")
    ] = 200,
) -> None:
    """Show the cluster's events (scale-out/in, link changes, failures, elections)."""
    state = state_of(ctx)
    with state.client() as client:
        rows = views.expect_rows(client.call("events", {"since": 0, "limit": limit}), "events")
        if not follow:
            if as_json:
                print_json(rows)
            else:
                console.print(views.events_table(rows))
            return
        try:
            _follow(client, rows, as_json, limit)
        except KeyboardInterrupt:
            return


def _emit(rows: list[dict[str, Any]], as_json: bool) -> None:
    for ev in rows:
        if as_json:
            print_json(ev, compact=True)
        else:
            console.print(views.event_line(ev), soft_wrap=True)


def _last_seq(rows: list[dict[str, Any]], default: int) -> int:
    seqs = [ev["seq"] for ev in rows if isinstance(ev.get("seq"), int)]
    return max(seqs, default=default)


def _follow(client: ControlClient, rows: list[dict[str, Any]], as_json: bool, limit: int) -> None:
    """Print events as they come, polling with ``since=<last seq>``."""
    _emit(rows, as_json)
    last = _last_seq(rows, 0)
    pid = _pid(client)
    lost = False
    while True:
        time.sleep(FOLLOW_INTERVAL_S)
        try:
            if lost:
                # A restarted daemon numbers its events afresh; start over from its first one.
                new_pid = _pid(client)
                if new_pid != pid:
                    pid, last = new_pid, 0
                lost = False
            batch = views.expect_rows(client.call("events", {"since": last, "limit": limit}),
                                      "events")
        except ControlFailure as exc:
            if not lost:
                print(f"chaosctl: {exc}; retrying", file=sys.stderr, flush=True)
            lost = True
            continue
        _emit(batch, as_json)
        last = _last_seq(batch, last)


def _pid(client: ControlClient) -> Any:
    data = client.call("ping")
    return data.get("pid") if isinstance(data, dict) else None
