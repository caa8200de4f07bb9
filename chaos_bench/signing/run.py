"""What signing the control plane costs: bytes and CPU per message, before and after.

``chaosctl bench signing [--quick] [--nodes N,...] [--out DIR]``

Each control message a daemon sends goes through ``messages.encode`` and, with a cluster
secret, ``ControlAuth.seal``; each one it receives goes through ``ControlAuth.open`` and then
``messages.decode``. "Before" is the plain path (encode, decode), "after" the signed one, on
the same message objects: a heartbeat, a leader claim, a replicate command and the retained
cluster snapshot of the real scheduler at several sizes. CPU is process time per message, the
median of several timed batches. From the heartbeat's figures it derives what a node spends
per second at the default heartbeat interval, and what the scheduler (which alone opens every
follower's heartbeat) spends at each cluster size.

Writes ``signing.json`` and ``signing.md`` (and ``signing.png`` with matplotlib) to DIR.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from chaos_bench.output import Output
from chaos_bench.progress import Say
from chaos_bench.sim.broker import full_snapshot
from daemon.contracts.config import Config
from daemon.contracts.messages import (
    Command,
    Heartbeat,
    LeaderClaim,
    Message,
    Topics,
    decode,
    encode,
)
from daemon.contracts.signing import ControlAuth, control_key

SECRET = "bench-secret-0123456789abcdef"  # any secret: the cost does not depend on it
FULL_SIZES = [12, 48, 1000]
QUICK_SIZES = [12, 48]


@dataclass(frozen=True)
class Case:
    name: str
    topic: str
    msg: Message


def cases(sizes: list[int]) -> list[Case]:
    """The messages measured, on the topics they travel on."""
    t = Topics("bench")
    hb = Heartbeat(node="node-17", seq=123456, incarnation=1764201600123, step=48213,
                   state="active", cpu_percent=37.5, mem_percent=61.2, battery_percent=None,
                   policy_version=3000012)
    claim = LeaderClaim(id="node-3", term=7, ts=1764201600.123, training=47)
    cmd = Command(term=7, leader="node-3", seq=912, op="replicate",
                  args={"version_step": 48220, "new": "node-49",
                        "sources": {"node-4": "10.0.0.4:7301", "node-9": "10.0.0.9:7301",
                                    "node-12": "10.0.0.12:7301"},
                        "neighbors": ["node-4", "node-9", "node-12"],
                        "policy_version": 7000031, "strategy": "chaos",
                        "links": {"node-4": {"rtt_ms": 1.2, "bandwidth_mbps": None}}})
    out = [Case("heartbeat", t.hb("node-17"), hb),
           Case("leader claim", t.leader, claim),
           Case("replicate command", t.cmd("node-49"), cmd)]
    out += [Case(f"cluster state, {n} nodes", t.state, full_snapshot(n)) for n in sizes]
    return out


def _per_op_us(fn: Callable[[], object], batch_s: float, repeats: int) -> float:
    """Median process time of one call, in microseconds, over ``repeats`` batches of about
    ``batch_s`` each (well above the timer's grain)."""
    t0 = time.perf_counter()
    fn()
    batch = max(1, min(20_000, int(batch_s / max(time.perf_counter() - t0, 1e-7))))
    times = []
    for _ in range(repeats):
        t0 = time.process_time_ns()
        for _ in range(batch):
            fn()
        times.append((time.process_time_ns() - t0) / batch / 1000.0)
    return statistics.median(times)


def measure(case: Case, auth: ControlAuth, repeats: int, batch_s: float = 0.02
            ) -> dict[str, Any]:
    """Bytes and CPU of one message, plain and signed; checks the round trip first."""
    plain = encode(case.msg)
    now = time.time()
    sealed = auth.seal(case.topic, plain, now)
    if decode(auth.open(case.topic, sealed, now)) != decode(plain):
        raise RuntimeError(f"{case.name}: the signed round trip changed the message")
    # A receiver refuses a replay, so the open timings use a receiver that remembers nothing.
    fresh = ControlAuth(auth_key(), window_s=1e9)

    def open_signed() -> object:
        fresh._seen.clear()  # the replay cache is part of the cost, its growth is not
        return decode(fresh.open(case.topic, sealed, now))

    send_plain = _per_op_us(lambda: encode(case.msg), batch_s, repeats)
    send_signed = _per_op_us(lambda: auth.seal(case.topic, encode(case.msg), now), batch_s,
                             repeats)
    recv_plain = _per_op_us(lambda: decode(plain), batch_s, repeats)
    recv_signed = _per_op_us(open_signed, batch_s, repeats)
    return {"message": case.name, "bytes_plain": len(plain), "bytes_signed": len(sealed),
            "send_us_plain": round(send_plain, 2), "send_us_signed": round(send_signed, 2),
            "recv_us_plain": round(recv_plain, 2), "recv_us_signed": round(recv_signed, 2)}


def auth_key() -> bytes:
    return control_key(SECRET, "bench")


def heartbeat_load(row: dict[str, Any], interval_s: float, sizes: list[int]
                   ) -> list[dict[str, Any]]:
    """CPU share of heartbeats: each node sends one per interval; the scheduler opens the
    other ``n - 1`` nodes' ones."""
    per_s = 1.0 / interval_s
    out = []
    for n in sizes:
        out.append({"nodes": n,
                    "follower_cpu_pct_plain": row["send_us_plain"] * per_s / 1e4,
                    "follower_cpu_pct_signed": row["send_us_signed"] * per_s / 1e4,
                    "scheduler_cpu_pct_plain": (row["send_us_plain"] + (n - 1)
                                                * row["recv_us_plain"]) * per_s / 1e4,
                    "scheduler_cpu_pct_signed": (row["send_us_signed"] + (n - 1)
                                                 * row["recv_us_signed"]) * per_s / 1e4})
    return out


def run(quick: bool, sizes: list[int] | None, out: Path, say: Say
        ) -> dict[str, Any]:
    sizes = sizes or (QUICK_SIZES if quick else FULL_SIZES)
    repeats = 3 if quick else 9
    auth = ControlAuth(auth_key(), window_s=1e9)
    rows = []
    for case in cases(sizes):
        say(f"measuring {case.name}")
        rows.append(measure(case, auth, repeats, 0.005 if quick else 0.05))
    interval = Config().detector.heartbeat_interval_s
    hb = next(r for r in rows if r["message"] == "heartbeat")
    doc = {"quick": quick, "repeats": repeats, "heartbeat_interval_s": interval,
           "rows": rows, "heartbeat_load": heartbeat_load(hb, interval, [1, *sizes])}
    output = Output(out, say)
    output.json("signing.json", doc)
    output.text("signing.md", table(doc))
    output.figure("signing.png", lambda plt: draw(plt, doc))
    return doc


def _ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}x" if b > 0 else "-"


def table(doc: dict[str, Any]) -> str:
    """Markdown: bytes and CPU per message, then the heartbeat load per cluster size."""
    lines = ["| message | bytes plain | signed | +bytes | send us plain | signed | ratio "
             "| receive us plain | signed | ratio |", "|---|" + "---:|" * 9]
    for r in doc["rows"]:
        lines.append(
            f"| {r['message']} | {r['bytes_plain']} | {r['bytes_signed']} "
            f"| +{r['bytes_signed'] - r['bytes_plain']} | {r['send_us_plain']:.1f} "
            f"| {r['send_us_signed']:.1f} | {_ratio(r['send_us_signed'], r['send_us_plain'])} "
            f"| {r['recv_us_plain']:.1f} | {r['recv_us_signed']:.1f} "
            f"| {_ratio(r['recv_us_signed'], r['recv_us_plain'])} |")
    lines += ["", f"Heartbeats every {doc['heartbeat_interval_s']:g} s, CPU % of one core:", "",
              "| nodes | follower plain | signed | scheduler plain | signed |",
              "|---:|---:|---:|---:|---:|"]
    for h in doc["heartbeat_load"]:
        lines.append(f"| {h['nodes']} | {h['follower_cpu_pct_plain']:.4f} "
                     f"| {h['follower_cpu_pct_signed']:.4f} "
                     f"| {h['scheduler_cpu_pct_plain']:.3f} "
                     f"| {h['scheduler_cpu_pct_signed']:.3f} |")
    return "\n".join(lines)


def draw(plt: Any, doc: dict[str, Any]) -> Any:
    rows = doc["rows"]
    names = [r["message"] for r in rows]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, key, title in ((axes[0], "send", "encode (+ seal)"),
                           (axes[1], "recv", "(open +) decode")):
        xs = range(len(rows))
        ax.bar([x - 0.2 for x in xs], [r[f"{key}_us_plain"] for r in rows], 0.4, label="plain")
        ax.bar([x + 0.2 for x in xs], [r[f"{key}_us_signed"] for r in rows], 0.4,
               label="signed")
        ax.set_yscale("log")
        ax.set_xticks(list(xs), names, rotation=30, ha="right", fontsize=8)
        ax.set_ylabel("CPU us per message")
        ax.set_title(title)
        ax.legend()
    return fig
