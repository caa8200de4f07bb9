"""``chaosctl bench check``: the headline figures rerun quickly and held against the committed
results (:mod:`chaos_bench.check.run`)."""
