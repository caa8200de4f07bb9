"""The shared contracts: what chaosd, the scheduler, the worker and chaosctl agree on.

Pure types and small helpers, no process of their own, no asyncio, no threads:

- :mod:`~daemon.contracts.errors`: the daemon layer's exception family (``ChaosError``).
- :mod:`~daemon.contracts.config`: the typed, frozen ``chaosd`` configuration.
- :mod:`~daemon.contracts.messages`: versioned MQTT messages and their topics.
- :mod:`~daemon.contracts.kinds`: node states, report kinds, command ops, control ops and event
  kinds, each defined once.
- :mod:`~daemon.contracts.policy`: the sync policy (one type, on the wire and in every process).
- :mod:`~daemon.contracts.control`: the control-socket protocol and its one blocking client.
- :mod:`~daemon.contracts.protocol`: the typed bodies of requests, commands and reports.
- :mod:`~daemon.contracts.records`: the one checker that reads JSON into typed records.
- :mod:`~daemon.contracts.signing`: the HMAC envelope of control messages.
- :mod:`~daemon.contracts.statepack`: the packed wire form of the ``cluster/state`` snapshot.
- :mod:`~daemon.contracts.ratelog`: one log line per burst of bad input, with its count.
- :mod:`~daemon.contracts.clock`: the clock seam for time-dependent logic.
"""
