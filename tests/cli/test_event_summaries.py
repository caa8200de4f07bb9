"""``chaosctl events``: one readable summary per event kind; ``--json`` keeps every field.

The events are real: the scheduler's own primitives record them (with a fake clock), and the
daemon's ``events`` read flattens them, exactly as a live cluster would answer.
"""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any, cast

import pytest

from chaosctl.views import event_summary
from daemon.agent import views as daemon_views
from daemon.agent.node import NodeAgent
from daemon.cluster.adapter import Adapter
from daemon.cluster.primitives import HOLD_S, Negotiator
from daemon.cluster.scheduler import Scheduler
from daemon.contracts.clock import FakeClock
from daemon.contracts.config import AdaptiveConfig, TrainingConfig
from daemon.contracts.kinds import EVENT_KINDS
from daemon.contracts.messages import Heartbeat, LinkRecord
from daemon.contracts.protocol import (
    Replicated,
    RoundStuck,
    SnapshotFailed,
    Stall,
    StateDiverged,
    WorkerExit,
    parse_report,
)
from tests.cli.conftest import FakeDaemon, ok, run_ctl

pytestmark = pytest.mark.timeout(60)
MIB = 1 << 20
# What a joining worker reports when its state is in (chaos_edge/trainer/joiner.py), abridged.
REPLICATED = {
    "kind": "replicated", "version": 3, "bytes": 512 * MIB, "delay_ms": 3500.0,
    "transfer_ms": 3400.0, "decision_ms": 2.0, "strategy": "chaos",
    "sources": ["node-1", "node-2", "node-3"],
    "per_source": {"node-1": {"bytes": 200 * MIB, "end_s": 3.3},
                   "node-2": {"bytes": 200 * MIB, "end_s": 3.4},
                   "node-3": {"bytes": 112 * MIB, "end_s": 2.1, "failed": "reset by peer"}},
    "plan_inputs": [{"id": "node-1", "t_prop_s": 0.001, "t_trans_s_per_byte": 6e-9,
                     "tau_sync_s": 0.0}],
    "predicted_ms": 3300.0, "lower_bound_ms": 3148.0, "replans": 1, "refetched_blocks": 4,
}


def real_events() -> list[dict[str, Any]]:
    """One of every kind, recorded by the scheduler's primitives and read as chaosd serves."""
    clock = FakeClock()
    sched = Scheduler("node-1", 4, None, clock)
    neg = Negotiator(sched, clock, lambda _n: 100)
    sched.record("scheduler-elected", node="node-1", previous="node-9", term_previous=3,
                 delay_ms=2300.0)  # role.py's call, which needs a whole agent to make
    for n in ("node-1", "node-2", "node-3"):
        neg.join(n, f"127.0.0.1:{n[-1]}000", [])
        neg.replicated(n, Replicated(version=0))
    neg.join("node-4", "127.0.0.1:4000", ["node-1", "node-2", "node-3"])
    clock.advance(3.6)
    neg.replicated("node-4", parse_report(REPLICATED))  # type: ignore[arg-type]
    neg.stall("node-1", Stall(step=101, ms=41.5, policy_version=sched.policy_version))
    neg.link("node-4", "node-3", up=False, failed=True)
    neg.link("node-4", "node-3", up=True)
    # The links turn slow: the policy controller switches the wire (role.py's Adapter).
    adapter = Adapter(sched, neg, AdaptiveConfig(enabled=True, dwell=1, syncs=("every-step",)),
                      TrainingConfig(), clock)
    sched.links = [LinkRecord(a, b, "up", rtt_ms=1.0, bandwidth_mbps=5.0) for a, b in
                   sched.policy.edges] if sched.policy else []
    for n in sched.policy.members if sched.policy else ():
        adapter.heard(Heartbeat(node=n, seq=1, incarnation=1, step=100, state="active",
                                cpu_percent=0.0, mem_percent=0.0, compute_ms=50.0,
                                elements=100_000))
    assert adapter.tick()
    neg.leave("node-4", 200)
    neg.gone("node-2", "worker-unresponsive")
    sched.fail("node-2", "heartbeat", 2.1)
    # node-3 loses both its links: the cluster splits, node-1 keeps training.
    neg.link("node-1", "node-3", up=False)
    neg.diverged("node-1", StateDiverged(step=120, digest="ab" * 32, majority="cd" * 32))
    # node-7's daemon came back from a reboot and its remembered command was gone.
    neg.handle("node-7", WorkerExit(code=127, reason="job-failed", detail=(
        "cannot start worker /srv/old-venv/bin/python: No such file or directory")))
    # node-1's round waited past its step timeout; its worker keeps the state and waits.
    neg.handle("node-1", RoundStuck(step=121, waited_s=120.4, reason="last abort: timed out "
                                    "after waiting for neighbours ['node-3']"))
    neg.handle("node-1", SnapshotFailed(reason="/var/lib/chaos/snapshots: [Errno 28] No space "
                                        "left on device"))
    agent = SimpleNamespace(events={(ev.seq, ev.ts): ev for ev in sched.events})
    return daemon_views.events(cast(NodeAgent, agent), {})


def state_events() -> list[dict[str, Any]]:
    """Every member goes; a former one comes back with the newest state (state-restored),
    then goes too, and no holder comes back in time: a fresh model (state-lost)."""
    clock = FakeClock()
    sched = Scheduler("node-9", 5, None, clock)
    neg = Negotiator(sched, clock, lambda _n: 150)
    neg.join("node-5", "127.0.0.1:5000", [])
    neg.replicated("node-5", Replicated(version=0))
    sched.step = 150
    for node in ("node-5",):
        sched.fail(node, "heartbeat", 2.0)
        neg.gone(node, "failure")
    neg.join("node-5", "127.0.0.1:5000", [], step=150)
    sched.fail("node-5", "heartbeat", 2.0)
    neg.gone("node-5", "failure")
    neg.join("node-6", "127.0.0.1:6000", [], step=0)
    clock.advance(HOLD_S)
    neg.tick()
    agent = SimpleNamespace(events={(ev.seq, ev.ts): ev for ev in sched.events})
    return [ev for ev in daemon_views.events(cast(NodeAgent, agent), {})
            if ev["kind"] in ("state-restored", "state-lost")]


def straggler_events() -> list[dict[str, Any]]:
    """node-3's compute falls to 8x the others': set aside, the gain measured, a trial."""
    clock = FakeClock()
    sched = Scheduler("node-1", 4, None, clock)
    neg = Negotiator(sched, clock, lambda _n: 100)
    nodes = ("node-1", "node-2", "node-3")
    for n in nodes:
        neg.join(n, f"127.0.0.1:{n[-1]}000", [])
        neg.replicated(n, Replicated(version=0))
    sched.links = [LinkRecord(a, b, "up", rtt_ms=1.0, bandwidth_mbps=1000.0)
                   for i, a in enumerate(nodes) for b in nodes[i + 1:]]
    adapter = Adapter(sched, neg, AdaptiveConfig(enabled=True, dwell=1, min_interval_s=0.0,
                                                 syncs=("every-step",)), TrainingConfig(),
                      clock)
    for _ in range(40):
        for n in nodes:
            adapter.heard(Heartbeat(node=n, seq=1, incarnation=1, step=100, state="active",
                                    cpu_percent=0.0, mem_percent=0.0, elements=100_000,
                                    compute_ms=400.0 if n == "node-3" else 50.0))
        adapter.tick()
        clock.advance(2.0)
    agent = SimpleNamespace(events={(ev.seq, ev.ts): ev for ev in sched.events})
    return [ev for ev in daemon_views.events(cast(NodeAgent, agent), {})
            if ev["kind"] == "straggler"]


def by_kind(events: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [ev for ev in events if ev["kind"] == kind]


def test_every_kind_has_a_summary() -> None:
    events = real_events() + state_events() + straggler_events()
    assert {ev["kind"] for ev in events} == set(EVENT_KINDS)
    for ev in events:
        assert "=" not in event_summary(ev), ev  # no raw key=value dump for a known kind


def test_scale_out_says_sources_bytes_time_and_the_bound() -> None:
    boot, *plain, full = by_kind(real_events(), "scale-out")
    assert event_summary(boot) == "first member: the cluster starts here"
    assert event_summary(plain[0]) == "joined"
    assert event_summary(full) == ("from node-1, node-2, node-3: 512 MiB in 3.4 s (1.08x bound)"
                                   "; node-3 failed mid-transfer; 1 replan; stall 42 ms")


def test_the_other_kinds() -> None:
    events = real_events()
    summary = {ev["kind"]: event_summary(ev) for ev in events}  # the last of each kind
    assert summary["scheduler-elected"] == "term 4, after node-9 (silent 2.3 s)"
    assert summary["link-failed"] == "link to node-3 failed"
    assert summary["connect-link"] == "link to node-3 connected"
    assert summary["node-failed"] == "silent 2.1 s, heartbeats stopped; was standby"
    assert summary["partition"] == "kept node-1; lost node-3"
    assert summary["state-diverged"] == "at step 120: abababab vs majority cdcdcdcd"
    assert summary["job-failed"] == ("the job did not start: cannot start worker "
                                     "/srv/old-venv/bin/python: No such file or directory")
    assert summary["snapshot-failed"] == ("no more snapshots: /var/lib/chaos/snapshots: "
                                          "[Errno 28] No space left on device")
    assert summary["policy-changed"].startswith(
        "every-step/fp32 -> every-step/int8 at step ")
    assert " a step predicted, against " in summary["policy-changed"]
    assert summary["round-stuck"] == ("step 121 waiting 2.0 min: last abort: timed out after "
                                      "waiting for neighbours ['node-3']")
    ins = [event_summary(ev) for ev in by_kind(events, "scale-in")]
    assert ins[0].startswith("left gracefully at step ")
    assert ins[1:] == ["dropped: its worker hung and was killed",
                       "dropped: its state diverged"]
    states = {ev["kind"]: event_summary(ev) for ev in state_events()}
    assert states == {"state-restored": "from step 150 of node-5",
                      "state-lost": "from step 0 of node-6; 150 steps lost"}
    # The broker lost the cluster's view with the power: what the cut cost is unknown.
    assert event_summary({"kind": "state-restored", "step": 280, "source": "node-1",
                          "steps_lost": None}) == "from step 280 of node-1; steps lost unknown"
    stalled = [ev for ev in events if ev.get("stall_ms")]
    assert stalled and event_summary(stalled[0]).endswith("; stall 42 ms")


def test_a_policy_change_says_how_far_off_the_model_was_for_the_policy_it_left() -> None:
    ev = {"kind": "policy-changed", "previous": "every-step/int8", "policy": "every-step/fp32",
          "effective_step": 540, "predicted_step_ms": 51.1, "previous_step_ms": 51.5,
          "previous_chosen_ms": 60.0, "previous_measured_ms": 50.0}
    assert event_summary(ev) == ("every-step/int8 -> every-step/fp32 at step 540: 51 ms a "
                                 "step predicted, against 52 ms; the policy left ran 50 ms "
                                 "(+20% off)")


def test_an_operators_switch_of_the_sync_mode_reads() -> None:
    ev = {"kind": "policy-changed", "previous": "every-step/fp32",
          "policy": "streaming H=20 P=4 overlap/int8", "effective_step": 300,
          "reason": "set by the operator (chaosctl policy set): streaming H=20 P=4 overlap/int8"}
    assert event_summary(ev) == ("every-step/fp32 -> streaming H=20 P=4 overlap/int8 at step "
                                 "300: set by the operator")


def test_a_straggler_set_aside_measured_and_tried_again_reads() -> None:
    aside, measured, back = straggler_events()[:3]
    assert event_summary(aside).startswith("set aside for its compute: +")
    assert "samples/s predicted without it" in event_summary(aside)
    assert event_summary(measured).startswith("set aside: ")
    assert event_summary(back).startswith("rejoins (trial), ")


def test_odd_or_unknown_events_still_read() -> None:
    assert event_summary({"kind": "scale-out", "bytes": "lots", "sources": 3}) == "from 3"
    assert event_summary({"kind": "partition", "kept": "x"}) == "kept -; lost -"
    assert event_summary({"kind": "new-kind", "seq": 1, "x": 2}) == "x=2"
    assert event_summary({"kind": "scale-in"}) == "dropped: -"


def test_the_table_shows_summaries_and_json_keeps_everything(fake: FakeDaemon) -> None:
    events = real_events()
    fake.answers["events"] = ok(events)
    proc = run_ctl("--socket", str(fake.path), "events")
    assert proc.returncode == 0, proc.stderr
    out = " ".join(proc.stdout.split())  # the DETAILS column wraps
    assert "512 MiB in 3.4 s (1.08x bound)" in out
    assert "kept node-1; lost node-3" in out
    assert "plan_inputs" not in out and "per_source" not in out
    proc = run_ctl("--socket", str(fake.path), "events", "--json")
    assert json.loads(proc.stdout) == events
    assert by_kind(json.loads(proc.stdout), "state-diverged")[0]["digest"] == "ab" * 32
