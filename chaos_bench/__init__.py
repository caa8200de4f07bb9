"""``chaos_bench``: every benchmark behind ``chaosctl bench ...``, each printing a table and
writing JSON (and markdown and plots where it makes them).

Runs in the ``chaosctl`` process (:mod:`chaosctl.main` adds :data:`chaos_bench.cli.bench_app`);
each bench starts what it measures (chaosd clusters, worker processes, testbed namespaces) as
subprocesses. It may use ``chaosctl``'s client, common, cluster, testbed and demo modules,
``daemon``, ``chaos_edge`` and ``netprobe``; none of them imports it. Results go under
``--out`` (a folder in the current directory by default); those that the project quotes are
kept under ``bench/results/`` in the repository, as data.

- :mod:`~chaos_bench.cli`: the typer commands.
- :mod:`~chaos_bench.control`: failure detection, failover and broker load vs cluster size
  (:mod:`~chaos_bench.control.run`, :mod:`~chaos_bench.control.brokerload`).
- :mod:`~chaos_bench.scaleout`: the paper's Figs. 7 and 10 on the testbed
  (:mod:`~chaos_bench.scaleout.run`, :mod:`~chaos_bench.scaleout.links`,
  :mod:`~chaos_bench.scaleout.node`, :mod:`~chaos_bench.scaleout.plain`,
  :mod:`~chaos_bench.scaleout.report`), and the scale-out strategies on loopback
  (:mod:`~chaos_bench.scaleout.loopback`).
- :mod:`~chaos_bench.planner`: planner quality and speed (:mod:`~chaos_bench.planner.run`).
- :mod:`~chaos_bench.allreduce`: the all-reduce against gloo (:mod:`~chaos_bench.allreduce.run`,
  :mod:`~chaos_bench.allreduce.mesh`, :mod:`~chaos_bench.allreduce.procs`,
  :mod:`~chaos_bench.allreduce.worker`).
- :mod:`~chaos_bench.stall`: the stall each primitive costs a training cluster
  (:mod:`~chaos_bench.stall.run`), and the worker it trains (:mod:`~chaos_bench.stall.worker`;
  the training tests run it too).
- :mod:`~chaos_bench.convergence`: convergence under churn (the paper's Figs. 11-14), static
  runs against a scale-out and a scale-in, plain and consistent mode
  (:mod:`~chaos_bench.convergence.run`, :mod:`~chaos_bench.convergence.worker`,
  :mod:`~chaos_bench.convergence.report`).
- :mod:`~chaos_bench.soak`: a training cluster on the testbed under Poisson chaos for minutes
  or hours; resource growth and invariant violations (:mod:`~chaos_bench.soak.run`,
  :mod:`~chaos_bench.soak.worker`, :mod:`~chaos_bench.soak.report`).
- :mod:`~chaos_bench.slowlinks`: every-step sync against DiLoCo on slow links
  (:mod:`~chaos_bench.slowlinks.run`, :mod:`~chaos_bench.slowlinks.worker`,
  :mod:`~chaos_bench.slowlinks.report`).
- :mod:`~chaos_bench.signing`: what signing costs each control message
  (:mod:`~chaos_bench.signing.run`).
- :mod:`~chaos_bench.probes`: the probes' share of a link (:mod:`~chaos_bench.probes.duty_cycle`).
- :mod:`~chaos_bench.check`: the headline figures rerun quickly and held against the
  committed results (``chaosctl bench check``; :mod:`~chaos_bench.check.run`).
- :mod:`~chaos_bench.sim`: the discrete-event simulation to 10,000 nodes
  (``chaosctl bench simulate``).
- :mod:`~chaos_bench.models`: the paper's models (``data/paper_models.json``, package data)
  and synthetic states of their sizes, shared by the benches.
- :mod:`~chaos_bench.progress`: the progress lines every bench says (``Say``, ``say``).
- :mod:`~chaos_bench.workers`: the worker harness (processes spoken to one JSON line at a
  time: the all-reduce workers, the scale-out nodes).
- :mod:`~chaos_bench.output`: the one output writer (JSON, markdown, PNG; matplotlib is
  optional, the ``bench`` extra).
"""
