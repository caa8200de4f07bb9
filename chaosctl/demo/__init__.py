"""``chaosctl demo``: the one-box showcase, run in the ``chaosctl`` process.

Plain threads and subprocesses, no asyncio: it starts an embedded broker and several local
``chaosd`` processes (:mod:`chaosctl.cluster`), then narrates what they do.

- :mod:`~chaosctl.demo.script`: the narration script both acts write to.
- :mod:`~chaosctl.demo.run`: act one (membership, failure, failover) and the command.
- :mod:`~chaosctl.demo.train`: act two, a real model trained while the cluster changes.
- :mod:`~chaosctl.demo.view`: what the demo prints.
"""
