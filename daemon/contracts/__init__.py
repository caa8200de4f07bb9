"""The shared contracts: what chaosd, the scheduler, the worker and chaosctl agree on.

Pure types and small helpers, no process of their own, no asyncio, no threads:

- :mod:`~daemon.contracts.errors`: the daemon layer's exception family (``ChaosError``).
- :mod:`~daemon.contracts.config`: the typed, frozen ``chaosd`` configuration.
- :mod:`~daemon.contracts.messages`: versioned MQTT messages and their topics.
- :mod:`~daemon.contracts.kinds`: node states, report kinds, command ops, control ops and event
  kinds, each defined once.
- :mod:`~daemon.contracts.policy`: the sync policy (one type, on the wire and in every process).
- :mod:`~daemon.contracts.control`: the control-socket protocol and its one blocking client.
- :mod:`~daemon.contracts.clock`: the clock seam for time-dependent logic.
"""
