"""``chaosctl bench convergence``: loss and accuracy through scale-out and scale-in (the
paper's Figs. 11-14): the runs (:mod:`.run`), the training worker (:mod:`.worker`) and what
the report makes of its records (:mod:`.report`).
"""
