"""``chaosctl bench control``: failure detection, failover and broker load against cluster
size (:mod:`.run`), the broker's own ``$SYS`` counters (:mod:`.brokerload`).
"""
