"""``chaosctl bench soak``: a training cluster on the testbed under Poisson chaos: the chaos
driver and sampler (:mod:`.run`), the training worker (:mod:`.worker`) and the verdict
(:mod:`.report`).
"""
