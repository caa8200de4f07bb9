"""The pure cluster logic: election, failure detection, the scheduler and its negotiator.

Runs inside ``chaosd`` but does no I/O of its own: the agent (:mod:`daemon.agent`) feeds it
messages and clock readings and carries out what it returns, so every module here is unit
tested without a broker. No asyncio, no threads.

- :mod:`~daemon.cluster.election`: who is scheduler (term, then id; retained claims).
- :mod:`~daemon.cluster.detector`: phi-accrual failure detection.
- :mod:`~daemon.cluster.scheduler`: the scheduler's state: membership, links, policies, events.
- :mod:`~daemon.cluster.primitives`: ``Negotiator``, the scheduler side of the four primitives:
  scale-out ``join`` then ``replicated``; scale-in ``leave`` (graceful) and ``gone`` (failure);
  connect-link and disconnect-link ``link``; every request enters through ``handle``.
- :mod:`~daemon.cluster.role`: what the elected node does with the above (``SchedulerRole``),
  talking to its host only through the ``RoleHost`` protocol.
"""
