"""What chaosd runs, in subpackages named for their part, and the contracts every process shares.

- :mod:`daemon.contracts` (every process; pure types): messages, config, errors, the kinds
  of states, reports and ops, the sync policy, the control protocol and its client, clocks.
- :mod:`daemon.cluster` (chaosd; pure, driven by the agent): election, failure detection,
  the scheduler's state and its negotiator of the four primitives.
- :mod:`daemon.agent` (chaosd; asyncio): the daemon itself: MQTT bus, membership, control
  socket, probes, worker supervision.

The library that runs inside the training process (the ``Trainer``, the data plane,
replication) is :mod:`chaos_edge`; it imports :mod:`daemon.contracts` and nothing else of
``daemon``, and nothing here imports it.

Imports go one way: ``contracts`` < ``cluster`` < ``agent``. The agent and the training
library never import each other; they meet only in :mod:`daemon.contracts`. The import name
``daemon`` clashes with python-daemon, so users import :mod:`chaos_edge`, and the marker below
lets it detect the clash.
"""

CHAOS_EDGE = True
