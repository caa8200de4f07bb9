"""Deterministic simulation of the control plane (``chaosctl bench dst``).

The real agent, scheduler, negotiator and the worker's join and serve state machines run on a
simulated broker, clock and network, driven by one seed; faults are drawn from the seed, the
invariants are checked after every event, and a failing seed replays exactly.

- :mod:`~chaos_bench.dst.loop`: the event queue, the clock, the seeded random stream, the trace.
- :mod:`~chaos_bench.dst.broker`: the simulated MQTT broker and the agent's bus on it.
- :mod:`~chaos_bench.dst.plane`: the data plane, modelled (rounds, state transfers).
- :mod:`~chaos_bench.dst.worker`: a training worker: the real protocol code, modelled tensors.
- :mod:`~chaos_bench.dst.faults`: the plan of a run (boxes, sites, network, faults).
- :mod:`~chaos_bench.dst.cluster`: boxes and sites; applying the faults.
- :mod:`~chaos_bench.dst.referee`: the invariants and the coverage.
- :mod:`~chaos_bench.dst.run`: one seed, replay, shrinking, and many seeds on every core.
"""
