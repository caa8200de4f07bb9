"""``chaosctl testbed``: chaosd nodes in network namespaces joined by shaped veth links.

Runs in the ``chaosctl`` process (plain subprocesses, no asyncio) and needs root.

- :mod:`~chaosctl.testbed.cli`: the ``chaosctl testbed ...`` commands.
- :mod:`~chaosctl.testbed.core`: the ``Testbed`` Python API.
- :mod:`~chaosctl.testbed.topo`: the plan as pure functions (topologies, bandwidths, addresses).
- :mod:`~chaosctl.testbed.net`: namespaces, bridge, veth links, routes and tc shaping.
- :mod:`~chaosctl.testbed.procs`: the broker and chaosd inside namespaces.
- :mod:`~chaosctl.testbed.state`: the state file and a teardown that works from it alone.
- :mod:`~chaosctl.testbed.view`, :mod:`~chaosctl.testbed.redraw`: what ``up``/``status`` print,
  and the bandwidth redraw loop (``python -m chaosctl.testbed.redraw``).
- :mod:`~chaosctl.testbed.scenario`: scripted chaos from a TOML file, with invariants.
"""
