"""``chaosctl bench adaptive``: the policy controller against every fixed policy while the
links change: the runs (:mod:`.run`), the training worker (:mod:`.worker`) and the analysis
(:mod:`.report`).
"""
