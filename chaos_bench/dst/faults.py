"""What the edge does to a cluster, drawn from the seed before the run starts.

A :class:`Plan` is the run's whole schedule: the boxes and their sites, how the network treats
messages, and a list of :class:`Fault` at given times. It is a pure function of the seed, so
a failing run can be replayed, and shrunk by dropping faults from its plan.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field, replace

from chaos_bench.dst.broker import Net

SLOW_PACE_S = 0.2  # a worker's poll (and at most one step) every 0.2 s: a lead of 2-3 steps
#: One seed in FAST_P polls every 0.05 s: a cluster stepping 20 times a second plans its
#: changes 10 steps ahead, so a join planned at the fast pace can take effect after one planned
#: later at the minimum lead (soak fault 22, which the slow pace alone never reached).
FAST_PACE_S = 0.05
FAST_P = 0.25

DRAWN_KINDS = ("join", "leave", "kill-worker", "crash", "freeze", "freeze-worker",
               "broker-restart", "cut", "dataplane-split", "power", "leave-daemon", "misfit",
               "link-op")
FAULT_KINDS = (*DRAWN_KINDS, "policy-op", "slow", "slow-link")
"""Every fault a plan may hold. ``misfit``: the box's owner starts a script whose model is
not the cluster's (its worker refuses the state and is not restarted). ``link-op``: the
operator runs ``chaosctl link add|del PEER`` on a box (target ``box>peer/add``).
``policy-op``: the operator runs ``chaosctl policy set`` on a box (target ``box>mode/H``).
``slow``: a box computes SLOW_FACTOR times slower for a while (throttled, or its owner's
other work), and the scheduler's straggler judge may set it aside. ``slow-link``: a box's
links fall to SLOW_LINK_MBPS for a while (its Wi-Fi, or its uplink in the evening): the
probes measure it, and the judge may set the box aside for its link and let it back once
newer tests of its links recover."""
#: The sync modes a ``policy-op`` sets (streaming with 2 fragments).
POLICY_OPS = ("every-step/1", "diloco/4", "diloco/10", "streaming/6")
#: Policy ops come from a stream of their own, in about this share of the seeds, so that the
#: faults every other seed drew (and the seeds pinned to catch mutants) stay as they were.
POLICY_OP_SEEDS = 0.3
#: Slow boxes likewise, in about this share of the seeds; only those plans run the policy
#: controller (its policy pinned: only the straggler judge acts) and its link-rate probes.
SLOW_SEEDS = 0.3
SLOW_FACTOR = 8.0
#: A box on a slow link, likewise, in about this share of the seeds (a stream of its own):
#: at SLOW_LINK_MBPS a round of the workers' ELEMENTS takes 0.64 s, three 0.2-s paces.
SLOW_LINK_SEEDS = 0.2
SLOW_LINK_MBPS = 0.5


@dataclass(frozen=True)
class Draws:
    """Which of the later-added fault streams a plan draws. Each has a stream of its own, so
    that a seed without it is the plan it was before; a seed pinned before a stream existed
    is replayed without it."""

    policy_ops: bool = True  # stop 53: chaosctl policy set
    slow: bool = True  # stop 58: slow boxes, and the straggler judge
    slow_links: bool = True  # stop 59: boxes on slow links

    def args(self) -> list[str]:
        """The ``chaosctl bench dst`` options that draw the same."""
        return [*([] if self.policy_ops else ["--no-policy-ops"]),
                *([] if self.slow else ["--no-slow"]),
                *([] if self.slow_links else ["--no-slow-links"])]


EVERY_DRAW = Draws()  # plans as they are drawn now


@dataclass(frozen=True)
class Fault:
    """One thing that happens at ``at`` seconds: ``kind`` to ``target`` for ``seconds``."""

    at: float
    kind: str
    target: str = ""  # a node, a site, or "a|b" (two sites)
    seconds: float = 0.0

    def __str__(self) -> str:
        extra = f" for {self.seconds:.1f}s" if self.seconds else ""
        return f"{self.at:7.2f}s {self.kind} {self.target}{extra}"


@dataclass(frozen=True)
class Plan:
    """Everything a run does, fixed by its seed."""

    seed: int
    duration: float
    sites: dict[str, str]  # node -> its site; the first boxes boot at once
    initial: tuple[str, ...]  # boxes that boot and train from the start
    net: Net
    faults: tuple[Fault, ...] = field(default_factory=tuple)
    pace: float = SLOW_PACE_S  # seconds between a worker's polls, and so between its steps

    @property
    def judged(self) -> bool:
        """Whether the boxes run the straggler judge (a plan with slow boxes or links)."""
        return any(f.kind in ("slow", "slow-link") for f in self.faults)

    def without(self, index: int) -> Plan:
        """This plan with one fault dropped (shrinking)."""
        return replace(self, faults=self.faults[:index] + self.faults[index + 1:])

    def describe(self) -> list[str]:
        head = [f"seed {self.seed}: {len(self.initial)} boxes on "
                f"{len(set(self.sites.values()))} sites "
                f"({', '.join(f'{n}@{s}' for n, s in sorted(self.sites.items()))}), "
                f"{self.duration:.0f}s; net dup {self.net.dup_p}, delay {self.net.delay_p}, "
                f"qos0 loss {self.net.qos0_loss_p}; a step per {self.pace:g}s at most"]
        return head + [str(f) for f in self.faults]


def make_plan(seed: int, duration: float = 90.0, rate: float = 1 / 6.0,
              draws: Draws = EVERY_DRAW) -> Plan:
    """The plan of ``seed``: 3-6 boxes on 1-3 sites, 0-2 more that join later, faults at
    ``rate`` per second on average (Poisson), each of a kind drawn at random, and the pace.
    The pace, the policy ops, the slow boxes and links have streams of their own, so a seed's boxes
    and other faults are what they were before those were drawn (``draws``: the plan as it
    was before one of them existed)."""
    rng = random.Random(f"plan-{seed}")
    n = rng.randint(3, 6)
    extra = rng.randint(0, 2)
    n_sites = rng.randint(1, 3)
    names = [f"n{i}" for i in range(1, n + extra + 1)]
    sites = {name: f"s{rng.randint(1, n_sites)}" for name in names}
    net = Net(dup_p=rng.choice([0.0, 0.0, 0.02]), delay_p=rng.choice([0.0, 0.0, 0.02]),
              qos0_loss_p=rng.choice([0.0, 0.0, 0.05]))
    faults: list[Fault] = []
    t = 8.0 + rng.expovariate(rate)
    pending = names[n:]
    site_names = sorted(set(sites.values()))
    while t < duration - 5.0:
        kind = rng.choice(DRAWN_KINDS)
        node = rng.choice(names[:n] + pending[:1])
        if kind == "join":
            if pending:
                faults.append(Fault(t, "join", pending.pop(0)))
        elif kind in ("leave", "kill-worker", "leave-daemon"):
            faults.append(Fault(t, kind, node))
        elif kind == "misfit":
            if rng.random() < 0.3:  # rarer than the others: it takes a box out for good
                faults.append(Fault(t, kind, node))
        elif kind == "link-op":
            peer = rng.choice([n for n in names if n != node])
            faults.append(Fault(t, kind, f"{node}>{peer}/{rng.choice(['add', 'del'])}"))
        elif kind in ("crash", "freeze", "freeze-worker"):
            faults.append(Fault(t, kind, node, round(rng.uniform(1.0, 20.0), 2)))
        elif kind == "broker-restart":
            faults.append(Fault(t, kind, "", round(rng.uniform(0.5, 6.0), 2)))
        elif kind in ("cut", "power"):
            faults.append(Fault(t, kind, rng.choice(site_names), round(rng.uniform(2.0, 25.0), 2)))
        elif kind == "dataplane-split" and len(site_names) > 1:
            a, b = rng.sample(site_names, 2)
            faults.append(Fault(t, kind, f"{a}|{b}", round(rng.uniform(2.0, 25.0), 2)))
        t += rng.expovariate(rate)
    fast = random.Random(f"pace-{seed}").random() < FAST_P
    ops = random.Random(f"policy-{seed}")
    if draws.policy_ops and ops.random() < POLICY_OP_SEEDS:  # 1-3 sync-mode switches
        for _ in range(ops.randint(1, 3)):
            at = round(ops.uniform(10.0, duration - 10.0), 2)
            faults.append(Fault(at, "policy-op",
                                f"{ops.choice(names[:n])}>{ops.choice(POLICY_OPS)}"))
    slow = random.Random(f"slow-{seed}")
    if draws.slow and slow.random() < SLOW_SEEDS:  # 1-2 boxes slowed, from 8 s on
        for _ in range(slow.randint(1, 2)):
            at = round(slow.uniform(8.0, max(8.0, duration - 5.0)), 2)
            faults.append(Fault(at, "slow", slow.choice(names),
                                round(slow.uniform(5.0, 60.0), 2)))
    links = random.Random(f"slow-link-{seed}")
    if draws.slow_links and links.random() < SLOW_LINK_SEEDS:  # a box's links, from 8 s on
        at = round(links.uniform(8.0, max(8.0, duration - 5.0)), 2)
        faults.append(Fault(at, "slow-link", links.choice(names),
                            round(links.uniform(5.0, 60.0), 2)))
    faults.sort(key=lambda f: f.at)
    return Plan(seed, duration, sites, tuple(names[:n]), net, tuple(faults),
                FAST_PACE_S if fast else SLOW_PACE_S)
