"""``chaosctl bench snapshots``: what durable snapshots cost a member, on the step's path and
on its writer's thread, and what that comes to at the default settings (:mod:`.run`).
"""
