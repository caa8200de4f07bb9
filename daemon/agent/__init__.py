"""The ``chaosd`` agent: the asyncio daemon that runs on every box.

One process, one asyncio event loop (the watchdog and probe servers aside):

- :mod:`~daemon.agent.main`: start-up, main loop and shutdown; ``chaosd`` itself.
- :mod:`~daemon.agent.node`: the node on the bus: heartbeats, election, the scheduler role
  when elected, and the commands it obeys (``connect``, ``disconnect``, ``replicate``, ...).
- :mod:`~daemon.agent.bus`, :mod:`~daemon.agent.broker`: the MQTT client, the embedded broker.
- :mod:`~daemon.agent.control`, :mod:`~daemon.agent.ops`, :mod:`~daemon.agent.views`: the
  control socket, its operations (``join``, ``leave``, ``link``, the worker's ops) and answers.
- :mod:`~daemon.agent.worker`: supervision of the training worker process.
- :mod:`~daemon.agent.probes`, :mod:`~daemon.agent.resources`, :mod:`~daemon.agent.systemd`:
  link probes, local resources, sd_notify.

It never imports :mod:`chaos_edge.trainer`; the worker is another process that speaks the control
protocol of :mod:`daemon.contracts.control`.
"""
