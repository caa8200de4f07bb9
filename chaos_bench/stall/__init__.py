"""``chaosctl bench stall``: the training-loop stall each primitive costs (the paper's Table
I): the cluster run and report (:mod:`.run`) and the training worker (:mod:`.worker`), which
the training tests run too.
"""

MODELS = ("mlp", "cnn", "chartf", "dense-25m")  # what the worker can train (--model)
