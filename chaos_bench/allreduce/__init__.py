"""``chaosctl bench allreduce``: Chaos's all-reduce against torch.distributed's gloo,
on loopback (:mod:`.run`) and on a shaped netns mesh (:mod:`.mesh`); the parent side of
the worker processes (:mod:`.procs`) and the workers (:mod:`.worker`).
"""
