"""``chaosctl bench slowlinks``: every-step sync against DiLoCo on shaped links: the runs
(:mod:`.run`), the training worker (:mod:`.worker`) and the analysis (:mod:`.report`).
"""
