"""chaosctl: the command-line client of the local chaosd (see chaosctl(1)).

It talks to the daemon only through its control socket, in the ``chaosctl`` process with
no asyncio (plain threads and subprocesses). Of ``daemon`` it imports only the shared
contracts (:mod:`daemon.contracts`). The benchmarks are a package of their own,
:mod:`chaos_bench`; only :mod:`chaosctl.main` imports it, to add ``chaosctl bench ...``.

- :mod:`chaosctl.entry`: the console script; a Ctrl-C while the CLI imports exits 130 too.
- :mod:`chaosctl.main`: the typer app, global options and the error boundary (exit codes).
- :mod:`chaosctl.client`: the one control client (from the contracts) and chaosctl's errors.
- :mod:`chaosctl.polling`: ``wait_until`` and ``agreed``, for tools and tests alike.
- :mod:`chaosctl.read`: ``status``, ``nodes``, ``links``, ``events`` (``--watch``, ``--follow``).
- :mod:`chaosctl.actions`: ``join``, ``leave``, ``link add|del``, ``probe``.
- :mod:`chaosctl.views`: rich tables and panels.
- :mod:`chaosctl.cluster`: a local broker plus N ``chaosd`` processes, with teardown.
- :mod:`chaosctl.demo`: ``chaosctl demo`` (script, training act, view).
- :mod:`chaosctl.testbed`: ``chaosctl testbed`` and the ``Testbed`` Python API.
"""
