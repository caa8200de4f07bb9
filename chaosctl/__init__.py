"""chaosctl: the command-line client of the local chaosd (see chaosctl(1)).

It talks to the daemon only through its control socket and imports nothing from ``daemon``.

- :mod:`chaosctl.main`: the typer app, global options and the error boundary (exit codes).
- :mod:`chaosctl.client`: the control-socket client and the ``CtlError`` family.
- :mod:`chaosctl.read`: ``status``, ``nodes``, ``links``, ``events`` (``--watch``, ``--follow``).
- :mod:`chaosctl.actions`: ``join``, ``leave``, ``link add|del``, ``probe``.
- :mod:`chaosctl.views`: rich tables and panels.
- :mod:`chaosctl.cluster`: a local broker plus N ``chaosd`` processes, with teardown.
- :mod:`chaosctl.demo.run`, :mod:`chaosctl.demo.view`: ``chaosctl demo``.
- :mod:`chaosctl.bench.cli`, :mod:`chaosctl.bench.control`: ``chaosctl bench``.
- :mod:`chaosctl.testbed.cli`: ``chaosctl testbed``, over :mod:`chaosctl.testbed.core` (the
  ``Testbed`` Python API) and ``testbed_topo``, ``testbed_net``, ``testbed_procs``,
  ``testbed_state``, ``testbed_view``, ``testbed_redraw``.
"""
