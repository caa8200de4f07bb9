"""Rich renderables for the daemon's answers: status panel, node, link and event tables.

Every function takes the ``data`` of one control-socket answer, already checked by
:func:`expect_dict` / :func:`expect_rows`, and tolerates missing or odd fields (shown as a dash),
because a view must never crash on a newer daemon's output.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from datetime import datetime
from typing import Any, TypeGuard

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from chaosctl.client import ControlProtocolError

DASH = "-"
SCHEDULER_MARK = "★"
STATE_STYLES: dict[str, str] = {
    "active": "bold green",
    "standby": "cyan",
    "joining": "yellow",
    "leaving": "yellow",
    "failed": "bold red",
    "left": "dim",
    "up": "green",
    "down": "bold red",
}
EVENT_STYLES: dict[str, str] = {
    "scale-out": "green",
    "scale-in": "yellow",
    "connect-link": "cyan",
    "disconnect-link": "magenta",
    "node-failed": "bold red",
    "link-failed": "red",
    "scheduler-elected": "bold blue",
    "partition": "bold magenta",
    "state-diverged": "bold red",
    "state-restored": "bold green",
    "state-lost": "bold red",
    "job-failed": "bold red",
    "round-stuck": "bold yellow",
    "snapshot-failed": "bold red",
    "policy-changed": "bold cyan",
    "straggler": "bold yellow",
}
# Shown in this order in status; unknown states follow, sorted.
STATE_ORDER = ("active", "joining", "standby", "leaving", "failed", "left")
EVENT_KEYS = ("seq", "ts", "kind", "node", "peer", "term", "delay_ms")


def expect_dict(data: Any, op: str) -> dict[str, Any]:
    """Return ``data`` if it is a JSON object, else raise :class:`ControlProtocolError`."""
    if not isinstance(data, dict):
        raise ControlProtocolError(f"chaosd's answer to '{op}' is not an object")
    return data


def expect_rows(data: Any, op: str) -> list[dict[str, Any]]:
    """Return ``data`` if it is a list of JSON objects, else raise :class:`ControlProtocolError`."""
    if not isinstance(data, list) or not all(isinstance(row, dict) for row in data):
        raise ControlProtocolError(f"chaosd's answer to '{op}' is not a list of objects")
    return data


def cell(value: Any) -> str:
    """Format a scalar for a table cell; ``None`` becomes a dash."""
    if value is None or value == "":
        return DASH
    if isinstance(value, float):
        return f"{value:.1f}"
    if isinstance(value, list | tuple):
        return ", ".join(str(v) for v in value) or DASH
    return str(value)


def styled(value: Any, styles: dict[str, str]) -> Text:
    """Return ``value`` as text, coloured by its entry in ``styles``."""
    text = cell(value)
    return Text(text, style=styles.get(text, ""))


def age(seconds: Any) -> Text:
    """Format a heartbeat age; old ages turn yellow, then red."""
    if not isinstance(seconds, int | float):
        return Text(DASH, style="dim")
    style = "red" if seconds >= 3 else "yellow" if seconds >= 1 else ""
    if seconds < 60:
        return Text(f"{seconds:.1f}s", style=style)
    minutes, secs = divmod(int(seconds), 60)
    return Text(f"{minutes}m{secs:02d}s", style=style)


def clock(ts: Any) -> str:
    """Format a Unix time as local wall-clock time with milliseconds."""
    if not isinstance(ts, int | float):
        return DASH
    return datetime.fromtimestamp(ts).strftime("%H:%M:%S.%f")[:-3]


def since(ts: Any, now: float | None = None) -> str:
    """Format a Unix time as an age, e.g. ``12s ago``."""
    if not isinstance(ts, int | float):
        return DASH
    delta = max(0.0, (time.time() if now is None else now) - ts)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if delta >= 2 * size:
            return f"{delta / size:.0f}{unit} ago"
    return f"{delta:.0f}s ago"


def state_counts(counts: Any) -> Text:
    """Render ``{state: count}`` as coloured ``active 3  failed 1`` text."""
    text = Text()
    if not isinstance(counts, dict) or not counts:
        return Text(DASH)
    ordered = [s for s in STATE_ORDER if s in counts]
    ordered += sorted(s for s in counts if s not in STATE_ORDER)
    for i, state in enumerate(ordered):
        if i:
            text.append("  ")
        text.append(f"{state} {counts[state]}", style=STATE_STYLES.get(state, ""))
    return text


def status_view(data: dict[str, Any]) -> RenderableType:
    """Render the ``status`` answer as a two-column grid."""
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold")
    grid.add_column()
    sched = data.get("scheduler")
    if isinstance(sched, dict):
        scheduler = Text(f"{SCHEDULER_MARK} {cell(sched.get('id'))}", style="bold blue")
        scheduler.append(f"  (term {cell(sched.get('term'))})", style="")
    else:
        scheduler = Text("none elected", style="bold red")
    grid.add_row("cluster", cell(data.get("cluster")))
    grid.add_row("node", cell(data.get("node")))
    grid.add_row("scheduler", scheduler)
    grid.add_row("nodes", state_counts(data.get("nodes")))
    grid.add_row("step", cell(data.get("step")))
    grid.add_row("policy version", cell(data.get("policy_version")))
    return grid


def policy_view(data: dict[str, Any]) -> RenderableType:
    """Render the ``policy.show`` answer (a sync policy's document) as a two-column grid."""
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold")
    grid.add_column()
    doc = data.get("sync")
    sync: dict[str, Any] = doc if isinstance(doc, dict) else {}
    mode = cell(sync.get("mode", "every-step"))
    if mode != "every-step":
        mode += f"  H={cell(sync.get('inner_steps'))}"
    if sync.get("mode") == "streaming":
        mode += f"  fragments={cell(sync.get('fragments'))}"
        mode += "  overlap" if sync.get("overlap") else ""
    grid.add_row("version", cell(data.get("version")))
    grid.add_row("effective step", cell(data.get("effective_step")))
    grid.add_row("sync", mode)
    grid.add_row("wire", cell(data.get("wire")))
    grid.add_row("members", ", ".join(map(str, data.get("members") or [])) or "none")
    grid.add_row("root", cell(data.get("root")))
    pinned = data.get("pinned") or []
    grid.add_row("pinned", ", ".join(map(str, pinned)) if pinned else "none (the controller "
                 "or [training] decides)")
    return grid


def nodes_table(rows: list[dict[str, Any]], title: str | None = None) -> Table:
    """Render the ``nodes`` answer; the scheduler's row is marked with a star."""
    table = Table(title=title, caption=f"{SCHEDULER_MARK} scheduler", caption_justify="left")
    table.add_column("", width=1, no_wrap=True)
    table.add_column("ID", style="bold", no_wrap=True)
    table.add_column("STATE", no_wrap=True)
    table.add_column("ADDR")
    table.add_column("HEARTBEAT", justify="right")
    table.add_column("STEP", justify="right")
    table.add_column("NEIGHBORS")
    for row in rows:
        mark = Text(SCHEDULER_MARK, style="bold blue") if row.get("scheduler") is True else ""
        table.add_row(
            mark,
            cell(row.get("id")),
            styled(row.get("state"), STATE_STYLES),
            cell(row.get("addr")),
            age(row.get("heartbeat_age_s")),
            cell(row.get("step")),
            cell(row.get("neighbors")),
        )
    return table


def links_table(rows: list[dict[str, Any]], now: float | None = None) -> Table:
    """Render the ``links`` answer."""
    table = Table()
    for name in ("A", "B", "STATE"):
        table.add_column(name, no_wrap=True)
    table.add_column("RTT ms", justify="right")
    table.add_column("BW Mbit/s", justify="right")
    table.add_column("MEASURED", justify="right")
    for row in rows:
        rtt = row.get("rtt_ms")
        table.add_row(
            cell(row.get("a")),
            cell(row.get("b")),
            styled(row.get("state"), STATE_STYLES),
            f"{rtt:.2f}" if isinstance(rtt, int | float) else DASH,
            cell(row.get("bandwidth_mbps")),
            since(row.get("measured_at"), now),
        )
    if not rows:
        table.caption = "no links"
    return table


def event_details(event: dict[str, Any]) -> str:
    """Return the event's extra keys (beyond the stable ones) as ``key=value`` pairs."""
    return " ".join(f"{k}={cell(v)}" for k, v in event.items() if k not in EVENT_KEYS)


def size(nbytes: Any) -> str:
    """Format a byte count in binary units: ``512 MiB``."""
    if not _num(nbytes):
        return DASH
    value, unit = float(nbytes), "B"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            break
        value /= 1024
    return f"{value:.0f} {unit}" if unit == "B" or value >= 100 else f"{value:.3g} {unit}"


def duration(ms: Any) -> str:
    """Format milliseconds for people: ``3.4 s``, ``120 ms``, ``2.5 ms``."""
    if not _num(ms):
        return DASH
    if ms >= 60_000:
        return f"{ms / 60_000:.1f} min"
    if ms >= 1000:
        return f"{ms / 1000:.1f} s"
    return f"{ms:.0f} ms" if ms >= 10 else f"{ms:.2g} ms"


def _num(value: Any) -> TypeGuard[int | float]:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _names(value: Any) -> str:
    return ", ".join(str(v) for v in value) if isinstance(value, list | tuple) else cell(value)


# Why a node left the rounds, as the scheduler words it (scale-in and node-failed reasons).
REASONS = {
    "worker-exit": "its worker exited",
    "worker-unresponsive": "its worker hung and was killed",
    "state-diverged": "its state diverged",
    "state-refused": "its worker refused the cluster's state",
    "daemon-left": "its daemon left",
    "failure": "its node failed",
    "last-will": "last will",
    "heartbeat": "heartbeats stopped",
    "probe": "probes failed",
}


def _scale_out(ev: dict[str, Any]) -> str:
    if ev.get("bootstrap"):
        return "first member: the cluster starts here"
    sources, nbytes = ev.get("sources"), ev.get("bytes")
    # The pull itself (what the bound bounds); the DELAY column has request-to-active.
    took = ev.get("transfer_ms") if _num(ev.get("transfer_ms")) else (
        ev.get("delay_ms") if _num(nbytes) else None)
    what = " ".join(p for p in (size(nbytes) if _num(nbytes) else "",
                                f"in {duration(took)}" if _num(took) else "") if p)
    bound = ev.get("lower_bound_ms")
    if what and _num(took) and _num(bound) and bound > 0:
        what += f" ({took / bound:.2f}x bound)"
    text = ": ".join(p for p in (f"from {_names(sources)}" if sources else "", what) if p)
    extra = []
    per_source = ev.get("per_source")
    if isinstance(per_source, dict):
        failed = sorted(k for k, v in per_source.items() if isinstance(v, dict)
                        and v.get("failed"))
        if failed:
            extra.append(f"{', '.join(failed)} failed mid-transfer")
    if _num(ev.get("replans")) and ev["replans"] > 0:
        extra.append(f"{ev['replans']} replan{'s' if ev['replans'] != 1 else ''}")
    if isinstance(ev.get("declined"), dict) and ev["declined"]:
        extra.append(f"declined by {', '.join(sorted(ev['declined']))}")
    if ev.get("strategy") not in (None, "chaos"):
        extra.append(f"{ev['strategy']} source")
    return "; ".join([text or "joined", *extra])


def _scale_in(ev: dict[str, Any]) -> str:
    reason = ev.get("reason")
    if reason == "leave":
        at = ev.get("effective_step")
        return f"left gracefully at step {at}" if _num(at) else "left gracefully"
    return f"dropped: {REASONS.get(str(reason), cell(reason))}"


def _link(ev: dict[str, Any]) -> str:
    kind = ev.get("kind")
    verb = {"connect-link": "connected", "disconnect-link": "disconnected"}.get(str(kind),
                                                                              "failed")
    text = f"link to {cell(ev.get('peer'))} {verb}"
    reason = ev.get("reason")
    return f"{text}: {REASONS.get(str(reason), str(reason))}" if reason else text


def _node_failed(ev: dict[str, Any]) -> str:
    parts = []
    if _num(ev.get("delay_ms")):
        parts.append(f"silent {duration(ev['delay_ms'])}")
    if ev.get("reason"):
        parts.append(REASONS.get(str(ev["reason"]), str(ev["reason"])))
    text = ", ".join(parts) or "failed"
    return f"{text}; was {ev['previous']}" if ev.get("previous") else text


def _elected(ev: dict[str, Any]) -> str:
    text = f"term {cell(ev.get('term'))}"
    previous = ev.get("previous")
    if not previous:
        return f"{text}, first scheduler"
    text += f", after {previous}"
    return f"{text} (silent {duration(ev['delay_ms'])})" if _num(ev.get("delay_ms")) else text


def _partition(ev: dict[str, Any]) -> str:
    kept, parts = ev.get("kept"), ev.get("parts")
    kept = kept if isinstance(kept, list) else []
    parts = parts if isinstance(parts, list) else []
    lost = sorted({str(n) for p in parts if isinstance(p, list) for n in p} - set(map(str, kept)))
    return f"kept {_names(kept) or DASH}; lost {_names(lost) or DASH}"


def _diverged(ev: dict[str, Any]) -> str:
    def short(digest: Any) -> str:
        return digest[:8] if isinstance(digest, str) and digest else DASH

    return (f"at step {cell(ev.get('step'))}: {short(ev.get('digest'))} vs majority "
            f"{short(ev.get('majority'))}")


def _state(ev: dict[str, Any]) -> str:
    """``state-lost`` / ``state-restored``: where training goes on from, and what it cost."""
    where = f"from step {cell(ev.get('step'))}"
    if ev.get("source"):
        where += f" of {ev['source']}"
    lost = ev.get("steps_lost")
    if "steps_lost" in ev and lost is None:  # the cluster's step was lost with its broker
        return f"{where}; steps lost unknown"
    return f"{where}; {lost} steps lost" if _num(lost) and lost > 0 else where


def _job_failed(ev: dict[str, Any]) -> str:
    """``job-failed``: the job chaosd supervises could not start (it is not retried)."""
    detail = ev.get("detail")
    return f"the job did not start: {detail}" if detail else "the job did not start"


def _stuck(ev: dict[str, Any]) -> str:
    """``round-stuck``: a worker's step timeout passed; it keeps its state and waits."""
    waited = ev.get("waited_s")
    text = f"step {cell(ev.get('step'))}"
    text += f" waiting {duration(waited * 1e3)}" if _num(waited) else " waiting"
    return f"{text}: {ev['reason']}" if ev.get("reason") else text


def _snapshot_failed(ev: dict[str, Any]) -> str:
    """``snapshot-failed``: a member's disk refused a snapshot; it trains on without them."""
    return f"no more snapshots: {ev['reason']}" if ev.get("reason") else "no more snapshots"


def _policy_changed(ev: dict[str, Any]) -> str:
    """``policy-changed``: the controller's switch, its prediction, and the model's check on
    the policy it left (predicted when chosen against measured)."""
    text = f"{cell(ev.get('previous'))} -> {cell(ev.get('policy'))}"
    if ev.get("effective_step") is not None:
        text += f" at step {cell(ev.get('effective_step'))}"
    if _num(ev.get("predicted_step_ms")) and _num(ev.get("previous_step_ms")):
        text += (f": {duration(ev['predicted_step_ms'])} a step predicted, against "
                 f"{duration(ev['previous_step_ms'])}")
    elif str(ev.get("reason", "")).startswith("set by the operator"):
        text += ": set by the operator"
    chosen, measured = ev.get("previous_chosen_ms"), ev.get("previous_measured_ms")
    if _num(chosen) and _num(measured) and measured > 0:
        text += f"; the policy left ran {duration(measured)} ({chosen / measured - 1:+.0%} off)"
    return text


def _straggler(ev: dict[str, Any]) -> str:
    """``straggler``: a member set aside for its compute or links (predicted gain), let back
    in, or the gain measured after it was set aside."""
    gain, action = ev.get("predicted_gain"), ev.get("action")
    predicted = f"{gain:+.0%} samples/s predicted" if _num(gain) else "gain not predicted"
    if action == "measured":
        got = ev.get("measured_gain")
        return (f"set aside: {got:+.0%} samples/s measured, {predicted}" if _num(got)
                else f"set aside: no step rate to measure, {predicted}")
    if action == "rejoin":
        return f"rejoins ({cell(ev.get('cause'))}), {predicted} with it"
    return f"set aside for its {cell(ev.get('cause'))}: {predicted} without it"


SUMMARIES = {
    "scale-out": _scale_out, "scale-in": _scale_in, "connect-link": _link,
    "disconnect-link": _link, "link-failed": _link, "node-failed": _node_failed,
    "scheduler-elected": _elected, "partition": _partition, "state-diverged": _diverged,
    "state-restored": _state, "state-lost": _state, "job-failed": _job_failed,
    "round-stuck": _stuck, "snapshot-failed": _snapshot_failed,
    "policy-changed": _policy_changed, "straggler": _straggler,
}


def event_summary(event: dict[str, Any]) -> str:
    """A short line for people about what the event says (``--json`` keeps every field).

    Uses whichever fields the event carries, so an older daemon's events still read; a kind
    this version does not know shows its fields as ``key=value`` pairs.
    """
    summarize = SUMMARIES.get(str(event.get("kind")))
    if summarize is None:
        return event_details(event)
    try:
        text = summarize(event)
    except (TypeError, ValueError, KeyError, AttributeError):  # odd fields: never crash
        return event_details(event)
    stall = event.get("stall_ms")
    return f"{text}; stall {duration(stall)}" if _num(stall) and stall > 0 else text


def delay(value: Any) -> str:
    """Format a ``delay_ms`` value."""
    return f"{value:.0f} ms" if isinstance(value, int | float) else DASH


def events_table(rows: Iterable[dict[str, Any]], title: str | None = None) -> Table:
    """Render a list of events, oldest first."""
    table = Table(title=title)
    table.add_column("SEQ", justify="right", style="dim")
    table.add_column("TIME", no_wrap=True)
    table.add_column("KIND", no_wrap=True)
    table.add_column("NODE", no_wrap=True)
    table.add_column("PEER", no_wrap=True)
    table.add_column("TERM", justify="right")
    table.add_column("DELAY", justify="right", no_wrap=True)
    # The summary may be long: it wraps, the ids above never do.
    table.add_column("DETAILS", overflow="fold", ratio=1)
    for ev in rows:
        table.add_row(
            cell(ev.get("seq")),
            clock(ev.get("ts")),
            styled(ev.get("kind"), EVENT_STYLES),
            cell(ev.get("node")),
            cell(ev.get("peer")),
            cell(ev.get("term")),
            delay(ev.get("delay_ms")),
            event_summary(ev),
        )
    return table


def event_line(ev: dict[str, Any]) -> Text:
    """Render one event as a single line, for ``events --follow``."""
    text = Text(f"{clock(ev.get('ts'))}  ")
    text.append(f"{cell(ev.get('kind')):<17}", style=EVENT_STYLES.get(str(ev.get("kind")), ""))
    text.append(f" node={cell(ev.get('node'))}")
    for key in ("peer", "term"):
        if ev.get(key) is not None:
            text.append(f" {key}={cell(ev.get(key))}")
    if ev.get("delay_ms") is not None:
        text.append(f" delay={delay(ev.get('delay_ms'))}")
    extra = event_summary(ev)
    if extra:
        text.append(f"  {extra}", style="dim")
    return text


def probe_view(data: dict[str, Any]) -> RenderableType:
    """Render the ``probe`` answer."""
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold")
    grid.add_column()
    rtt = data.get("rtt_ms")
    grid.add_row("peer", cell(data.get("peer")))
    grid.add_row("rtt", f"{rtt:.2f} ms" if isinstance(rtt, int | float) else DASH)
    bw = data.get("bandwidth_mbps")
    grid.add_row("bandwidth", f"{bw:.1f} Mbit/s" if isinstance(bw, int | float) else DASH)
    grid.add_row("method", cell(data.get("method")))
    grid.add_row("measured", clock(data.get("measured_at")))
    return grid


def with_error(view: RenderableType, error: str | None) -> RenderableType:
    """Append a red error line under a live view (the last poll failed)."""
    if not error:
        return view
    return Group(view, Text(error, style="bold red"))
