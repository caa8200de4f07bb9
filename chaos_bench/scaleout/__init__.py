"""Scale-out delay of the strategies: ``chaosctl bench scaleout`` on the netns testbed
(the paper's Figs. 7 and 10: :mod:`.run`, its link measurements :mod:`.links`, the
per-namespace processes :mod:`.node`, the ``plain`` baseline :mod:`.plain`, the outputs
:mod:`.report`) and ``chaosctl bench loopback`` on one loopback cluster (:mod:`.loopback`).
"""
