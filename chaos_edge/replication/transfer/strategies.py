"""Scale-out strategies behind one interface: ``STRATEGIES[name](job) -> StrategyResult``.

| name           | system       | what the new node does                                          |
| -------------- | ------------ | --------------------------------------------------------------- |
| ``chaos``      | Chaos        | plans a split over its neighbours (``job.planner``) and pulls   |
|                |              | (default planner ``chaos``: water-filling, the exact optimum;   |
|                |              | ``paper`` gives the paper's Algorithms 1+2), rebalancing the    |
|                |              | split at run time when the rates differ from the plan's         |
| ``single``     | EDL+         | pulls the whole state from the neighbour that finishes first    |
| ``multi-source``| Autoscaling | even split over all cluster nodes, relayed hop by hop to it     |
| ``stop-resume``| Pollux       | every node checkpoints to disk, restarts, and loads from disk   |

The three network strategies run on the same transfer code (:func:`~.fetch.fetch`). Stop-resume
measures real disk I/O: each node's checkpoint is written and fsynced, evicted from the page
cache (``POSIX_FADV_DONTNEED``) and read back. What is simulated: the nodes write one after
another on this one disk and the delay takes the slowest node (as if each had its own disk);
the cluster restart is priced as one real ``python -c 'import torch'`` start (all nodes restart
in parallel), which leaves out re-forming the process group and the data loaders, so it
understates Pollux.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from chaos_edge.dataplane import auth
from chaos_edge.replication.errors import CorruptStateError, PlanError
from chaos_edge.replication.manifest import Manifest, verify_buffer
from chaos_edge.replication.planning.model import Neighbor, PlanInput, ReplicationPlan
from chaos_edge.replication.planning.planner import make_plan
from chaos_edge.replication.transfer.fetch import FetchOptions, FetchResult, fetch

Buffer = bytes | bytearray | memoryview
IO_CHUNK = 8 << 20
RESTART_CMD = (sys.executable, "-c", "import torch")


@dataclass(frozen=True)
class ScaleOutJob:
    """What the new node knows when it joins, for any strategy.

    Attributes:
        manifest: The state's manifest.
        me: The new node's credentials.
        neighbors: Its direct neighbours, with probe estimates (the planner's input).
        addresses: Node id -> state-server address, for every node it may dial.
        sources: ``multi-source`` only: every cluster node, with path estimates.
        routes: ``multi-source`` only: node -> hops from the new node to it (the overlay path).
        checkpoints: ``stop-resume`` only: each node's in-memory state bytes.
        workdir: ``stop-resume`` only: where checkpoints are written.
        planner: The ``chaos`` strategy's planner, a registry name. The default ``chaos`` is
            water-filling to the byte (never worse than any other plan); ``paper`` is the
            paper's Algorithms 1+2, kept as a baseline.
        options: Fetch options.
        restart_cmd: ``stop-resume``: the command whose start-up prices a restart.
    """

    manifest: Manifest
    me: auth.Identity
    neighbors: tuple[Neighbor, ...]
    addresses: Mapping[str, tuple[str, int]]
    sources: tuple[Neighbor, ...] = ()
    routes: Mapping[str, Sequence[str]] = field(default_factory=dict)
    checkpoints: Mapping[str, Buffer] = field(default_factory=dict)
    workdir: Path | None = None
    planner: str = "chaos"
    options: FetchOptions = field(default_factory=FetchOptions)
    restart_cmd: Sequence[str] = RESTART_CMD


@dataclass(frozen=True)
class StrategyResult:
    """Outcome of one scale-out.

    Attributes:
        strategy: The strategy's name.
        delay_s: Scale-out delay: planning plus transfer (or the stop-resume phases).
        buffer: The new node's verified state bytes.
        decision_s: Planner run time (included in ``delay_s``).
        plan: The plan followed, for the network strategies.
        fetch: Transfer details, for the network strategies.
        phases: Named parts of ``delay_s`` (seconds).
    """

    strategy: str
    delay_s: float
    buffer: bytearray
    decision_s: float = 0.0
    plan: ReplicationPlan | None = None
    fetch: FetchResult | None = None
    phases: dict[str, float] = field(default_factory=dict)


Strategy = Callable[[ScaleOutJob], StrategyResult]


def _pull(
    name: str,
    job: ScaleOutJob,
    planner: str,
    nodes: Sequence[Neighbor],
    routes: Mapping[str, Sequence[str]] | None = None,
) -> StrategyResult:
    t0 = time.perf_counter()
    m = job.manifest
    inputs = PlanInput.create(nodes, m.segments(), align_bytes=m.block_size)
    plan = make_plan(planner, inputs)
    decision = time.perf_counter() - t0
    # Only Chaos rebalances at run time; the baselines send exactly the shares they planned.
    options = dataclasses.replace(job.options, rebalance=job.options.rebalance and name == "chaos")
    res = fetch(plan, m, job.addresses, job.me, routes=routes, options=options)
    phases = {"plan": decision, "transfer": res.delay_s}
    return StrategyResult(name, decision + res.delay_s, res.buffer, decision, plan, res, phases)


def chaos(job: ScaleOutJob) -> StrategyResult:
    """Multi-neighbour replication with the planned split (the default strategy)."""
    return _pull("chaos", job, job.planner, job.neighbors)


def single(job: ScaleOutJob) -> StrategyResult:
    """EDL+: the whole state from the neighbour predicted to finish first."""
    return _pull("single", job, "single", job.neighbors)


def multi_source(job: ScaleOutJob) -> StrategyResult:
    """Autoscaling: an even split over every cluster node, relayed along ``job.routes``."""
    if not job.sources:
        raise PlanError("multi-source needs job.sources (every cluster node)")
    return _pull("multi-source", job, "even", job.sources, job.routes)


def _write_checkpoint(path: Path, data: Buffer) -> float:
    """Write, fsync and evict one checkpoint; returns the seconds it took."""
    view = memoryview(data).cast("B")
    t0 = time.perf_counter()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        for i in range(0, len(view), IO_CHUNK):
            os.write(fd, view[i : i + IO_CHUNK])
        os.fsync(fd)
        elapsed = time.perf_counter() - t0
        # Clean pages can be dropped: the read-back must come from the disk, as after a restart.
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
    return elapsed


def _read_checkpoint(path: Path, into: memoryview | None) -> float:
    """Read a checkpoint into ``into`` (or through a scratch buffer); returns the seconds."""
    t0 = time.perf_counter()
    scratch = memoryview(bytearray(IO_CHUNK))
    with open(path, "rb", buffering=0) as f:
        pos = 0
        while True:
            dst = into[pos : pos + IO_CHUNK] if into is not None else scratch
            n = f.readinto(dst)
            if not n:
                break
            pos += n
    return time.perf_counter() - t0


def stop_resume(job: ScaleOutJob) -> StrategyResult:
    """Pollux: checkpoint every node to disk, stop, restart, and load (see module docstring)."""
    if not job.checkpoints or job.workdir is None:
        raise PlanError("stop-resume needs job.checkpoints and job.workdir")
    m = job.manifest
    paths = {n: job.workdir / f"ckpt-{n}-v{m.version}.bin" for n in job.checkpoints}
    try:
        write_s = max(_write_checkpoint(paths[n], b) for n, b in job.checkpoints.items())
        t0 = time.perf_counter()
        subprocess.run(list(job.restart_cmd), check=True, capture_output=True)
        restart_s = time.perf_counter() - t0
        buf = bytearray(m.total_bytes)
        first = next(iter(paths))  # the new node loads the checkpoint of one node
        new_s = _read_checkpoint(paths[first], memoryview(buf))
        read_s = max([new_s, *(_read_checkpoint(p, None) for p in paths.values())])
        t0 = time.perf_counter()
        bad = verify_buffer(m, buf)
        verify_s = time.perf_counter() - t0
    finally:
        for p in paths.values():
            p.unlink(missing_ok=True)
    if bad:
        raise CorruptStateError(f"{len(bad)} blocks of the checkpoint are corrupt", bad)
    phases = {"write_fsync": write_s, "restart": restart_s, "read": read_s, "verify": verify_s}
    return StrategyResult("stop-resume", sum(phases.values()), buf, phases=phases)


STRATEGIES: dict[str, Strategy] = {
    "chaos": chaos,
    "single": single,
    "multi-source": multi_source,
    "stop-resume": stop_resume,
}


def run_strategy(name: str, job: ScaleOutJob) -> StrategyResult:
    """Run the strategy called ``name``.

    Raises:
        PlanError: If no strategy has that name.
    """
    try:
        strategy = STRATEGIES[name]
    except KeyError:
        raise PlanError(f"unknown strategy {name!r}; choose one of {sorted(STRATEGIES)}") from None
    return strategy(job)
