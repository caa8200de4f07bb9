"""Sync policies: which spanning tree the all-reduce runs on, and how to pick one.

A :class:`SyncPolicy` is the one type of a policy everywhere: the scheduler builds it, the
retained cluster state and ``worker.poll`` carry its :meth:`~SyncPolicy.to_dict`, and the
worker and its all-reduce run under it. :func:`spanning_tree` is a pure function that chooses
the tree from measured links. Every holder keeps the newest :data:`POLICY_KEEP` versions.
A policy also names the cluster's gradient wire format (:data:`WIRE_FORMATS`), so every
member of a round encodes and decodes alike (``chaos_edge.dataplane.codec``), and its sync mode
(:class:`SyncMode`): an all-reduce every step, or DiLoCo's local steps with an outer step
every ``inner_steps``, whole or fragment by fragment (docs/training-protocol.md, "Sync modes").
"""

from __future__ import annotations

import json
import logging
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from daemon.contracts.errors import PolicyError

# Policy versions per term: a scheduler of term t numbers its policies above (t - 1) * SPAN,
# so that the two sides of a cut never issue the same version, and a version names its term.
TERM_POLICY_SPAN = 1_000_000


def policy_term(version: int) -> int:
    """The term of the scheduler that issued policy ``version`` (0: none yet)."""
    return (version - 1) // TERM_POLICY_SPAN + 1 if version > 0 else 0

Edge = tuple[str, str]
log = logging.getLogger("chaos.policy")
# Versions each holder keeps (scheduler snapshot, daemon, worker). An older one can no longer
# govern a round once a newer one is effective, and planned changes are at most a few ahead.
POLICY_KEEP = 8
#: Gradient wire formats of the all-reduce; ``fp32`` (lossless) is the default. The codecs
#: live in ``chaos_edge.dataplane.codec``; the names are here so that config and policy can
#: validate them without importing the data plane.
WIRE_FORMATS: tuple[str, ...] = ("fp32", "fp16", "bf16", "int8")
#: Precision order of the wire formats (a bound like "never below bf16" compares these).
WIRE_RANK: dict[str, int] = {"fp32": 2, "fp16": 1, "bf16": 1, "int8": 0}
#: Sync modes: ``every-step`` all-reduces the gradients of every step (the default);
#: ``diloco`` steps each member's own optimizer locally and all-reduces the parameter change
#: every ``inner_steps`` steps ("DiLoCo: Distributed Low-Communication Training of Language
#: Models"); ``streaming`` is DiLoCo whose parameters are split into ``fragments`` that are
#: synced in turn, one every ``inner_steps / fragments`` steps ("Streaming DiLoCo with
#: overlapping communication: Towards a Distributed Free Lunch"): the same bytes per step,
#: a ``fragments``-th of the peak.
SYNC_MODES: tuple[str, ...] = ("every-step", "diloco", "streaming")
MAX_FRAGMENTS = 64
#: Outer optimizers of ``diloco``: SGD with Nesterov momentum (the paper's) or heavy-ball SGD.
OUTER_OPTIMIZERS: tuple[str, ...] = ("nesterov", "sgd")
#: The parts of a policy an operator can pin against the policy controller (``[adaptive] pin``,
#: ``chaosctl policy set``).
POLICY_PARTS: tuple[str, ...] = ("sync", "wire", "inner_steps")
MAX_INNER_STEPS = 1_000_000


def _norm(a: str, b: str) -> Edge:
    return (a, b) if a <= b else (b, a)


@dataclass(frozen=True)
class SyncMode:
    """How members synchronise: every step, or DiLoCo's outer step every ``inner_steps``
    (``streaming``: one fragment of the parameters every ``inner_steps / fragments``).

    Attributes:
        mode: One of :data:`SYNC_MODES`.
        inner_steps: DiLoCo's H: local steps per outer step of each parameter (1 for
            ``every-step``).
        outer: The outer optimizer (:data:`OUTER_OPTIMIZERS`).
        outer_lr: Its learning rate (DiLoCo: 0.7).
        outer_momentum: Its momentum (DiLoCo: 0.9; 0 is plain SGD).
        fragments: ``streaming``: parts the parameters are split into, each synced on its
            own round (2..:data:`MAX_FRAGMENTS`, dividing ``inner_steps``); 1 otherwise.
        merge: ``streaming``: how much of its local value a member keeps when a fragment's
            outer step lands (the paper's alpha): ``merge * local + (1 - merge) * synced``;
            0 loads the synced value, as DiLoCo does.
        overlap: ``streaming``: a round runs while the step after it computes, and its result
            lands at the start of the next ``update()`` (the paper's tau = 1); needs a period
            of at least 2 steps.
    """

    mode: str = "every-step"
    inner_steps: int = 1
    outer: str = "nesterov"
    outer_lr: float = 0.7
    outer_momentum: float = 0.9
    fragments: int = 1
    merge: float = 0.0
    overlap: bool = False

    @property
    def diloco(self) -> bool:
        """Whether members step locally between outer steps (``diloco`` or ``streaming``)."""
        return self.mode in ("diloco", "streaming")

    @property
    def period(self) -> int:
        """Steps between two rounds: 1, H, or H / fragments (``streaming``)."""
        return self.inner_steps // self.fragments

    def validate(self) -> None:
        """Raise PolicyError for an unknown mode or optimizer, or a value out of range."""
        if self.mode not in SYNC_MODES:
            raise PolicyError(f"sync mode {self.mode!r} is not one of {', '.join(SYNC_MODES)}")
        if self.outer not in OUTER_OPTIMIZERS:
            raise PolicyError(f"outer optimizer {self.outer!r} is not one of "
                              f"{', '.join(OUTER_OPTIMIZERS)}")
        if not 1 <= self.inner_steps <= MAX_INNER_STEPS:
            raise PolicyError(f"inner_steps must be 1..{MAX_INNER_STEPS}, not {self.inner_steps}")
        if not 0 < self.outer_lr <= 10:  # also false for NaN
            raise PolicyError(f"outer_lr must be in (0, 10], not {self.outer_lr}")
        if not 0 <= self.outer_momentum < 1:
            raise PolicyError(f"outer_momentum must be in [0, 1), not {self.outer_momentum}")
        if self.mode != "streaming" and (self.fragments, self.merge, self.overlap) != (1, 0.0,
                                                                                      False):
            raise PolicyError(f"fragments, merge and overlap are streaming's, not "
                              f"{self.mode}'s")
        if self.overlap and self.period < 2:
            raise PolicyError(f"overlap needs 2 or more steps between rounds, not "
                              f"{self.period} (inner_steps {self.inner_steps}, fragments "
                              f"{self.fragments})")
        if self.mode == "streaming":
            if not 2 <= self.fragments <= MAX_FRAGMENTS or self.inner_steps % self.fragments:
                raise PolicyError(f"fragments must be 2..{MAX_FRAGMENTS} and divide "
                                  f"inner_steps ({self.inner_steps}), not {self.fragments}")
            if not 0 <= self.merge < 1:
                raise PolicyError(f"merge must be in [0, 1), not {self.merge}")

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return {"mode": self.mode, "inner_steps": self.inner_steps, "outer": self.outer,
                "outer_lr": self.outer_lr, "outer_momentum": self.outer_momentum,
                "fragments": self.fragments, "merge": self.merge, "overlap": self.overlap}

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any] | None) -> SyncMode:
        """Parse and validate (None or {}: ``every-step``).

        Raises:
            PolicyError: Mistyped fields or values out of range.
        """
        if not doc:
            return EVERY_STEP
        try:
            mode = cls(str(doc.get("mode", "every-step")), int(doc.get("inner_steps", 1)),
                       str(doc.get("outer", "nesterov")), float(doc.get("outer_lr", 0.7)),
                       float(doc.get("outer_momentum", 0.9)), int(doc.get("fragments", 1)),
                       float(doc.get("merge", 0.0)), _flag(doc.get("overlap", False)))
        except (TypeError, ValueError, AttributeError) as exc:
            raise PolicyError(f"malformed sync mode: {exc!r}") from None
        mode.validate()
        return mode


def _flag(value: Any) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"overlap must be true or false, not {value!r}")
    return value


EVERY_STEP = SyncMode()


CHUNK_KIB_MIN, CHUNK_KIB_MAX = 64, 1024  # a policy's chunk sizes (above: sized by the vector)
CHUNK_LINK_S = 0.004  # a chunk takes at least this long on the slowest tree link


def chunk_for_rate(mbit: float | None) -> int:
    """The policy chunk (KiB) for a tree whose slowest link carries ``mbit`` Mbit/s: a chunk
    that takes about :data:`CHUNK_LINK_S` there, a power of two, at least
    :data:`CHUNK_KIB_MIN`; 0 (sized by the vector) for an unknown rate, or a link so fast that
    the per-chunk cost, not the link, would set the pace (loopback).

    Measured (BENCHMARKS.md, "Throughput"): on a 50 Mbit/s mesh the vector-sized chunks of a
    0.46 MB gradient were one chunk, no pipeline, 0.70x DDP; 64 KiB chunks made it 1.00x.
    On loopback the same 64 KiB cost the small CNN a tenth of its steps."""
    if mbit is None or mbit <= 0:
        return 0
    want = mbit * 1e6 / 8 * CHUNK_LINK_S / 1024  # KiB
    if want >= CHUNK_KIB_MAX:
        return 0
    kib = CHUNK_KIB_MIN
    while kib * 2 <= want:
        kib *= 2
    return kib


@dataclass(frozen=True)
class SyncPolicy:
    """The all-reduce tree of one policy version.

    Attributes:
        version: Monotonic policy version; every data frame carries it.
        members: Nodes taking part, sorted. None is a policy too: the cluster has no member
            left, and a worker that finds itself outside it asks to join again (saying which
            state it holds), as after any drop.
        edges: Undirected tree edges, each sorted, the list sorted.
        root: The node that finishes the reduction and starts the broadcast.
        effective_step: The first round it governs (0: at once, rounds in flight rerun).
        addrs: Data-plane address (``host:port``) per member.
        wire: Wire format of the gradients in this policy's rounds (:data:`WIRE_FORMATS`).
        sync: The sync mode of the rounds it governs (:class:`SyncMode`).
        chunk_kib: The all-reduce's chunk size in KiB, the same on every member (0: sized by
            the vector, as a worker's own setting does). The scheduler sets it from the
            slowest tree link it has measured (:func:`chunk_for_rate`): on a slow link a
            small vector still pipelines up and down the tree.
        pinned: The parts of it (:data:`POLICY_PARTS`) an operator set with ``chaosctl policy
            set``, which the controller keeps; carried so that a new scheduler keeps them.
    """

    version: int
    members: tuple[str, ...]
    edges: tuple[Edge, ...]
    root: str
    effective_step: int = 0
    addrs: Mapping[str, str] = field(default_factory=dict, hash=False)
    wire: str = "fp32"
    sync: SyncMode = EVERY_STEP
    chunk_kib: int = 0
    pinned: tuple[str, ...] = ()

    @classmethod
    def build(
        cls, version: int, members: Iterable[str], edges: Iterable[Edge], root: str,
        effective_step: int = 0, addrs: Mapping[str, str] | None = None, wire: str = "fp32",
        sync: SyncMode = EVERY_STEP, chunk_kib: int = 0, pinned: Iterable[str] = (),
    ) -> SyncPolicy:
        """Normalise and validate a policy.

        Raises:
            PolicyError: The edges are not a spanning tree of the members, the root is not
                a member, the wire format is unknown or the sync mode is invalid.
        """
        policy = cls(
            int(version),
            tuple(sorted(set(members))),
            tuple(sorted({_norm(a, b) for a, b in edges})),
            root,
            int(effective_step),
            {str(k): str(v) for k, v in (addrs or {}).items()},
            wire,
            sync,
            int(chunk_kib),
            tuple(sorted(set(pinned))),
        )
        policy.validate()
        return policy

    def validate(self) -> None:
        """Raise PolicyError unless ``edges`` form a spanning tree of ``members`` and
        ``wire`` is a known format."""
        if self.version < 0 or self.effective_step < 0:
            raise PolicyError("policy version and effective step must be >= 0")
        if self.wire not in WIRE_FORMATS:
            raise PolicyError(f"wire format {self.wire!r} is not one of "
                              f"{', '.join(WIRE_FORMATS)}")
        self.sync.validate()
        if bad := [p for p in self.pinned if p not in POLICY_PARTS]:
            raise PolicyError(f"pinned parts {bad} are not among {', '.join(POLICY_PARTS)}")
        if self.chunk_kib and not (CHUNK_KIB_MIN <= self.chunk_kib <= CHUNK_KIB_MAX
                                   and self.chunk_kib & (self.chunk_kib - 1) == 0):
            raise PolicyError(f"chunk_kib {self.chunk_kib} is not 0 or a power of two in "
                              f"[{CHUNK_KIB_MIN}, {CHUNK_KIB_MAX}]")
        if not self.members:  # the cluster has no member left: every worker is outside it
            if self.root or self.edges:
                raise PolicyError("a policy with no members has no root and no edges")
            return
        if self.root not in self.members:
            raise PolicyError(f"root {self.root!r} is not a member")
        nodes = set(self.members)
        for a, b in self.edges:
            if a == b or a not in nodes or b not in nodes:
                raise PolicyError(f"edge {a}-{b} is a loop or leaves the member set")
        if len(self.edges) != len(nodes) - 1 or len(_bfs(self.root, self.edges)) != len(nodes):
            raise PolicyError("edges do not form a spanning tree of the members")

    def parent(self, node: str) -> str | None:
        """The node's parent in the tree rooted at ``root`` (None for the root)."""
        return self._orient(node)[0]

    def children(self, node: str) -> tuple[str, ...]:
        """The node's children, sorted (the order partial sums are added in)."""
        return self._orient(node)[1]

    def _orient(self, node: str) -> tuple[str | None, tuple[str, ...]]:
        if node not in self.members:
            raise PolicyError(f"{node!r} is not a member of policy v{self.version}")
        parents = _bfs(self.root, self.edges)
        kids = tuple(sorted(n for n, p in parents.items() if p == node))
        return parents[node], kids

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return {
            "version": self.version,
            "members": list(self.members),
            "edges": [list(e) for e in self.edges],
            "root": self.root,
            "effective_step": self.effective_step,
            "addrs": dict(self.addrs),
            "wire": self.wire,
            "sync": self.sync.to_dict(),
            "chunk_kib": self.chunk_kib,
            "pinned": list(self.pinned),
        }

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> SyncPolicy:
        """Parse and validate a dict made by ``to_dict`` (one without ``wire``, ``sync`` or
        ``chunk_kib``, from an older scheduler, is fp32, every-step and chunked by size).

        Raises:
            PolicyError: Missing or mistyped fields, or not a tree.
        """
        try:
            edges = [(str(a), str(b)) for a, b in doc["edges"]]
            return cls.build(int(doc["version"]), map(str, doc["members"]), edges,
                             str(doc["root"]), int(doc.get("effective_step") or 0),
                             dict(doc.get("addrs") or {}), str(doc.get("wire") or "fp32"),
                             SyncMode.from_dict(doc.get("sync")),
                             int(doc.get("chunk_kib") or 0),
                             [str(p) for p in doc.get("pinned") or ()])
        except (KeyError, TypeError, ValueError) as exc:
            raise PolicyError(f"malformed sync policy: {exc!r}") from None

    def to_json(self) -> str:
        """Serialise to JSON."""
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> SyncPolicy:
        """Parse JSON made by ``to_json`` (raises PolicyError)."""
        try:
            doc = json.loads(text)
        except ValueError as exc:
            raise PolicyError(f"sync policy is not JSON: {exc}") from None
        if not isinstance(doc, dict):
            raise PolicyError("sync policy must be a JSON object")
        return cls.from_dict(doc)


def parse(doc: Mapping[str, Any] | None) -> SyncPolicy | None:
    """A policy document off the wire, validated; None for none, or (logged) a malformed one.

    A bad policy is dropped where it arrives, never crashing a daemon or a training loop.
    """
    if not doc:
        return None
    try:
        return SyncPolicy.from_dict(doc)
    except PolicyError as exc:
        log.warning("ignoring a malformed sync policy: %s", exc)
        return None


@dataclass(frozen=True)
class TreePlan:
    """Result of :func:`spanning_tree`.

    Attributes:
        root: Root of the tree over the largest component.
        edges: Tree edges over the largest component (sorted pairs).
        components: Connected components of the link graph, largest first (ties: smallest
            id first). More than one means the cluster is partitioned.
    """

    root: str
    edges: tuple[Edge, ...]
    components: tuple[frozenset[str], ...]

    @property
    def connected(self) -> bool:
        """Whether the link graph joins every member."""
        return len(self.components) == 1

    def policy(self, version: int, wire: str = "fp32", sync: SyncMode = EVERY_STEP
               ) -> SyncPolicy:
        """The sync policy over the largest component."""
        return SyncPolicy.build(version, self.components[0], self.edges, self.root, wire=wire,
                                sync=sync)


def spanning_tree(members: Iterable[str], links: Mapping[Edge, float]) -> TreePlan:
    """Pick the all-reduce tree: maximum-bandwidth spanning tree, rooted at its centre.

    Kruskal on bandwidth (descending; ties by node ids, so the result is deterministic)
    gives, for every pair of nodes, the path with the widest bottleneck. The root is the
    tree's centre: the node whose farthest node is fewest hops away, which minimises the
    pipeline's depth (ties: smaller total depth, then smaller id).

    Args:
        members: Nodes to cover.
        links: Measured bandwidth per undirected link (any unit; higher is better). Links
            touching non-members or with bandwidth <= 0 are ignored; if both directions are
            given, the smaller value counts.

    Returns:
        The plan for the largest component, plus every component.

    Raises:
        PolicyError: ``members`` is empty.
    """
    nodes = sorted(set(members))
    if not nodes:
        raise PolicyError("cannot build a tree over no members")
    known = set(nodes)
    bw: dict[Edge, float] = {}
    for (a, b), value in links.items():
        if a != b and a in known and b in known and value > 0:
            e = _norm(a, b)
            bw[e] = min(bw.get(e, value), value)
    leader = {n: n for n in nodes}

    def find(n: str) -> str:
        while leader[n] != n:
            leader[n] = leader[leader[n]]
            n = leader[n]
        return n

    tree: list[Edge] = []
    for e in sorted(bw, key=lambda e: (-bw[e], e)):
        ra, rb = find(e[0]), find(e[1])
        if ra != rb:
            leader[max(ra, rb)] = min(ra, rb)
            tree.append(e)
    groups: dict[str, set[str]] = {}
    for n in nodes:
        groups.setdefault(find(n), set()).add(n)
    comps = sorted((frozenset(g) for g in groups.values()), key=lambda g: (-len(g), min(g)))
    main = comps[0]
    main_edges = tuple(sorted(e for e in tree if e[0] in main))
    return TreePlan(_centre(main, main_edges), main_edges, tuple(comps))


def depth(root: str, edges: Iterable[Edge]) -> int:
    """Hops from ``root`` to the deepest node of the tree of ``edges``."""
    level: dict[str, int] = {}
    for node, parent in _bfs(root, edges).items():  # BFS order: parents before children
        level[node] = 0 if parent is None else level[parent] + 1
    return max(level.values())


def _bfs(root: str, edges: Iterable[Edge]) -> dict[str, str | None]:
    """Parent of every node reachable from ``root`` (the root maps to None)."""
    adj: dict[str, list[str]] = {}
    for a, b in edges:
        adj.setdefault(a, []).append(b)
        adj.setdefault(b, []).append(a)
    parents: dict[str, str | None] = {root: None}
    queue = deque([root])
    while queue:
        n = queue.popleft()
        for m in sorted(adj.get(n, ())):
            if m not in parents:
                parents[m] = n
                queue.append(m)
    return parents


def _centre(nodes: frozenset[str], edges: tuple[Edge, ...]) -> str:
    """The tree's centre: the node with the least eccentricity (the depth of the tree rooted
    there), then the least total depth, then the least id.

    Two passes over the tree, O(N): rooted anywhere, the first (leaves up) gives each node's
    height and subtree depth sums; the second (root down) the longest path and the depth sum
    through its parent. It equals rooting the tree at every node in turn, which was O(N^2)
    (one second of the scheduler's loop at 1,000 members).
    """
    start = min(nodes)
    parents = _bfs(start, edges)
    order = list(parents)  # BFS order: parents before children
    kids: dict[str, list[str]] = {n: [] for n in order}
    for n in order[1:]:
        kids[parents[n]].append(n)  # type: ignore[index]
    size = dict.fromkeys(order, 1)
    down = dict.fromkeys(order, 0)  # height of the subtree
    below = dict.fromkeys(order, 0)  # sum of depths within the subtree
    for n in reversed(order):
        for c in kids[n]:
            size[n] += size[c]
            down[n] = max(down[n], down[c] + 1)
            below[n] += below[c] + size[c]
    total = len(order)
    up = {start: 0}  # longest path that leaves the subtree through the parent
    depth_sum = {start: below[start]}
    for n in order:
        # The two highest children, so each child knows the best branch that is not its own.
        best = sorted((down[c] + 1 for c in kids[n]), reverse=True)[:2]
        for c in kids[n]:
            other = best[1] if len(best) > 1 and down[c] + 1 == best[0] else (
                best[0] if best and down[c] + 1 != best[0] else 0)
            up[c] = 1 + max(up[n], other)
            depth_sum[c] = depth_sum[n] - size[c] + (total - size[c])
    return min(order, key=lambda n: (max(down[n], up[n]), depth_sum[n], n))
