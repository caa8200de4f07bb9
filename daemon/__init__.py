"""Everything that runs on a box, in subpackages named for the process that runs them.

- :mod:`daemon.contracts` (every process; pure types): messages, config, errors, the kinds
  of states, reports and ops, the sync policy, the control protocol and its client, clocks.
- :mod:`daemon.cluster` (chaosd; pure, driven by the agent): election, failure detection,
  the scheduler's state and its negotiator of the four primitives.
- :mod:`daemon.agent` (chaosd; asyncio): the daemon itself: MQTT bus, membership, control
  socket, probes, worker supervision.
- :mod:`daemon.trainer` (the training worker; threads): the ``Trainer`` library a training
  script imports, publicly as :mod:`chaos_edge`.
- :mod:`daemon.dataplane` (the training worker; threads): authenticated peer links and the
  tree all-reduce.
- :mod:`daemon.replication` (the training worker and the benches; threads): scale-out,
  split into ``planning`` (pure) and ``transfer`` (I/O).

Imports go one way: ``contracts`` < ``cluster`` < ``agent``, and ``contracts`` <
``dataplane`` < ``replication`` < ``trainer``. The agent and the trainer never import each
other; they meet only in :mod:`daemon.contracts`. The import name ``daemon`` clashes with
python-daemon, so users import :mod:`chaos_edge`, and the marker below lets it detect the clash.
"""

CHAOS_EDGE = True
