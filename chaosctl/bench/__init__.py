"""``chaosctl bench ...``: every benchmark, each printing a table and writing JSON and a plot.

Runs in the ``chaosctl`` process; each bench starts what it measures (chaosd clusters,
worker processes, testbed namespaces) as subprocesses. Results that the project quotes are
kept under ``bench/results/`` in the repository, as data.

- :mod:`~chaosctl.bench.cli`: the typer commands.
- :mod:`~chaosctl.bench.control`: failure detection, failover and broker load vs cluster size.
- :mod:`~chaosctl.bench.scaleout`, :mod:`~chaosctl.bench.scaleout_node`,
  :mod:`~chaosctl.bench.scaleout_report`: the paper's Figs. 7 and 10 on the testbed.
- :mod:`~chaosctl.bench.loopback`: scale-out strategies on loopback.
- :mod:`~chaosctl.bench.planner`: planner quality and speed.
- :mod:`~chaosctl.bench.allreduce`: the all-reduce against a socket copy.
- :mod:`~chaosctl.bench.stall`, :mod:`~chaosctl.bench.stall_worker`: the stall each primitive
  costs a training cluster, and the worker it trains (the training tests run it too).
- :mod:`~chaosctl.bench.convergence`, :mod:`~chaosctl.bench.convergence_worker`,
  :mod:`~chaosctl.bench.convergence_report`: convergence under churn (the paper's Figs.
  11-14), static runs against a scale-out and a scale-in, plain and consistent mode.
- :mod:`~chaosctl.bench.soak`, :mod:`~chaosctl.bench.soak_report`: a training cluster on the
  testbed under Poisson chaos for minutes or hours; resource growth and invariant violations.
- :mod:`~chaosctl.bench.duty_cycle`: the probes' share of a link.
- :mod:`~chaosctl.bench.models`: the paper's models (``data/paper_models.json``, package data)
  and synthetic states of their sizes, shared by the benches.
"""
